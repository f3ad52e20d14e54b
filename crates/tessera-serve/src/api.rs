//! The JSON API (docs/API.md): thin handlers over the engine's read-only
//! operations. Each runs the engine on tokio's blocking pool; lists are
//! paged (`offset`, `limit`), file bytes are streamed as the engine
//! verifies them.

use crate::State;
use axum::body::Body;
use axum::extract::{Path, Query, State as Shared};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::io::Write;
use std::sync::Arc;
use tessera::format::snapshot::{BackupId, Snapshot};
use tessera::restore::{restore, RestoreOptions};
use tessera::tree::catalog::Kind;
use tessera::tree::dump::normalize_path;
use tessera::tree::{
    diff, dump, list_tree, shown_path, write_zip, ChangeRecord, EntryRecord, TarScope,
};
use tessera::Repository;

/// Items a page holds unless `limit` says otherwise.
pub const DEFAULT_LIMIT: u64 = 200;
/// The most items one page holds.
pub const MAX_LIMIT: u64 = 5000;
/// Bytes a file's stream sends at once.
const STREAM_PIECE: usize = 256 * 1024;

/// The API's routes.
pub fn routes() -> Router<Arc<State>> {
    Router::new()
        .route("/api/backups", get(backups))
        .route("/api/backups/{id}", get(backup))
        .route("/api/backups/{id}/tree", get(tree))
        .route("/api/backups/{id}/file", get(file))
        .route("/api/stats", get(stats))
        .route("/api/space", get(space))
        .route("/api/diff", get(diff_view))
        .route("/api/health", get(health))
}

/// An error answer: a status and `{"error": message}`.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    message: String,
}

impl ApiError {
    pub(crate) fn new(status: StatusCode, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            message: message.into(),
        }
    }

    pub(crate) fn bad(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, message)
    }
}

impl From<tessera::Error> for ApiError {
    fn from(e: tessera::Error) -> ApiError {
        use tessera::Error as E;
        let status = match &e {
            E::NoSuchBackup(_) | E::NotInBackup { .. } | E::NotFound(_) | E::NoMatch { .. } => {
                StatusCode::NOT_FOUND
            }
            E::NotATree(_) | E::InvalidOption(_) => StatusCode::BAD_REQUEST,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        ApiError::new(status, e.to_string())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, Json(json!({ "error": self.message }))).into_response()
    }
}

pub(crate) type ApiResult<T> = Result<T, ApiError>;

/// Runs `f` with the repository (under a read guard) on the blocking pool.
pub(crate) async fn blocking<T: Send + 'static>(
    state: &Arc<State>,
    f: impl FnOnce(&Repository) -> ApiResult<T> + Send + 'static,
) -> ApiResult<T> {
    let repo = state.repo.clone().read_owned().await;
    tokio::task::spawn_blocking(move || f(&repo))
        .await
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?
}

/// A backup id as given in a URL (a number, or `latest` for the newest).
pub(crate) fn backup_id(repo: &Repository, text: &str) -> ApiResult<BackupId> {
    if text == "latest" {
        return repo
            .backups()?
            .last()
            .copied()
            .ok_or_else(|| ApiError::new(StatusCode::NOT_FOUND, "the repository holds no backup"));
    }
    text.parse().map_err(|_| {
        ApiError::new(
            StatusCode::NOT_FOUND,
            format!("backup {text:?}: no such backup (an id is a number or `latest`)"),
        )
    })
}

/// A path in a backup as the API takes it (`/home/ann`), in catalog form;
/// a `..` component (outside the backup) or a NUL byte is refused.
pub fn checked_path(path: &str) -> ApiResult<Vec<u8>> {
    checked_bytes(path.as_bytes())
}

/// [`checked_path`] of a path's bytes (any but NUL: names need not be UTF-8).
pub fn checked_bytes(path: &[u8]) -> ApiResult<Vec<u8>> {
    let shown = String::from_utf8_lossy(path);
    if path.split(|&b| b == b'/').any(|c| c == b"..") {
        return Err(ApiError::bad(format!(
            "{shown:?}: a path with `..` would leave the backup: give an absolute path inside it"
        )));
    }
    if path.contains(&0) {
        return Err(ApiError::bad(format!("{shown:?}: a path has no NUL byte")));
    }
    Ok(normalize_path(path).to_vec())
}

