//! The endpoints that act (restore, check, forget), without a browser:
//! the token and write access are required, a restore is as safe as the
//! command line's (crates/tessera-cli/tests/restore_safety.rs), a check
//! streams its progress and ends with its report, a deletion says what it
//! frees first.

mod common;

use common::{noise, served, served_writable, Served};
use reqwest::StatusCode;
use serde_json::{json, Value};
use std::fs;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use tessera::repo::config::Layout;

struct Client {
    http: reqwest::Client,
    s: Served,
}

impl Client {
    fn writable(layout: Layout) -> Client {
        Client {
            http: reqwest::Client::new(),
            s: served_writable(layout),
        }
    }

    /// POST `body` to `path` with the token; the status and JSON answer.
    async fn post(&self, path: &str, body: Value) -> (StatusCode, Value) {
        let r = self
            .http
            .post(format!("{}{path}", self.s.base))
            .bearer_auth(&self.s.token)
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
            .await
            .unwrap();
        let status = r.status();
        (
            status,
            serde_json::from_slice(&r.bytes().await.unwrap()).unwrap(),
        )
    }

    /// GET `path` with the token; the JSON answer.
    async fn get(&self, path: &str) -> Value {
        let r = self
            .http
            .get(format!("{}{path}", self.s.base))
            .bearer_auth(&self.s.token)
            .send()
            .await
            .unwrap();
        serde_json::from_slice(&r.bytes().await.unwrap()).unwrap()
    }

    /// POST `/api/check?read_data=true` with the token: the streamed answer.
    async fn check_read_data(&self) -> reqwest::Response {
        self.http
            .post(format!("{}/api/check?read_data=true", self.s.base))
            .bearer_auth(&self.s.token)
            .send()
            .await
            .unwrap()
    }

    async fn backups(&self) -> Vec<u64> {
        let v = self.get("/api/backups").await;
        v["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b["id"].as_u64().unwrap())
            .collect()
    }
}

/// Where `original` (an absolute path backed up) is restored below `target`.
fn under(target: &Path, original: &Path) -> PathBuf {
    target.join(original.strip_prefix("/").unwrap())
}

#[tokio::test]
async fn actions_need_the_token_and_are_refused_read_only() {
    let c = Client {
        http: reqwest::Client::new(),
        s: served(),
    };
    let target = c.s.dir.path().join("restored");
    let bodies = [
        ("/api/restore", json!({ "backup": 1, "target": target })),
        ("/api/check", json!({})),
        ("/api/forget", json!({ "ids": [1] })),
    ];
    for (path, body) in &bodies {
        let r = c
            .http
            .post(format!("{}{path}", c.s.base))
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED, "{path}");
        let (status, v) = c.post(path, body.clone()).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{path}: {v}");
        assert!(v["error"].as_str().unwrap().contains("--read-only"), "{v}");
    }
    assert!(!target.exists(), "nothing restored");
    assert_eq!(c.backups().await, [1, 2], "nothing deleted");
}

