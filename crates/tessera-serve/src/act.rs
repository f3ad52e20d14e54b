//! The endpoints that act (docs/API.md, "Actions"): restore to a directory
//! of the server's machine, check the repository (progress streamed),
//! delete backups. Each is refused with 403 when the server runs with
//! `--read-only`. They call the engine's functions with the options the
//! command line gives them, so the same rules hold: a restore writes only
//! beneath its target, never through a symbolic link it finds there, and
//! reports the entries it could not restore.

use crate::api::{backup_id, blocking, checked_path, hex_path, to_json, ApiError, ApiResult};
use crate::State;
use axum::body::Body;
use axum::extract::rejection::JsonRejection;
use axum::extract::{Query, State as Shared};
use axum::http::{header, StatusCode};
use axum::response::Response;
use axum::routing::post;
use axum::{Json, Router};
use bytes::Bytes;
use serde::Deserialize;
use serde_json::{json, Value};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tessera::backend::LockMode;
use tessera::commands::check::last::{self as last_check, LastCheck};
use tessera::commands::check::{check_with_progress, CheckOptions};
use tessera::restore::{restore_to_path, ExistingFile, RestoreOptions};
use tessera::tree::select::Selection;
use tessera::tree::{restore_tree, Overwrite, TreeRestoreOptions};
use tessera::{Progress, Unit};

/// How long a deletion waits for the requests under way (downloads,
/// checks) to let go of the repository.
const FORGET_WAIT: Duration = Duration::from_secs(30);
/// How long a deletion waits for other processes reading the repository.
const LOCK_WAIT: Duration = Duration::from_secs(2);
/// At most this often a check's progress is sent within a phase.
const PROGRESS_EVERY: Duration = Duration::from_millis(200);

/// The routes that act.
pub fn routes() -> Router<Arc<State>> {
    Router::new()
        .route("/api/restore", post(restore))
        .route("/api/check", post(check))
        .route("/api/forget", post(forget))
}

/// 403 when the server is read-only.
fn writable(state: &State, what: &str) -> ApiResult<()> {
    match state.read_only {
        false => Ok(()),
        true => Err(ApiError::new(
            StatusCode::FORBIDDEN,
            format!("{what} is refused: the server runs with --read-only"),
        )),
    }
}

/// A request's JSON body, or the reason it is not one as a JSON error
/// (`400`, `415` without the JSON content type, `422` not the fields asked for).
fn body<T>(b: Result<Json<T>, JsonRejection>) -> ApiResult<T> {
    b.map(|Json(t)| t)
        .map_err(|e| ApiError::new(e.status(), e.body_text()))
}

/// A backup id in a request body: a number, or a string (`"latest"`).
#[derive(Deserialize)]
#[serde(untagged)]
enum IdText {
    Number(u64),
    Text(String),
}

impl IdText {
    fn text(&self) -> String {
        match self {
            IdText::Number(n) => n.to_string(),
            IdText::Text(t) => t.clone(),
        }
    }
}

/// `overwrite` of a restore: the CLI's `--overwrite` values, and `refuse`
/// (the CLI without `--overwrite`).
#[derive(Deserialize, Default, Clone, Copy)]
#[serde(rename_all = "kebab-case")]
enum OverwriteMode {
    #[default]
    Refuse,
    Always,
    IfChanged,
    Never,
}

impl From<OverwriteMode> for Overwrite {
    fn from(m: OverwriteMode) -> Overwrite {
        match m {
            OverwriteMode::Refuse => Overwrite::Refuse,
            OverwriteMode::Always => Overwrite::Always,
            OverwriteMode::IfChanged => Overwrite::IfChanged,
            OverwriteMode::Never => Overwrite::Never,
        }
    }
}

/// The body of `POST /api/restore`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RestoreRequest {
    backup: IdText,
    /// An absolute path on the server's machine.
    target: String,
    /// Paths in the backup (with what is below them); none, or `/`: all.
    #[serde(default)]
    paths: Vec<String>,
    /// More paths, as their bytes in hex (names that are not UTF-8).
    #[serde(default)]
    paths_hex: Vec<String>,
    #[serde(default)]
    overwrite: OverwriteMode,
    #[serde(default)]
    delete: bool,
    #[serde(default)]
    verify: bool,
}