/// The path a request names: `path` (text), or `path_hex` (its bytes in
/// hex, for names that are not UTF-8, as listings give them); not both.
pub fn path_param(path: Option<&str>, path_hex: Option<&str>) -> ApiResult<Option<Vec<u8>>> {
    match (path, path_hex) {
        (Some(_), Some(_)) => Err(ApiError::bad("give `path` or `path_hex`, not both")),
        (Some(p), None) => checked_path(p).map(Some),
        (None, Some(h)) => hex_path(h).map(Some),
        (None, None) => Ok(None),
    }
}

/// A path given in hex (`path_hex`), checked as [`checked_path`].
pub fn hex_path(h: &str) -> ApiResult<Vec<u8>> {
    let bytes =
        hex::decode(h).map_err(|e| ApiError::bad(format!("path_hex {h:?}: not hex: {e}")))?;
    checked_bytes(&bytes)
}

/// `offset` and `limit` of a paged list.
#[derive(Deserialize, Default)]
pub struct Paging {
    offset: Option<u64>,
    limit: Option<u64>,
}

/// One page of a list counted in full: its items and the total.
struct Window<T> {
    offset: u64,
    limit: u64,
    total: u64,
    items: Vec<T>,
}

impl<T> Window<T> {
    fn new(p: &Paging) -> ApiResult<Window<T>> {
        let limit = p.limit.unwrap_or(DEFAULT_LIMIT);
        if limit > MAX_LIMIT {
            return Err(ApiError::bad(format!(
                "limit {limit}: at most {MAX_LIMIT} items per page"
            )));
        }
        Ok(Window {
            offset: p.offset.unwrap_or(0),
            limit,
            total: 0,
            items: Vec::new(),
        })
    }

    /// Counts one more item, made and kept if it falls in the page.
    fn push(&mut self, make: impl FnOnce() -> T) {
        if self.total >= self.offset && self.total - self.offset < self.limit {
            self.items.push(make());
        }
        self.total += 1;
    }
}

impl<T: Serialize> Window<T> {
    fn json(self) -> ApiResult<Value> {
        Ok(json!({
            "offset": self.offset, "limit": self.limit, "total": self.total,
            "items": to_json(&self.items)?,
        }))
    }
}

/// `v` as JSON (500 if it cannot be: never, for the engine's records).
pub(crate) fn to_json(v: &impl Serialize) -> ApiResult<Value> {
    serde_json::to_value(v)
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))
}

/// A backup as listed: the `list --json` record, with its new data and
/// dedup ratio.
pub fn backup_record(s: &Snapshot) -> Value {
    let mut v = json!({
        "id": s.id, "time": s.time, "label": s.label, "source": s.source,
        "host": s.host, "tags": s.tags, "logical_bytes": s.logical_bytes,
        "stored_bytes": s.stats.stored_bytes, "new_bytes": s.stats.unique.bytes,
        "chunks": s.stats.chunks, "dedup_ratio": s.stats.dedup_ratio,
    });
    if let Some(t) = &s.tree {
        v["paths"] = json!(t.paths);
        v["files"] = t.files.into();
        v["entries"] = t.entries.into();
        v["file_bytes"] = t.catalog_offset.into();
    }
    v
}

#[derive(Deserialize)]
struct BackupsQuery {
    // Not `#[serde(flatten)]`ed: flattened numbers fail to parse from a query.
    offset: Option<u64>,
    limit: Option<u64>,
    /// `desc`: newest first.
    order: Option<String>,
}