#[tokio::test]
async fn a_restore_never_follows_a_link_in_the_target_and_reports_what_it_could_not_restore() {
    let c = Client::writable(Layout::Container);
    let src = c.s.src.clone();
    let outside = c.s.dir.path().join("outside");
    fs::create_dir(&outside).unwrap();
    let target = c.s.dir.path().join("target");
    // A link where the backup has the directory `docs`.
    let docs = under(&target, &src.join("docs"));
    fs::create_dir_all(docs.parent().unwrap()).unwrap();
    symlink(&outside, &docs).unwrap();
    let body = json!({
        "backup": 2, "target": target,
        "paths": [c.s.path("docs"), c.s.path("a.txt"), c.s.path("new.txt")],
    });
    let (status, v) = c.post("/api/restore", body.clone()).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["complete"], false, "{v}");
    assert_eq!(
        fs::read_dir(&outside).unwrap().count(),
        0,
        "written through the link"
    );
    assert!(fs::symlink_metadata(&docs)
        .unwrap()
        .file_type()
        .is_symlink());
    let failed = v["failed"].as_array().unwrap();
    assert_eq!(failed.len(), 1, "{v}");
    assert_eq!(failed[0]["path"], c.s.path("docs"), "{v}");
    assert!(
        failed[0]["reason"]
            .as_str()
            .unwrap()
            .contains("symbolic link"),
        "{v}"
    );
    // The other selected entries were restored, nothing else.
    assert_eq!(
        fs::read(under(&target, &src.join("a.txt"))).unwrap(),
        b"hello again, tessera\n"
    );
    assert_eq!(
        fs::read(under(&target, &src.join("new.txt"))).unwrap(),
        b"new\n"
    );
    assert!(!under(&target, &src.join("many")).exists());
    // Replacing what is in the way: the backup's kinds win.
    let mut replace = body;
    replace["overwrite"] = "always".into();
    let (status, v) = c.post("/api/restore", replace).await;
    assert_eq!(
        (status, v["complete"].clone()),
        (StatusCode::OK, true.into()),
        "{v}"
    );
    assert_eq!(fs::read_dir(&outside).unwrap().count(), 0);
    assert!(fs::symlink_metadata(&docs).unwrap().is_dir());
    assert!(fs::read(docs.join("big.bin")).unwrap() == noise(3 << 20, 7));
    assert_eq!(fs::read(docs.join("deep/x/y/z.txt")).unwrap(), b"deep\n");
}

#[tokio::test]
async fn a_whole_backup_restores_and_bad_requests_are_refused() {
    let c = Client::writable(Layout::Container);
    let target = c.s.dir.path().join("whole");
    let (status, v) = c
        .post(
            "/api/restore",
            json!({ "backup": "latest", "target": target }),
        )
        .await;
    assert_eq!(
        (status, v["complete"].clone()),
        (StatusCode::OK, true.into()),
        "{v}"
    );
    let many = under(&target, &c.s.src.join("many"));
    assert_eq!(fs::read_dir(&many).unwrap().count(), common::MANY);
    assert_eq!(fs::read(many.join("f00042")).unwrap(), b"42\n");
    // Restoring again refuses to replace what is there, file by file.
    let (status, v) = c
        .post("/api/restore", json!({ "backup": 1, "target": target }))
        .await;
    assert_eq!(
        (status, v["complete"].clone()),
        (StatusCode::OK, false.into()),
        "{v}"
    );
    assert_eq!(
        fs::read(under(&target, &c.s.src.join("a.txt"))).unwrap(),
        b"hello again, tessera\n",
        "kept"
    );
    for (body, want) in [
        (
            json!({ "backup": 1, "target": "relative/dir" }),
            StatusCode::BAD_REQUEST,
        ),
        (
            json!({ "backup": 1, "target": target, "paths": ["/a/../../etc"] }),
            StatusCode::BAD_REQUEST,
        ),
        (
            json!({ "backup": 1, "target": target, "paths": [c.s.path("no/such")] }),
            StatusCode::NOT_FOUND,
        ),
        (
            json!({ "backup": 9, "target": target }),
            StatusCode::NOT_FOUND,
        ),
        (
            json!({ "backup": 1, "target": target, "overwrite": "sometimes" }),
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
    ] {
        let (status, v) = c.post("/api/restore", body.clone()).await;
        assert_eq!(status, want, "{body}: {v}");
    }
}

#[tokio::test]
async fn a_check_streams_its_phases_and_ends_with_the_report() {
    let c = Client::writable(Layout::Container);
    let r = c.check_read_data().await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.headers()["content-type"], "application/x-ndjson");
    let text = r.text().await.unwrap();
    let events: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(events.iter().any(|e| e["event"] == "phase"), "{text}");
    let last = events.last().unwrap();
    assert_eq!(last["event"], "report", "{text}");
    assert_eq!(last["ok"], true, "{text}");
    assert_eq!(last["report"]["backups"], 2, "{text}");
    assert!(last["report"]["chunks_verified"].as_u64().unwrap() > 0);
    // Damage is found and reported in the stream's last line.
    // The largest file of the repository: a container of the big file's chunks.
    let victim = walk_files(&c.s.dir.path().join("repo"))
        .into_iter()
        .max_by_key(|p| fs::metadata(p).unwrap().len())
        .unwrap();
    let mut bytes = fs::read(&victim).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0xff;
    fs::write(&victim, bytes).unwrap();
    let r = c.check_read_data().await;
    assert_eq!(r.status(), StatusCode::OK);
    let text = r.text().await.unwrap();
    let last: Value = serde_json::from_str(text.lines().last().unwrap()).unwrap();
    assert_eq!(
        (last["event"].clone(), last["ok"].clone()),
        ("report".into(), false.into()),
        "{text}"
    );
    assert!(!last["report"]["problems"].as_array().unwrap().is_empty());
    // The check quarantined the damaged chunk: the health view lists it.
    let health = c.get("/api/health").await;
    let q = health["quarantine"].as_array().unwrap();
    assert_eq!(q.len(), 1, "{health}");
    assert!(
        q[0]["object"].as_str().unwrap().starts_with("containers/"),
        "{health}"
    );
}

