//! The JSON API against a real repository, without a browser.

mod common;

use common::{noise, served, Served, MANY};
use reqwest::StatusCode;
use serde_json::Value;

struct Client {
    http: reqwest::Client,
    s: Served,
}

impl Client {
    fn new() -> Client {
        Client {
            http: reqwest::Client::new(),
            s: served(),
        }
    }

    /// GET `path` with the token (as a bearer token).
    async fn get(&self, path: &str, query: &[(&str, &str)]) -> reqwest::Response {
        self.http
            .get(reqwest::Url::parse_with_params(&format!("{}{path}", self.s.base), query).unwrap())
            .bearer_auth(&self.s.token)
            .send()
            .await
            .unwrap()
    }

    /// GET `path`, expecting `status`; its JSON body.
    async fn json(&self, path: &str, query: &[(&str, &str)], status: StatusCode) -> Value {
        let r = self.get(path, query).await;
        assert_eq!(r.status(), status, "{path} {query:?}");
        serde_json::from_slice(&r.bytes().await.unwrap()).unwrap()
    }
}

#[tokio::test]
async fn every_request_needs_the_token() {
    let c = Client::new();
    let base = &c.s.base;
    for path in [
        "/",
        "/app.js",
        "/api/backups",
        "/api/stats",
        "/api/backups/1/file?path=/",
    ] {
        let r = c.http.get(format!("{base}{path}")).send().await.unwrap();
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED, "{path}");
        let wrong = "0".repeat(64);
        let r = c
            .http
            .get(format!("{base}{path}"))
            .bearer_auth(&wrong)
            .send()
            .await
            .unwrap();
        assert_eq!(
            r.status(),
            StatusCode::UNAUTHORIZED,
            "{path} with a wrong token"
        );
    }
    // The URL printed opens the page; the query parameter works for the API too.
    let page = c.http.get(&c.s.url).send().await.unwrap();
    assert_eq!(page.status(), StatusCode::OK);
    let csp = page.headers()["content-security-policy"]
        .to_str()
        .unwrap()
        .to_string();
    assert!(csp.contains("default-src 'none'"), "{csp}");
    assert!(page
        .text()
        .await
        .unwrap()
        .contains(&format!("app.js?token={}", c.s.token)));
    let r = c
        .http
        .get(format!("{base}/api/backups?token={}", c.s.token))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(c.get("/api/backups", &[]).await.status(), StatusCode::OK);
}

#[tokio::test]
async fn backups_are_listed_and_paged() {
    let c = Client::new();
    let all = c.json("/api/backups", &[], StatusCode::OK).await;
    assert_eq!(all["total"], 2);
    let first = &all["items"][0];
    assert_eq!(first["id"], 1);
    assert_eq!(first["host"], "testhost");
    assert_eq!(first["paths"][0], c.s.src.display().to_string());
    assert!(first["new_bytes"].as_u64().unwrap() > 3 << 20);
    let newest = c
        .json(
            "/api/backups",
            &[("limit", "1"), ("order", "desc")],
            StatusCode::OK,
        )
        .await;
    assert_eq!(
        (newest["total"].clone(), newest["items"][0]["id"].clone()),
        (2.into(), 2.into())
    );
    let second = c
        .json(
            "/api/backups",
            &[("offset", "1"), ("limit", "1")],
            StatusCode::OK,
        )
        .await;
    assert_eq!(second["items"][0]["id"], 2);
    c.json(
        "/api/backups",
        &[("limit", "100000")],
        StatusCode::BAD_REQUEST,
    )
    .await;
    let one = c.json("/api/backups/latest", &[], StatusCode::OK).await;
    assert_eq!(one["id"], 2);
}

#[tokio::test]
async fn unknown_backups_and_paths_are_404_naming_them() {
    let c = Client::new();
    for id in ["999", "abc"] {
        let e = c
            .json(
                &format!("/api/backups/{id}/tree"),
                &[],
                StatusCode::NOT_FOUND,
            )
            .await;
        assert!(e["error"].as_str().unwrap().contains(id), "{e}");
    }
    let missing = c.s.path("no/such/dir");
    let e = c
        .json(
            "/api/backups/1/tree",
            &[("path", &missing)],
            StatusCode::NOT_FOUND,
        )
        .await;
    assert!(e["error"].as_str().unwrap().contains("no/such/dir"), "{e}");
    let e = c
        .json(
            "/api/backups/1/file",
            &[("path", &missing)],
            StatusCode::NOT_FOUND,
        )
        .await;
    assert!(e["error"].as_str().unwrap().contains("no/such/dir"), "{e}");
    // new.txt is only in the second backup.
    let new = c.s.path("new.txt");
    c.json(
        "/api/backups/1/file",
        &[("path", &new)],
        StatusCode::NOT_FOUND,
    )
    .await;
    c.json(
        "/api/diff",
        &[("from", "1"), ("to", "7")],
        StatusCode::NOT_FOUND,
    )
    .await;
}

