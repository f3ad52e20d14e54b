//! The lab's experiment reports (docs/API.md, "Reports"): the files
//! `tessera experiment … --out OUT` writes (`report.html` with its SVG
//! plots, `results.csv`, `results.json`), found in the directory given
//! with `tessera serve --reports DIR`, or beside a lab repository
//! (`OUT/repos/<system>`: its reports are in `OUT`). Only plain files at
//! the top of that directory, of the kinds listed in [`KINDS`], are listed
//! and served; a name is looked up in the listing, never joined blindly.

use crate::api::{ApiError, ApiResult};
use crate::State;
use axum::extract::{Path, State as Shared};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde_json::{json, Value};
use std::path::{Path as FsPath, PathBuf};
use std::sync::Arc;

/// The file kinds served, by extension, with their content type.
pub const KINDS: &[(&str, &str)] = &[
    ("html", "text/html; charset=utf-8"),
    ("svg", "image/svg+xml"),
    ("csv", "text/csv; charset=utf-8"),
    ("json", "application/json"),
    ("md", "text/markdown; charset=utf-8"),
    ("txt", "text/plain; charset=utf-8"),
];
/// The largest report file served.
const MAX_BYTES: u64 = 64 << 20;
/// A served report runs no script, loads nothing and cannot be framed: the
/// lab's report is self-contained (inline SVG and style).
const REPORT_CSP: &str = "default-src 'none'; style-src 'unsafe-inline'; img-src data:; frame-ancestors 'none'; base-uri 'none'; form-action 'none'; sandbox";

/// The routes of the reports.
pub fn routes() -> Router<Arc<State>> {
    Router::new()
        .route("/api/reports", get(list))
        .route("/api/reports/{name}", get(file))
}

/// The directory of the reports of the repository at `repo` (a local
/// directory) when it is a lab repository: `OUT/repos/<system>` with
/// `OUT/results.json`.
pub fn beside_lab_repository(repo: &FsPath) -> Option<PathBuf> {
    let repos = repo.parent()?;
    let out = repos.parent()?;
    (repos.file_name()? == "repos" && out.join("results.json").is_file()).then(|| out.into())
}

/// The content type of a report file named `name`, if it is one.
fn kind(name: &str) -> Option<&'static str> {
    let (_, ext) = name.rsplit_once('.')?;
    KINDS.iter().find(|(e, _)| *e == ext).map(|(_, t)| *t)
}

/// The report files of `dir`: plain files (not links) of the kinds
/// served, by name, each with its size and modification time.
fn listing(dir: &FsPath) -> std::io::Result<Vec<(String, u64, u64)>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let Ok(name) = entry.file_name().into_string() else {
            continue;
        };
        let meta = std::fs::symlink_metadata(entry.path())?;
        if !meta.is_file() || kind(&name).is_none() || name.starts_with('.') {
            continue;
        }
        let mtime = meta
            .modified()
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_secs());
        out.push((name, meta.len(), mtime));
    }
    out.sort();
    Ok(out)
}

fn unavailable() -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "no experiment reports: this repository is not a lab repository (OUT/repos/<system> of `tessera experiment --out OUT`); give their directory with `tessera serve --reports DIR`",
    )
}

fn io_error(dir: &FsPath, e: std::io::Error) -> ApiError {
    ApiError::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        format!("{}: {e}", dir.display()),
    )
}

/// `GET /api/reports`: the report files, `{"dir", "reports": [{"name",
/// "bytes", "mtime", "type"}]}`; `404` when the server has none.
async fn list(Shared(state): Shared<Arc<State>>) -> ApiResult<Json<Value>> {
    let dir = state.reports.clone().ok_or_else(unavailable)?;
    tokio::task::spawn_blocking(move || {
        let files = listing(&dir).map_err(|e| io_error(&dir, e))?;
        let reports: Vec<Value> = files
            .into_iter()
            .map(|(name, bytes, mtime)| {
                let t = kind(&name).unwrap_or_default();
                json!({ "name": name, "bytes": bytes, "mtime": mtime, "type": t })
            })
            .collect();
        Ok(Json(
            json!({ "dir": dir.display().to_string(), "reports": reports }),
        ))
    })
    .await
    .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?
}

/// `GET /api/reports/{name}`: a report file's bytes, with its type; an
/// HTML report under a policy that lets it run nothing.
async fn file(Shared(state): Shared<Arc<State>>, Path(name): Path<String>) -> ApiResult<Response> {
    let dir = state.reports.clone().ok_or_else(unavailable)?;
    tokio::task::spawn_blocking(move || {
        let files = listing(&dir).map_err(|e| io_error(&dir, e))?;
        let Some((_, bytes, _)) = files.iter().find(|(n, _, _)| *n == name) else {
            return Err(ApiError::new(
                StatusCode::NOT_FOUND,
                format!("{name:?}: no such report (GET /api/reports lists them)"),
            ));
        };
        if *bytes > MAX_BYTES {
            return Err(ApiError::bad(format!(
                "{name}: {bytes} bytes, more than the {MAX_BYTES} served"
            )));
        }
        let body = std::fs::read(dir.join(&name)).map_err(|e| io_error(&dir, e))?;
        let t = kind(&name).unwrap_or("application/octet-stream");
        let mut response = ([(header::CONTENT_TYPE, t)], body).into_response();
        response.headers_mut().insert(
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static(REPORT_CSP),
        );
        Ok(response)
    })
    .await
    .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_report_files_are_listed() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        for name in [
            "report.html",
            "results.csv",
            "results.json",
            "x.bin",
            ".hidden.csv",
        ] {
            std::fs::write(d.join(name), name).unwrap();
        }
        std::fs::create_dir(d.join("repos")).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", d.join("passwd.txt")).unwrap();
        let names: Vec<String> = listing(d).unwrap().into_iter().map(|f| f.0).collect();
        assert_eq!(names, ["report.html", "results.csv", "results.json"]);
        let repo = d.join("repos/exact");
        std::fs::create_dir(&repo).unwrap();
        assert_eq!(beside_lab_repository(&repo).as_deref(), Some(d));
        assert_eq!(beside_lab_repository(d), None);
    }
}