fn walk_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(walk_files(&p));
        } else {
            out.push(p);
        }
    }
    out
}

#[tokio::test]
async fn forget_says_what_it_frees_then_deletes() {
    let c = Client::writable(Layout::Lifecycle);
    let (status, dry) = c
        .post("/api/forget", json!({ "ids": [1], "dry_run": true }))
        .await;
    assert_eq!(status, StatusCode::OK, "{dry}");
    assert_eq!(dry["would_delete"], json!([1]));
    let frees = dry["bytes_freed"].as_u64().unwrap();
    assert_eq!(c.backups().await, [1, 2], "a dry run deletes nothing");
    // Another process reading the repository: deleting needs it alone.
    let repo = c.s.dir.path().join("repo");
    let reader = tessera::Repository::open(&repo, tessera::backend::LockMode::Read).unwrap();
    let (status, v) = c.post("/api/forget", json!({ "ids": [1] })).await;
    assert_eq!(status, StatusCode::CONFLICT, "{v}");
    drop(reader);
    // The server still reads (it took its lock back).
    assert_eq!(c.backups().await, [1, 2]);
    let (status, v) = c.post("/api/forget", json!({ "ids": [1] })).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["deleted"], json!([1]), "{v}");
    assert_eq!(v["bytes_freed"].as_u64().unwrap(), frees, "{v}");
    assert_eq!(c.backups().await, [2]);
    // It reads again, and holds its read lock: maintenance waits.
    assert!(matches!(
        tessera::Repository::open(&repo, tessera::backend::LockMode::Exclusive),
        Err(tessera::Error::Locked(_))
    ));
    let (status, _) = c.post("/api/forget", json!({ "ids": [1] })).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _) = c.post("/api/forget", json!({ "ids": [] })).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn forget_in_the_container_layout_leaves_the_space_to_gc() {
    let c = Client::writable(Layout::Container);
    let (status, dry) = c
        .post("/api/forget", json!({ "ids": [2], "dry_run": true }))
        .await;
    assert_eq!(
        (status, dry["bytes_freed"].clone()),
        (StatusCode::OK, Value::Null),
        "{dry}"
    );
    let (status, v) = c.post("/api/forget", json!({ "ids": [2] })).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert!(v["note"].as_str().unwrap().contains("gc"), "{v}");
    assert_eq!(c.backups().await, [1]);
}

/// GET `/api/health` of the server at `base`.
async fn health(http: &reqwest::Client, base: &str, token: &str) -> Value {
    let r = http
        .get(format!("{base}/api/health"))
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    serde_json::from_slice(&r.bytes().await.unwrap()).unwrap()
}