/// `GET /api/backups`: the backups by id (committed ones, and those known
/// committed whose snapshot is lost, as `damaged`), one page of them.
async fn backups(
    Shared(state): Shared<Arc<State>>,
    Query(q): Query<BackupsQuery>,
) -> ApiResult<Json<Value>> {
    let mut window = Window::new(&Paging {
        offset: q.offset,
        limit: q.limit,
    })?;
    let desc = match q.order.as_deref() {
        None | Some("asc") => false,
        Some("desc") => true,
        Some(o) => return Err(ApiError::bad(format!("order {o:?}: `asc` or `desc`"))),
    };
    blocking(&state, move |r| {
        let mut ids: std::collections::BTreeSet<BackupId> = r.backups()?.into_iter().collect();
        ids.extend(r.commit_marks()?);
        let mut ids: Vec<BackupId> = ids.into_iter().collect();
        if desc {
            ids.reverse();
        }
        for id in ids {
            window.push(|| id);
        }
        let items = std::mem::take(&mut window.items);
        let mut page = Window {
            offset: window.offset,
            limit: window.limit,
            total: window.total,
            items: Vec::with_capacity(items.len()),
        };
        for id in items {
            page.items.push(match r.snapshot(id) {
                Ok(s) => backup_record(&s),
                Err(e) => json!({ "id": id, "damaged": e.to_string() }),
            });
        }
        Ok(Json(page.json()?))
    })
    .await
}

/// `GET /api/backups/{id}`: the backup's snapshot (as `stats ID --json`).
async fn backup(
    Shared(state): Shared<Arc<State>>,
    Path(id): Path<String>,
) -> ApiResult<Json<Value>> {
    blocking(&state, move |r| {
        let snap = r.snapshot(backup_id(r, &id)?)?;
        to_json(&snap).map(Json)
    })
    .await
}

#[derive(Deserialize)]
struct PathQuery {
    path: Option<String>,
    path_hex: Option<String>,
    // Not `#[serde(flatten)]`ed: flattened numbers fail to parse from a query.
    offset: Option<u64>,
    limit: Option<u64>,
}

/// `GET /api/backups/{id}/tree?path=DIR`: a directory's entries (without
/// `path`: the paths given to the backup), one page of them.
async fn tree(
    Shared(state): Shared<Arc<State>>,
    Path(id): Path<String>,
    Query(q): Query<PathQuery>,
) -> ApiResult<Json<Value>> {
    let wanted = path_param(q.path.as_deref(), q.path_hex.as_deref())?;
    let mut window = Window::new(&Paging {
        offset: q.offset,
        limit: q.limit,
    })?;
    blocking(&state, move |r| {
        let id = backup_id(r, &id)?;
        list_tree(r, id, wanted.as_deref(), false, |e| {
            window.push(|| {
                // Every entry's bytes, to name it back whatever they are.
                let mut record = EntryRecord::of(e);
                record.path_hex.get_or_insert_with(|| hex::encode(&e.path));
                record
            });
            Ok(())
        })?;
        let mut v = window.json()?;
        v["backup"] = id.into();
        let at = wanted.as_deref().unwrap_or_default();
        v["path"] = shown_path(at).into();
        v["path_hex"] = hex::encode(at).into();
        Ok(Json(v))
    })
    .await
}

/// What a path of a backup names, for a download.
struct Target {
    /// A directory (sent as tar).
    dir: bool,
    /// A regular file's size (for `Content-Length`).
    size: Option<u64>,
    /// A backup of a single stream (sent whole).
    stream: bool,
}

/// What `path` (catalog form) is in backup `id`: listing it gives the
/// entry itself unless it is a directory.
fn target(r: &Repository, id: BackupId, path: &[u8]) -> ApiResult<Target> {
    let mut first: Option<(Kind, u64, Vec<u8>)> = None;
    list_tree(r, id, Some(path), false, |e| {
        if first.is_none() && e.path == path && e.kind != Kind::Dir {
            first = Some((e.kind, e.size, e.target.clone()));
        }
        Ok(())
    })?;
    let shown = format!("/{}", String::from_utf8_lossy(path));
    match first {
        None => Ok(Target {
            dir: true,
            size: None,
            stream: false,
        }),
        Some((Kind::File, size, _)) => Ok(Target {
            dir: false,
            size: Some(size),
            stream: false,
        }),
        Some((Kind::Hardlink, _, _)) => Ok(Target {
            dir: false,
            size: None,
            stream: false,
        }),
        Some((Kind::Symlink, _, to)) => Err(ApiError::bad(format!(
            "{shown}: a symbolic link to {}: download its target",
            String::from_utf8_lossy(&to)
        ))),
        Some((kind, _, _)) => Err(ApiError::bad(format!(
            "{shown}: a {} has no bytes to download",
            kind.name()
        ))),
    }
}