#[tokio::test]
async fn paths_outside_the_backup_are_400() {
    let c = Client::new();
    let out = c.s.path("../../../etc/passwd");
    for endpoint in ["tree", "file"] {
        let e = c
            .json(
                &format!("/api/backups/1/{endpoint}"),
                &[("path", &out)],
                StatusCode::BAD_REQUEST,
            )
            .await;
        assert!(e["error"].as_str().unwrap().contains(".."), "{e}");
    }
    c.json(
        "/api/backups/1/tree",
        &[("path", "..")],
        StatusCode::BAD_REQUEST,
    )
    .await;
}

#[tokio::test]
async fn a_huge_directory_is_paged() {
    let c = Client::new();
    let many = c.s.path("many");
    let mut names = Vec::new();
    let mut offset = 0;
    loop {
        let o = offset.to_string();
        let page = c
            .json(
                "/api/backups/2/tree",
                &[("path", &many), ("offset", &o), ("limit", "1000")],
                StatusCode::OK,
            )
            .await;
        assert_eq!(page["total"], MANY);
        let items = page["items"].as_array().unwrap();
        if items.is_empty() {
            break;
        }
        assert!(items.len() <= 1000);
        names.extend(
            items
                .iter()
                .map(|e| e["path"].as_str().unwrap().to_string()),
        );
        offset += items.len();
    }
    let want: Vec<String> = (0..MANY).map(|i| format!("{many}/f{i:05}")).collect();
    assert_eq!(names, want);
}

#[tokio::test]
async fn files_come_back_byte_for_byte_and_directories_as_tar() {
    let c = Client::new();
    let big = c.s.path("docs/big.bin");
    let r = c.get("/api/backups/1/file", &[("path", &big)]).await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(
        r.headers()["content-length"],
        (3u64 << 20).to_string().as_str()
    );
    assert!(r.headers()["content-disposition"]
        .to_str()
        .unwrap()
        .contains("big.bin"));
    assert!(r.bytes().await.unwrap() == noise(3 << 20, 7));
    // Each backup's own version of a changed file.
    let a = c.s.path("a.txt");
    for (id, want) in [("1", "hello, tessera\n"), ("2", "hello again, tessera\n")] {
        let r = c
            .get(&format!("/api/backups/{id}/file"), &[("path", &a)])
            .await;
        assert_eq!(r.text().await.unwrap(), want);
    }
    let deep = c.s.path("docs/deep");
    let r = c.get("/api/backups/1/file", &[("path", &deep)]).await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.headers()["content-type"], "application/x-tar");
    let tar = r.bytes().await.unwrap();
    let mut archive = tar::Archive::new(&tar[..]);
    let mut found = Vec::new();
    for entry in archive.entries().unwrap() {
        let mut entry = entry.unwrap();
        let path = entry.path().unwrap().display().to_string();
        if path.ends_with("z.txt") {
            let mut text = String::new();
            std::io::Read::read_to_string(&mut entry, &mut text).unwrap();
            found.push(text);
        }
    }
    assert_eq!(found, ["deep\n"]);
}