/// The selection of `paths` (catalog form, `..` refused): everything when
/// none is given or one is the root.
fn selection(paths: &[String], paths_hex: &[String]) -> ApiResult<Selection> {
    let mut exact = Vec::with_capacity(paths.len() + paths_hex.len());
    for p in paths {
        exact.push(checked_path(p)?);
    }
    for h in paths_hex {
        exact.push(hex_path(h)?);
    }
    if exact.iter().any(|c| c.is_empty()) {
        return Ok(Selection::default());
    }
    Ok(Selection::of_byte_paths(&exact))
}

/// `POST /api/restore`: restores a selection of a backup's paths (or all
/// of it) into a directory of the server's machine, as `tessera restore
/// --include PATH… [--overwrite=WHEN] [--delete] [--verify]` does; a
/// stream backup into a file. The answer is the restore's statistics, with
/// the entries that could not be restored and `complete`.
async fn restore(
    Shared(state): Shared<Arc<State>>,
    q: Result<Json<RestoreRequest>, JsonRejection>,
) -> ApiResult<Json<Value>> {
    writable(&state, "restoring")?;
    let q = body(q)?;
    if !Path::new(&q.target).is_absolute() {
        return Err(ApiError::bad(format!(
            "target {:?}: give an absolute path on the server's machine",
            q.target
        )));
    }
    let select = selection(&q.paths, &q.paths_hex)?;
    blocking(&state, move |r| {
        let id = backup_id(r, &q.backup.text())?;
        let target = Path::new(&q.target);
        if r.snapshot(id)?.tree.is_none() {
            return restore_stream(r, id, target, &q);
        }
        let options = TreeRestoreOptions {
            selection: select,
            overwrite: q.overwrite.into(),
            delete: q.delete,
            verify: q.verify,
            restore: RestoreOptions::default(),
        };
        let stats = restore_tree(r, id, target, &options)?;
        let complete = stats.failed.is_empty() && stats.lost_files.is_empty();
        let mut v = to_json(&stats)?;
        v["target"] = q.target.clone().into();
        v["complete"] = complete.into();
        Ok(Json(v))
    })
    .await
}

/// A stream backup restored into the file `target`.
fn restore_stream(
    r: &tessera::Repository,
    id: tessera::format::snapshot::BackupId,
    target: &Path,
    q: &RestoreRequest,
) -> ApiResult<Json<Value>> {
    if !q.paths.is_empty() || !q.paths_hex.is_empty() || q.delete || q.verify {
        return Err(ApiError::bad(format!(
            "backup {id} is a stream backup: paths, delete and verify apply to tree backups only"
        )));
    }
    if r.config().trace {
        return Err(ApiError::bad(format!(
            "backup {id}: a trace repository holds no data to restore"
        )));
    }
    let existing = match q.overwrite {
        OverwriteMode::Refuse => ExistingFile::Refuse,
        OverwriteMode::Always => ExistingFile::Replace,
        _ => {
            return Err(ApiError::bad(
                "overwrite if-changed and never apply to restores into a directory only",
            ))
        }
    };
    let stats = restore_to_path(r, id, target, existing, &RestoreOptions::default())?;
    let mut v = to_json(&stats)?;
    v["target"] = q.target.clone().into();
    v["complete"] = stats.lost.is_empty().into();
    Ok(Json(v))
}

#[derive(Deserialize)]
struct CheckQuery {
    read_data: Option<bool>,
}

/// A check's progress as lines of JSON sent to the answer's body.
struct Lines {
    tx: tokio::sync::mpsc::UnboundedSender<Result<Bytes, std::io::Error>>,
    last: Mutex<Instant>,
}

impl Lines {
    fn send(&self, v: Value) {
        let mut line = v.to_string();
        line.push('\n');
        // A client gone away: the check runs to its end unseen.
        self.tx.send(Ok(Bytes::from(line))).ok();
    }
}

impl Progress for Lines {
    fn begin(&self, name: &str, unit: Unit, total: Option<u64>) {
        self.send(json!({ "event": "phase", "phase": name, "unit": unit.name(), "total": total }));
    }

    fn advance(&self, done: u64) {
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        if last.elapsed() >= PROGRESS_EVERY {
            *last = Instant::now();
            drop(last);
            self.send(json!({ "event": "progress", "done": done }));
        }
    }