/// A `Write` that sends what it is given to an HTTP body, in pieces.
struct ToBody {
    tx: tokio::sync::mpsc::Sender<Result<Bytes, std::io::Error>>,
    buf: Vec<u8>,
}

impl ToBody {
    fn send(&mut self) -> std::io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let piece = Bytes::from(std::mem::replace(
            &mut self.buf,
            Vec::with_capacity(STREAM_PIECE),
        ));
        self.tx.blocking_send(Ok(piece)).map_err(|_| {
            std::io::Error::new(std::io::ErrorKind::BrokenPipe, "the client went away")
        })
    }
}

impl Write for ToBody {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        self.buf.extend_from_slice(data);
        if self.buf.len() >= STREAM_PIECE {
            self.send()?;
        }
        Ok(data.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.send()
    }
}

/// A file name for `Content-Disposition`: the path's last component, in
/// the characters every browser takes, then `ext` (`.tar`, `.zip` or none).
fn download_name(path: &[u8], ext: &str) -> String {
    let last = path.rsplit(|&b| b == b'/').next().unwrap_or_default();
    let mut name: String = String::from_utf8_lossy(last)
        .chars()
        .map(|c| match c.is_ascii_alphanumeric() || "._-".contains(c) {
            true => c,
            false => '_',
        })
        .collect();
    if name.is_empty() || name.starts_with('.') {
        name.insert_str(0, "backup");
    }
    name.push_str(ext);
    name
}

#[derive(Deserialize)]
struct FileQuery {
    path: Option<String>,
    path_hex: Option<String>,
    /// A directory's archive: `tar` (the default) or `zip`.
    format: Option<String>,
}

/// `GET /api/backups/{id}/file?path=FILE`: the file's bytes, streamed as
/// every chunk is read and verified (a directory: a tar stream of it, or
/// with `format=zip` a zip archive). A failure midway aborts the stream
/// (the download is incomplete, never wrong).
async fn file(
    Shared(state): Shared<Arc<State>>,
    Path(id): Path<String>,
    Query(q): Query<FileQuery>,
) -> ApiResult<Response> {
    let wanted = path_param(q.path.as_deref(), q.path_hex.as_deref())?.unwrap_or_default();
    let zip = match q.format.as_deref() {
        None | Some("tar") => false,
        Some("zip") => true,
        Some(f) => return Err(ApiError::bad(format!("format {f:?}: `tar` or `zip`"))),
    };
    let (id, target) = {
        let wanted = wanted.clone();
        blocking(&state, move |r| {
            let id = backup_id(r, &id)?;
            if wanted.is_empty() {
                let snap = r.snapshot(id)?;
                let stream = snap.tree.is_none();
                return Ok((
                    id,
                    Target {
                        dir: !stream,
                        size: stream.then_some(snap.logical_bytes),
                        stream,
                    },
                ));
            }
            Ok((id, target(r, id, &wanted)?))
        })
        .await?
    };
    if zip && !target.dir {
        return Err(ApiError::bad(
            "format=zip applies to a directory (or a whole tree backup): a file comes as its bytes",
        ));
    }
    let (tx, mut rx) = tokio::sync::mpsc::channel(4);
    let repo = state.repo.clone().read_owned().await;
    let name = match target.stream {
        true => format!("backup-{id}"),
        false => download_name(
            &wanted,
            match (target.dir, zip) {
                (false, _) => "",
                (true, false) => ".tar",
                (true, true) => ".zip",
            },
        ),
    };
    let (dir, size) = (target.dir, target.size);
    tokio::task::spawn_blocking(move || {
        let mut out = ToBody {
            tx: tx.clone(),
            buf: Vec::with_capacity(STREAM_PIECE),
        };
        let options = RestoreOptions::default();
        let scope = TarScope {
            under: (!wanted.is_empty()).then(|| wanted.clone()),
            ..TarScope::default()
        };
        let result = match (target.stream, zip) {
            (true, _) => restore(&repo, id, &mut out, &options).map(drop),
            (false, true) => write_zip(&repo, id, &scope, &mut out, &options).map(drop),
            (false, false) => dump(&repo, id, &wanted, &mut out, &options).map(drop),
        }
        .map_err(|e| e.to_string())
        .and_then(|()| out.flush().map_err(|e| e.to_string()));
        if let Err(e) = result {
            // The client sees the body end in an error: an aborted download.
            tx.blocking_send(Err(std::io::Error::other(e))).ok();
        }
    });
    let stream = futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx));
    let mut response = Response::builder()
        .header(
            header::CONTENT_TYPE,
            match (dir, zip) {
                (true, false) => "application/x-tar",
                (true, true) => "application/zip",
                (false, _) => "application/octet-stream",
            },
        )
        .header(
            header::CONTENT_DISPOSITION,
            format!("attachment; filename=\"{name}\""),
        );
    if let Some(size) = size {
        response = response.header(header::CONTENT_LENGTH, size);
    }
    response
        .body(Body::from_stream(stream))
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))
}