#[tokio::test]
async fn directories_come_as_zip_too() {
    use std::io::Read;
    let c = Client::new();
    let docs = c.s.path("docs");
    let r = c
        .get("/api/backups/1/file", &[("path", &docs), ("format", "zip")])
        .await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.headers()["content-type"], "application/zip");
    assert!(r.headers()["content-disposition"]
        .to_str()
        .unwrap()
        .contains("docs.zip"));
    let bytes = r.bytes().await.unwrap();
    let mut zip = zip::ZipArchive::new(std::io::Cursor::new(&bytes[..])).unwrap();
    let mut names: Vec<String> = zip.file_names().map(|n| n.unwrap().into_owned()).collect();
    names.sort();
    assert_eq!(
        names,
        [
            "docs/",
            "docs/big.bin",
            "docs/deep/",
            "docs/deep/x/",
            "docs/deep/x/y/",
            "docs/deep/x/y/z.txt"
        ]
    );
    let mut big = Vec::new();
    zip.by_name("docs/big.bin")
        .unwrap()
        .read_to_end(&mut big)
        .unwrap();
    assert!(big == noise(3 << 20, 7), "zipped bytes differ");
    let mut z = String::new();
    zip.by_name("docs/deep/x/y/z.txt")
        .unwrap()
        .read_to_string(&mut z)
        .unwrap();
    assert_eq!(z, "deep\n");
    // The whole backup, named by full paths.
    let r = c.get("/api/backups/2/file", &[("format", "zip")]).await;
    let bytes = r.bytes().await.unwrap();
    let zip = zip::ZipArchive::new(std::io::Cursor::new(&bytes[..])).unwrap();
    let names: Vec<String> = zip.file_names().map(|n| n.unwrap().into_owned()).collect();
    let new = c.s.path("new.txt");
    assert!(names.iter().any(|n| format!("/{n}") == new));
    assert_eq!(names.iter().filter(|n| n.contains("/many/f")).count(), MANY);
    // A file is its bytes; an unknown format is refused.
    let a = c.s.path("a.txt");
    for (path, format) in [(&a, "zip"), (&docs, "rar")] {
        let r = c
            .get("/api/backups/1/file", &[("path", path), ("format", format)])
            .await;
        assert_eq!(r.status(), StatusCode::BAD_REQUEST, "{path} {format}");
    }
}