#[tokio::test]
async fn the_last_check_is_kept_and_shown_after_a_restart() {
    use std::os::unix::fs::PermissionsExt;
    let c = Client::writable(Layout::Container);
    let h = health(&c.http, &c.s.base, &c.s.token).await;
    assert_eq!(
        (h["last_check"].clone(), h["kept"].clone()),
        (Value::Null, true.into()),
        "{h}"
    );
    let files = |dir: &Path| {
        let mut f = walk_files(dir);
        f.retain(|p| !p.to_string_lossy().contains("lock"));
        f.sort();
        f
    };
    let repo_before = files(&c.s.dir.path().join("repo"));
    let r = c
        .http
        .post(format!("{}/api/check", c.s.base))
        .bearer_auth(&c.s.token)
        .send()
        .await
        .unwrap();
    let text = r.text().await.unwrap();
    let last: Value = serde_json::from_str(text.lines().last().unwrap()).unwrap();
    assert_eq!(last["ok"], true, "{text}");
    // Kept outside the repository, in the cache directory, the owner's alone.
    let kept = PathBuf::from(last["kept"].as_str().expect(&text));
    assert!(kept.starts_with(c.s.dir.path().join("cache")), "{kept:?}");
    let mode = fs::metadata(&kept).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    assert_eq!(files(&c.s.dir.path().join("repo")), repo_before);
    // A new server (a restart; read-only too) shows it.
    let read_only = tessera_serve::Options::default();
    let (base, token) = common::serve_again(&c.s, &read_only);
    let h = health(&c.http, &base, &token).await;
    let lc = &h["last_check"];
    assert_eq!(lc["ok"], true, "{h}");
    assert_eq!(
        (lc["problems"].clone(), lc["damaged"].clone()),
        (0.into(), 0.into()),
        "{h}"
    );
    assert_eq!(
        (lc["by"].clone(), lc["read_data"].clone()),
        ("serve".into(), false.into())
    );
    assert_eq!(lc["report"]["backups"], 2, "{h}");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    assert!(lc["time"].as_u64().unwrap().abs_diff(now) < 600, "{h}");
    // A damaged record is said so, not taken for a check.
    let mut bytes = fs::read(&kept).unwrap();
    let end = bytes.len() - 3;
    bytes[end] ^= 1;
    fs::write(&kept, bytes).unwrap();
    let h = health(&c.http, &base, &token).await;
    assert!(
        h["last_check"]["error"]
            .as_str()
            .unwrap()
            .contains("corrupt"),
        "{h}"
    );
}

#[tokio::test]
async fn names_that_are_not_utf8_are_restored_by_their_bytes() {
    let options = tessera_serve::Options {
        read_only: false,
        ..tessera_serve::Options::default()
    };
    let s = common::served_odd(&options);
    let c = Client {
        http: reqwest::Client::new(),
        s,
    };
    let target = c.s.dir.path().join("restored");
    let mut odd = c.s.src.join("odd").into_os_string().into_vec();
    odd.extend_from_slice(b"/\xff.bin");
    let hex: String = odd[1..].iter().map(|b| format!("{b:02x}")).collect();
    let (status, v) = c
        .post(
            "/api/restore",
            json!({ "backup": 2, "target": target, "paths_hex": [hex] }),
        )
        .await;
    assert_eq!(
        (status, v["complete"].clone()),
        (StatusCode::OK, true.into()),
        "{v}"
    );
    assert_eq!(v["files"], 1, "{v}");
    let restored = target.join(std::ffi::OsStr::from_bytes(&odd[1..]));
    assert_eq!(fs::read(restored).unwrap(), common::ODD_BYTES);
    for bad in ["zz", "2e2e2f6574632f706173737764"] {
        let (status, v) = c
            .post(
                "/api/restore",
                json!({ "backup": 2, "target": target, "paths_hex": [bad] }),
            )
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}: {v}");
    }
}