/// `GET /api/stats`: the repository's totals (as `stats --json`).
async fn stats(Shared(state): Shared<Arc<State>>) -> ApiResult<Json<Value>> {
    let read_only = state.read_only;
    blocking(&state, move |r| {
        let t = tessera::commands::stats::totals(r)?;
        let mut v = serde_json::to_value(&t)
            .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
        v["config"] = serde_json::to_value(r.config())
            .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
        v["encrypted"] = r.is_encrypted().into();
        v["location"] = r.backend().location().to_string().into();
        v["read_only"] = read_only.into();
        Ok(Json(v))
    })
    .await
}

#[derive(Deserialize)]
struct SpaceQuery {
    ids: Option<String>,
    source: Option<String>,
}

/// `GET /api/space?ids=1,2&source=S`: what deleting backups would free
/// (lifecycle layout), and a source's space per version.
async fn space(
    Shared(state): Shared<Arc<State>>,
    Query(q): Query<SpaceQuery>,
) -> ApiResult<Json<Value>> {
    let ids = q
        .ids
        .as_deref()
        .unwrap_or_default()
        .split(',')
        .filter(|t| !t.is_empty())
        .map(|t| {
            t.trim()
                .parse::<BackupId>()
                .map_err(|_| ApiError::bad(format!("ids: {t:?} is not a backup id")))
        })
        .collect::<ApiResult<Vec<_>>>()?;
    blocking(&state, move |r| {
        let Some(freed) = tessera::layout::freed_by_deleting(r, &ids)? else {
            return Err(ApiError::new(
                StatusCode::NOT_IMPLEMENTED,
                "what deleting backups frees is known exactly only in the lifecycle layout; in the container layout it depends on which chunks gc finds unreferenced afterwards, and no estimate is made yet (`tessera forget --dry-run` lists what would go, not its size)",
            ));
        };
        let trend = match &q.source {
            Some(source) => serde_json::to_value(tessera::layout::lifecycle::trend(r, source)?)
                .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?,
            None => Value::Null,
        };
        Ok(Json(json!({ "ids": ids, "freed_bytes": freed, "trend": trend })))
    })
    .await
}

/// The last check's record as the health view shows it: when, how, its
/// counts and its report; `null` when none is kept (`{"error"}` when the
/// record cannot be read).
fn last_check_json(root: Option<&std::path::Path>, r: &Repository) -> Value {
    use tessera::commands::check::ProblemKind;
    let Some(root) = root else {
        return Value::Null;
    };
    match tessera::commands::check::last::load(root, &r.config().id) {
        Ok(None) => Value::Null,
        Err(e) => json!({ "error": e.to_string() }),
        Ok(Some(c)) => {
            let problems = &c.report.problems;
            let count = |k: ProblemKind| problems.iter().filter(|p| p.kind == k).count();
            let mut affected: Vec<BackupId> = problems
                .iter()
                .flat_map(|p| p.affected_backups.iter().copied())
                .collect();
            affected.sort_unstable();
            affected.dedup();
            json!({
                "time": c.time, "by": c.by, "read_data": c.read_data, "location": c.location,
                "ok": c.report.is_ok(), "problems": problems.len(),
                "damaged": problems.len() - count(ProblemKind::Derived),
                "derived": count(ProblemKind::Derived),
                "affected_backups": affected, "report": c.report,
            })
        }
    }
}