    fn end(&self, done: u64) {
        self.send(json!({ "event": "end", "done": done }));
    }
}

/// `POST /api/check?read_data=true`: checks the repository as `tessera
/// check [--read-data] --json` does; the answer streams newline-delimited
/// JSON: each phase, its progress and end, then the report
/// (`{"event":"report","ok":…,"report":{…}}`) or `{"event":"error",…}`.
async fn check(
    Shared(state): Shared<Arc<State>>,
    Query(q): Query<CheckQuery>,
) -> ApiResult<Response> {
    writable(&state, "checking")?;
    let options = CheckOptions {
        read_data: q.read_data.unwrap_or(false),
        ..CheckOptions::default()
    };
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let repo = state.repo.clone().read_owned().await;
    let keep = state.last_check_dir.clone();
    tokio::task::spawn_blocking(move || {
        let lines = Lines {
            tx,
            last: Mutex::new(Instant::now()),
        };
        let last = check_with_progress(&repo, options, &lines)
            .map_err(|e| e.to_string())
            .and_then(|report| {
                let v = serde_json::to_value(&report).map_err(|e| e.to_string())?;
                let mut end = json!({ "event": "report", "ok": report.is_ok(), "report": v });
                if let Some(root) = keep {
                    // Kept for the health view, also after a restart.
                    let record = LastCheck::new(&repo, options.read_data, "serve", report);
                    end["kept"] = match last_check::save(&root, &record) {
                        Ok(path) => json!(path.display().to_string()),
                        Err(e) => json!({ "error": e.to_string() }),
                    };
                }
                Ok(end)
            })
            .unwrap_or_else(|e| json!({ "event": "error", "error": e }));
        lines.send(last);
    });
    let stream = futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx));
    Response::builder()
        .header(header::CONTENT_TYPE, "application/x-ndjson")
        .body(Body::from_stream(stream))
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))
}

/// The body of `POST /api/forget`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ForgetRequest {
    ids: Vec<u64>,
    #[serde(default)]
    dry_run: bool,
}

/// `POST /api/forget`: deletes backups `ids` (`tessera delete` of each):
/// the lifecycle layout frees their space at once, the container layout
/// when `gc` runs. With `dry_run`, says what would go and what it would
/// free, changing nothing. The server waits for the requests under way to
/// finish and takes the repository exclusively for the deletion (409 when
/// another process reads it), then reads again.
async fn forget(
    Shared(state): Shared<Arc<State>>,
    q: Result<Json<ForgetRequest>, JsonRejection>,
) -> ApiResult<Json<Value>> {
    writable(&state, "deleting backups")?;
    let q = body(q)?;
    if q.ids.is_empty() {
        return Err(ApiError::bad("ids: name at least one backup"));
    }
    let ids = q.ids.clone();
    let freed = blocking(&state, move |r| {
        for &id in &ids {
            r.snapshot(id)?;
        }
        Ok(tessera::layout::freed_by_deleting(r, &ids)?)
    })
    .await?;
    if q.dry_run {
        return Ok(Json(json!({
            "dry_run": true, "deleted": [], "would_delete": q.ids, "bytes_freed": freed,
        })));
    }
    let guard = tokio::time::timeout(FORGET_WAIT, state.repo.clone().write_owned())
        .await
        .map_err(|_| {
            ApiError::new(
                StatusCode::CONFLICT,
                "the repository is busy with other requests (downloads, a check): try again when they are done",
            )
        })?;
    let ids = q.ids;
    tokio::task::spawn_blocking(move || {
        let mut repo = guard;
        repo.relock(LockMode::Exclusive, LOCK_WAIT)
            .map_err(|e| match e {
                tessera::Error::Locked(_) => ApiError::new(
                    StatusCode::CONFLICT,
                    format!("{e}: another process uses the repository; deleting needs it alone"),
                ),
                e => e.into(),
            })?;
        let deleted = tessera::commands::delete::delete_backups(&repo, &ids);
        let back = repo.relock(LockMode::Read, LOCK_WAIT);
        let deleted = deleted?;
        back?;
        let mut v = to_json(&deleted)?;
        v["dry_run"] = false.into();
        if deleted.bytes_freed.is_none() {
            v["note"] = "container layout: `tessera gc` frees what no kept backup uses".into();
        }
        Ok(Json(v))
    })
    .await
    .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?
}