#[tokio::test]
async fn diff_stats_and_space() {
    let c = Client::new();
    let d = c
        .json("/api/diff", &[("from", "1"), ("to", "2")], StatusCode::OK)
        .await;
    assert_eq!(
        (d["stats"]["added"].clone(), d["stats"]["changed"].clone()),
        (1.into(), 1.into())
    );
    // The source directory's own change of time, if any, is metadata only.
    let paths: Vec<&str> = d["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["change"] != "metadata")
        .map(|c| c["path"].as_str().unwrap())
        .collect();
    assert_eq!(paths, [c.s.path("a.txt"), c.s.path("new.txt")]);
    let s = c.json("/api/stats", &[], StatusCode::OK).await;
    assert_eq!(s["backups"], 2);
    assert!(s["logical_bytes"].as_u64().unwrap() > 3 << 20);
    // The container layout has no estimate of what a deletion frees.
    let e = c
        .json("/api/space", &[("ids", "1")], StatusCode::NOT_IMPLEMENTED)
        .await;
    assert!(e["error"].as_str().unwrap().contains("lifecycle"), "{e}");
    c.json("/api/space", &[("ids", "x")], StatusCode::BAD_REQUEST)
        .await;
}

#[tokio::test]
async fn space_says_what_deleting_frees_in_the_lifecycle_layout() {
    let c = Client {
        http: reqwest::Client::new(),
        s: common::served_in(tessera::repo::config::Layout::Lifecycle),
    };
    let none = c.json("/api/space", &[], StatusCode::OK).await;
    assert_eq!(none["freed_bytes"], 0);
    let both = c
        .json("/api/space", &[("ids", "1,2")], StatusCode::OK)
        .await;
    // Deleting every backup frees at least the big file's bytes.
    assert!(both["freed_bytes"].as_u64().unwrap() >= 3 << 20, "{both}");
    let trend = c
        .json("/api/space", &[("source", "test")], StatusCode::OK)
        .await;
    assert_eq!(trend["trend"].as_array().unwrap().len(), 2, "{trend}");
    c.json("/api/space", &[("ids", "9")], StatusCode::NOT_FOUND)
        .await;
}

#[tokio::test]
async fn names_that_are_not_utf8_are_listed_and_downloaded_by_their_bytes() {
    use std::os::unix::ffi::OsStrExt;
    let c = Client {
        http: reqwest::Client::new(),
        s: common::served_odd(&tessera_serve::Options::default()),
    };
    let odd = c.s.path("odd");
    let v = c
        .json("/api/backups/1/tree", &[("path", &odd)], StatusCode::OK)
        .await;
    let items = v["items"].as_array().unwrap();
    // Every entry has its bytes in hex, the odd ones most of all.
    assert!(items.iter().all(|e| e["path_hex"].is_string()), "{v}");
    let file = items
        .iter()
        .find(|e| e["path_hex"].as_str().unwrap().ends_with("2fff2e62696e"))
        .expect("the file named with byte 0xff");
    assert!(file["path"].as_str().unwrap().contains('\u{fffd}'));
    let hex = file["path_hex"].as_str().unwrap();
    let r = c.get("/api/backups/1/file", &[("path_hex", hex)]).await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(&r.bytes().await.unwrap()[..], common::ODD_BYTES);
    // A directory named so is listed by its bytes too.
    let dir = items
        .iter()
        .find(|e| e["kind"] == "dir")
        .expect("the directory named with byte 0xfe");
    let inner = c
        .json(
            "/api/backups/1/tree",
            &[("path_hex", dir["path_hex"].as_str().unwrap())],
            StatusCode::OK,
        )
        .await;
    assert_eq!(inner["total"], 1, "{inner}");
    assert!(inner["items"][0]["path"]
        .as_str()
        .unwrap()
        .ends_with("/in.txt"));
    let mut want = c.s.src.join("odd").as_os_str().as_bytes()[1..].to_vec();
    want.extend_from_slice(b"/dir\xfe");
    assert_eq!(inner["path_hex"], hex_of(&want));
    for q in [
        [("path_hex", "zz"), ("limit", "1")],
        [("path_hex", "2e2e"), ("limit", "1")],
        [("path_hex", hex), ("path", "/x")],
    ] {
        c.json("/api/backups/1/tree", &q, StatusCode::BAD_REQUEST)
            .await;
    }
}

fn hex_of(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[tokio::test]
async fn zip_keeps_links_as_links_and_says_what_it_left_out() {
    let c = Client {
        http: reqwest::Client::new(),
        s: common::served_odd(&tessera_serve::Options::default()),
    };
    let odd = c.s.path("odd");
    let r = c
        .get("/api/backups/1/file", &[("path", &odd), ("format", "zip")])
        .await;
    assert_eq!(r.status(), StatusCode::OK);
    let bytes = r.bytes().await.unwrap();
    let mut zip = zip::ZipArchive::new(std::io::Cursor::new(&bytes[..])).unwrap();
    let comment = String::from_utf8_lossy(zip.comment()).into_owned();
    assert!(comment.contains("FIFO"), "{comment:?}");
    let names: Vec<String> = zip.file_names().map(|n| n.unwrap().into_owned()).collect();
    assert!(!names.iter().any(|n| n.ends_with("fifo")), "{names:?}");
    let mut link = zip.by_name("odd/link").unwrap();
    assert_eq!(
        link.unix_mode().unwrap() & 0o170000,
        0o120000,
        "a symbolic link"
    );
    let mut target = String::new();
    std::io::Read::read_to_string(&mut link, &mut target).unwrap();
    assert_eq!(target, "../a.txt");
}

#[tokio::test]
async fn experiment_reports_are_listed_and_served_inert() {
    let reports = tempfile::tempdir().unwrap();
    let d = reports.path();
    std::fs::write(d.join("report.html"), "<h1>r</h1><svg></svg>").unwrap();
    std::fs::write(d.join("results.csv"), "system,version\nexact,1\n").unwrap();
    std::fs::write(d.join("secret.key"), "no").unwrap();
    let options = tessera_serve::Options {
        reports: Some(d.to_path_buf()),
        ..tessera_serve::Options::default()
    };
    let c = Client {
        http: reqwest::Client::new(),
        s: common::served_with(tessera::repo::config::Layout::Container, &options),
    };
    let v = c.json("/api/reports", &[], StatusCode::OK).await;
    let names: Vec<&str> = v["reports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["report.html", "results.csv"], "{v}");
    let r = c.get("/api/reports/report.html", &[]).await;
    assert_eq!(r.status(), StatusCode::OK);
    let csp = r.headers()["content-security-policy"]
        .to_str()
        .unwrap()
        .to_string();
    assert!(
        csp.contains("sandbox") && !csp.contains("script-src"),
        "{csp}"
    );
    assert!(r.text().await.unwrap().contains("<svg>"));
    for name in ["secret.key", "..%2Fx.csv", "nothing.csv"] {
        let r = c.get(&format!("/api/reports/{name}"), &[]).await;
        assert_eq!(r.status(), StatusCode::NOT_FOUND, "{name}");
    }
    // A server without reports says where they would come from.
    let plain = Client::new();
    let v = plain.json("/api/reports", &[], StatusCode::NOT_FOUND).await;
    assert!(v["error"].as_str().unwrap().contains("--reports"), "{v}");
}