/// `GET /api/health`: the last check's result (kept between runs) and the
/// quarantined chunks (those a check or a repair found damaged: no new
/// backup uses them), per container or lineage.
async fn health(Shared(state): Shared<Arc<State>>) -> ApiResult<Json<Value>> {
    use tessera::repo::quarantine::{self, Quarantined};
    let count = |q: &Quarantined| match q {
        Quarantined::All => json!("all"),
        Quarantined::Chunks(c) => json!(c.len()),
    };
    let root = state.last_check_dir.clone();
    blocking(&state, move |r| {
        let last_check = last_check_json(root.as_deref(), r);
        let backend = r.backend();
        let mut items = Vec::new();
        let containers = quarantine::load(backend.as_ref())?;
        let mut ids: Vec<_> = containers.keys().copied().collect();
        ids.sort_unstable();
        for c in ids {
            let q = &containers[&c];
            let object = tessera::layout::container::key(c);
            items.push(json!({ "object": object, "chunks": count(q) }));
        }
        for name in backend.list(quarantine::QUARANTINE_DIR)? {
            if tessera::layout::container::parse_key_name(&name).is_some() {
                continue;
            }
            if let Some(q) = quarantine::load_lineage(backend.as_ref(), &name)? {
                items.push(json!({ "lineage": name, "chunks": count(&q) }));
            }
        }
        Ok(Json(
            json!({ "last_check": last_check, "kept": root.is_some(), "quarantine": items }),
        ))
    })
    .await
}

#[derive(Deserialize)]
struct DiffQuery {
    from: String,
    to: String,
    // Not `#[serde(flatten)]`ed: flattened numbers fail to parse from a query.
    offset: Option<u64>,
    limit: Option<u64>,
}

/// `GET /api/diff?from=A&to=B`: the entries that differ (one page of
/// them) and the counts (as `diff --json`).
async fn diff_view(
    Shared(state): Shared<Arc<State>>,
    Query(q): Query<DiffQuery>,
) -> ApiResult<Json<Value>> {
    let mut window = Window::new(&Paging {
        offset: q.offset,
        limit: q.limit,
    })?;
    blocking(&state, move |r| {
        let (from, to) = (backup_id(r, &q.from)?, backup_id(r, &q.to)?);
        let stats = diff(r, from, to, |c| {
            window.push(|| ChangeRecord::of(c));
            Ok(())
        })?;
        let mut v = window.json()?;
        v["from"] = from.into();
        v["to"] = to.into();
        v["stats"] = serde_json::to_value(&stats)
            .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
        Ok(Json(v))
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_leaving_the_backup_are_refused() {
        for bad in ["..", "/..", "/a/../b", "/a/..", "../etc/passwd", "a\0b"] {
            let e = checked_path(bad).unwrap_err();
            assert_eq!(e.status, StatusCode::BAD_REQUEST, "{bad:?}");
        }
        assert_eq!(checked_path("/home/ann/").unwrap(), b"home/ann");
        assert_eq!(checked_path("/a..b/c").unwrap(), b"a..b/c");
        assert_eq!(checked_path("/").unwrap(), b"");
    }

    #[test]
    fn windows_keep_their_page_and_count_all() {
        let mut w = Window::new(&Paging {
            offset: Some(3),
            limit: Some(2),
        })
        .unwrap();
        for i in 0..10 {
            w.push(|| i);
        }
        assert_eq!((w.total, w.items), (10, vec![3, 4]));
        assert!(Window::<u8>::new(&Paging {
            offset: None,
            limit: Some(MAX_LIMIT + 1)
        })
        .is_err());
    }

    #[test]
    fn download_names_are_plain() {
        assert_eq!(download_name(b"home/ann/a b.txt", ""), "a_b.txt");
        assert_eq!(download_name(b"home/ann", ".tar"), "ann.tar");
        assert_eq!(download_name(b"home/ann", ".zip"), "ann.zip");
        assert_eq!(download_name(b"", ".tar"), "backup.tar");
        assert_eq!(download_name(b"x/.bashrc", ""), "backup.bashrc");
    }
}
