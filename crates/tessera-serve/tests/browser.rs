//! The page in a real browser: headless Chromium driven over WebDriver
//! (chromedriver). Where chromedriver is not installed (`.ci/run` installs
//! it) the test is reported as ignored, its name saying SKIPPED and why
//! (this file has its own `main`, libtest-mimic). Saves a screenshot of each view at
//! 1280×800 in docs/screenshots/.

mod common;

use base64::Engine;
use common::{noise, served_with};
use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{json, Value};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn find_in_path(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| Path::new(d).join(name))
        .find(|p| p.is_file())
}

/// chromedriver on a free port, killed when dropped.
struct Driver(Child, u16);

impl Drop for Driver {
    fn drop(&mut self) {
        self.0.kill().ok();
        self.0.wait().ok();
    }
}

fn start_driver(path: &Path) -> Driver {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let child = Command::new(path)
        .arg(format!("--port={port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let started = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "chromedriver did not start"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    Driver(child, port)
}

/// Waits until `script` (a JS expression) is truthy in the page; its value.
async fn until(c: &Client, script: &str) -> Value {
    let started = Instant::now();
    loop {
        let v = c
            .execute(&format!("return ({script});"), vec![])
            .await
            .unwrap();
        if v.as_bool() != Some(false) && !v.is_null() && v != json!(0) && v != json!("") {
            return v;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "timed out waiting for {script}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn screenshot(c: &Client, name: &str) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/screenshots");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join(format!("{name}.png")),
        c.screenshot().await.unwrap(),
    )
    .unwrap();
}

/// The number of elements `css` selects.
async fn count(c: &Client, css: &str) -> u64 {
    c.execute(
        "return document.querySelectorAll(arguments[0]).length",
        vec![json!(css)],
    )
    .await
    .unwrap()
    .as_u64()
    .unwrap()
}

async fn click(c: &Client, css: &str) {
    c.find(Locator::Css(css))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
}

/// The text of the element `css` selects.
async fn text(c: &Client, css: &str) -> String {
    c.find(Locator::Css(css))
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

/// Types `keys` into the field `css` selects.
async fn type_into(c: &Client, css: &str, keys: &str) {
    c.find(Locator::Css(css))
        .await
        .unwrap()
        .send_keys(keys)
        .await
        .unwrap();
}

/// Clears the field `css` selects and types `keys` into it.
async fn replace_in(c: &Client, css: &str, keys: &str) {
    let field = c.find(Locator::Css(css)).await.unwrap();
    field.clear().await.unwrap();
    field.send_keys(keys).await.unwrap();
}

/// The one test of this file, ignored (its name saying SKIPPED) without
/// chromedriver.
fn main() -> std::process::ExitCode {
    const NAME: &str = "browser_shows_backups_browses_downloads_restores_diffs_checks_and_forgets";
    let driver = find_in_path("chromedriver");
    let name = match driver {
        Some(_) => NAME.to_string(),
        None => format!(
            "{NAME} (SKIPPED: chromedriver not found; apt-get install chromium chromium-driver)"
        ),
    };
    let skipped = driver.is_none();
    let trial = libtest_mimic::Trial::test(name, move || {
        let Some(chromedriver) = driver else {
            return Ok(());
        };
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?
            .block_on(
                browser_shows_backups_browses_downloads_restores_diffs_checks_and_forgets(
                    &chromedriver,
                ),
            );
        Ok(())
    })
    .with_ignored_flag(skipped);
    libtest_mimic::run(&libtest_mimic::Arguments::from_args(), vec![trial]).exit_code()
}

/// A small seeded lab experiment (as `tessera experiment` runs it) in
/// `dir`: the directory of its reports.
fn lab_reports(dir: &Path) -> PathBuf {
    use tessera_lab::experiment::{run, ExperimentConfig};
    let config = dir.join("experiment.toml");
    std::fs::write(
        &config,
        "name = \"tiny\"\ncompression = [\"off\"]\n[dataset.generate]\nversions = 3\nsize = \"300KB\"\nseed = 7\n[[systems]]\nname = \"exact\"\n[[systems]]\nname = \"mfdedup\"\nlayout = \"lifecycle\"\n",
    )
    .unwrap();
    let out = dir.join("out");
    run(&ExperimentConfig::load(&config).unwrap(), &out, &mut |_| {}).unwrap();
    out
}

async fn browser_shows_backups_browses_downloads_restores_diffs_checks_and_forgets(
    chromedriver: &Path,
) {
    let lab = tempfile::tempdir().unwrap();
    let options = tessera_serve::Options {
        read_only: false,
        reports: Some(lab_reports(lab.path())),
        ..tessera_serve::Options::default()
    };
    let s = served_with(tessera::repo::config::Layout::Container, &options);
    let driver = start_driver(chromedriver);
    let caps = json!({ "goog:chromeOptions": { "args": [
        "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
        "--window-size=1280,800", "--hide-scrollbars", "--lang=en-US",
    ]}});
    let Value::Object(caps) = caps else {
        unreachable!()
    };
    let c = ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
        .capabilities(caps)
        .connect(&format!("http://127.0.0.1:{}", driver.1))
        .await
        .unwrap();
    c.goto(&s.url).await.unwrap();
    // A viewport of 1280×800: the window is that plus the browser's frame.
    let frame = c
        .execute("return [window.outerWidth - window.innerWidth, window.outerHeight - window.innerHeight]", vec![])
        .await
        .unwrap();
    let extra = |i: usize| frame[i].as_u64().unwrap_or(0) as u32;
    c.set_window_size(1280 + extra(0), 800 + extra(1))
        .await
        .unwrap();

    // The backups, newest first, with a bar per backup and size in the chart.
    until(
        &c,
        "document.querySelectorAll('#backups-table tbody tr').length === 2",
    )
    .await;
    let ids = c.execute("return [...document.querySelectorAll('#backups-table tbody tr td:nth-child(2)')].map(t => t.textContent)", vec![]).await.unwrap();
    assert_eq!(ids, json!(["2", "1"]));
    assert_eq!(
        until(&c, "document.querySelectorAll('#chart rect').length").await,
        json!(4)
    );
    screenshot(&c, "backups").await;

    // Browse backup 1: the source path, then docs/.
    click(&c, "#backups-table tbody tr:nth-child(2) button.browse").await;
    until(
        &c,
        "document.querySelectorAll('#browse-table button.dir').length === 1",
    )
    .await;
    click(&c, "#browse-table button.dir").await;
    until(&c, "[...document.querySelectorAll('#browse-table button.dir')].some(b => b.textContent === 'docs/')").await;
    c.execute("[...document.querySelectorAll('#browse-table button.dir')].find(b => b.textContent === 'docs/').focus()", vec![]).await.unwrap();
    // Keyboard: Enter on the focused folder opens it.
    c.active_element()
        .await
        .unwrap()
        .send_keys("\u{E007}")
        .await
        .unwrap();
    until(
        &c,
        "[...document.querySelectorAll('#browse-table td')].some(t => t.textContent === 'big.bin')",
    )
    .await;
    let crumbs = text(&c, "#crumbs").await;
    let crumbs: Vec<&str> = crumbs.split_whitespace().filter(|w| *w != "/").collect();
    assert!(crumbs.ends_with(&["src", "docs"]), "{crumbs:?}");
    screenshot(&c, "browse").await;

    // Download big.bin through the page's link and compare the bytes.
    let got = c.execute_async(
        "const done = arguments[arguments.length - 1];
         const a = [...document.querySelectorAll('#browse-table a.download')].find(a => a.getAttribute('download') === 'big.bin');
         fetch(a.href).then(r => r.blob()).then(b => { const f = new FileReader(); f.onload = () => done(f.result.split(',')[1]); f.readAsDataURL(b); });",
        vec![],
    ).await.unwrap();
    assert!(
        base64::engine::general_purpose::STANDARD
            .decode(got.as_str().unwrap())
            .unwrap()
            == noise(3 << 20, 7),
        "downloaded bytes differ"
    );

    // A directory of 5000 entries: a page of 1000 entries and the count of
    // all, of which only the rows in view (and a margin) are in the
    // document; scrolled to the end, the page's last entry; the next page
    // on demand.
    replace_in(&c, "#path-input", &format!("{}\u{E007}", s.path("many"))).await;
    let range = until(&c, "document.getElementById('tree-range').textContent.endsWith('of 5000 entries') && document.getElementById('tree-range').textContent").await;
    assert_eq!(range, json!("1–1000 of 5000 entries"));
    let drawn = count(&c, "#browse-table tbody tr").await;
    assert!((20..=100).contains(&drawn), "{drawn} rows drawn of 1000");
    // The page is as tall as its 1000 rows.
    let tall = c
        .execute(
            "return document.getElementById('browse-table').getBoundingClientRect().height",
            vec![],
        )
        .await
        .unwrap();
    assert!(
        tall.as_f64().unwrap() > 1000.0 * 20.0,
        "table {tall}px tall"
    );
    c.execute(
        "window.scrollTo(0, document.documentElement.scrollHeight)",
        vec![],
    )
    .await
    .unwrap();
    until(
        &c,
        "[...document.querySelectorAll('#browse-table td')].some(t => t.textContent === 'f00999')",
    )
    .await;
    let drawn = count(&c, "#browse-table tbody tr").await;
    assert!((20..=100).contains(&drawn), "{drawn} rows drawn at the end");
    // Keyboard: from the last row's checkbox, Up moves to the row above;
    // Ctrl+Home to the first row, drawn again.
    c.execute("[...document.querySelectorAll('#browse-table tbody tr')].find(r => r.textContent.includes('f00999')).querySelector('input.pick').focus()", vec![])
        .await
        .unwrap();
    let focused = "document.activeElement.closest('tr').cells[1].textContent";
    c.active_element()
        .await
        .unwrap()
        .send_keys("\u{E013}")
        .await
        .unwrap();
    until(&c, &format!("{focused} === 'f00998'")).await;
    c.active_element()
        .await
        .unwrap()
        .send_keys("\u{E009}\u{E011}")
        .await
        .unwrap();
    until(&c, &format!("{focused} === 'f00000'")).await;
    let drawn = count(&c, "#browse-table tbody tr").await;
    assert!((20..=100).contains(&drawn), "{drawn} rows drawn at the top");
    c.execute("window.scrollTo(0, 0)", vec![]).await.unwrap();
    click(&c, "#tree-next").await;
    until(
        &c,
        "document.getElementById('tree-range').textContent === '1001–2000 of 5000 entries'",
    )
    .await;
    until(
        &c,
        "[...document.querySelectorAll('#browse-table td')].some(t => t.textContent === 'f01000')",
    )
    .await;

    // The path bar jumps straight to a deep directory.
    replace_in(
        &c,
        "#path-input",
        &format!("{}\u{E007}", s.path("docs/deep/x/y")),
    )
    .await;
    until(
        &c,
        "[...document.querySelectorAll('#browse-table td')].some(t => t.textContent === 'z.txt')",
    )
    .await;

    // Restore z.txt, selected in the browser, into a directory of the server.
    c.execute(
        "document.querySelector('#browse-table input.pick').click()",
        vec![],
    )
    .await
    .unwrap();
    let picked = s.dir.path().join("picked");
    type_into(&c, "#restore-target", picked.to_str().unwrap()).await;
    click(&c, "#restore-selected").await;
    let said = until(&c, "document.querySelector('#restore-result p') && document.querySelector('#restore-result p').textContent").await;
    assert!(said.as_str().unwrap().starts_with("Restored"), "{said}");
    let z = picked.join(s.path("docs/deep/x/y/z.txt").trim_start_matches('/'));
    assert_eq!(std::fs::read(&z).unwrap(), b"deep\n");
    assert!(!picked
        .join(s.path("a.txt").trim_start_matches('/'))
        .exists());
    // The whole backup into a directory where a symbolic link stands in
    // the way of `docs`: never followed, reported on the page.
    let whole = s.dir.path().join("whole");
    let outside = s.dir.path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    let docs = whole.join(s.path("docs").trim_start_matches('/'));
    std::fs::create_dir_all(docs.parent().unwrap()).unwrap();
    std::os::unix::fs::symlink(&outside, &docs).unwrap();
    replace_in(&c, "#restore-target", whole.to_str().unwrap()).await;
    click(&c, "#restore-all").await;
    let failed = until(&c, "document.querySelector('#restore-failed') && document.querySelector('#restore-failed').textContent").await;
    assert!(
        failed.as_str().unwrap().contains(&s.path("docs")),
        "{failed}"
    );
    assert_eq!(std::fs::read_dir(&outside).unwrap().count(), 0);
    assert_eq!(
        std::fs::read(whole.join(s.path("a.txt").trim_start_matches('/'))).unwrap(),
        b"hello, tessera\n"
    );
    screenshot(&c, "restore").await;

    // Diff of the two backups.
    click(&c, "#nav-diff").await;
    click(&c, "#diff-run").await;
    until(
        &c,
        "document.querySelectorAll('#diff-table tbody tr').length >= 2",
    )
    .await;
    let summary = text(&c, "#diff-summary").await;
    assert!(
        summary.contains("1 added") && summary.contains("1 changed"),
        "{summary}"
    );
    screenshot(&c, "diff").await;

    // Stats, and what deleting backup 1 would free (not known in this layout).
    click(&c, "#nav-stats").await;
    until(
        &c,
        "document.querySelectorAll('#stats-list div').length > 5",
    )
    .await;
    let stats = text(&c, "#stats-list").await;
    assert!(stats.contains("Backups"), "{stats}");
    type_into(&c, "#space-ids", "1\u{E007}").await;
    let answer = until(&c, "document.getElementById('space-result').textContent.length > 1 && document.getElementById('space-result').textContent").await;
    assert!(answer.as_str().unwrap().contains("lifecycle"), "{answer}");
    screenshot(&c, "stats").await;

    // Health: a check, its progress streamed, then its verdict.
    click(&c, "#nav-health").await;
    click(&c, "#check-run").await;
    let verdict = until(&c, "document.getElementById('check-verdict') && document.getElementById('check-verdict').textContent").await;
    assert_eq!(verdict, json!("No problems found."));
    let quarantine = until(
        &c,
        "document.getElementById('quarantine-summary').textContent",
    )
    .await;
    assert_eq!(quarantine, json!("No quarantined chunks."));
    // The check is kept: the Health view shows it as the last check.
    let last = until(&c, "document.getElementById('last-check-verdict') && document.getElementById('last-check-verdict').textContent").await;
    assert!(
        last.as_str().unwrap().contains("no problems found"),
        "{last}"
    );
    screenshot(&c, "health").await;

    // The lab's experiment report: its files, tables and SVG plots.
    click(&c, "#nav-reports").await;
    let plots = until(&c, "document.querySelectorAll('#report-body svg').length").await;
    assert!(plots.as_u64().unwrap() >= 3, "{plots} plots");
    let files = text(&c, "#reports-list").await;
    assert!(
        files.contains("report.html") && files.contains("results.csv"),
        "{files}"
    );
    let scripts = c
        .execute(
            "return document.querySelectorAll('#report-body script, #report-body [onload]').length",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(scripts, json!(0));
    // The first plot, at the top of the window.
    c.execute("window.scrollTo(0, document.querySelector('#report-body figure').getBoundingClientRect().top + window.scrollY - 60)", vec![])
        .await
        .unwrap();
    screenshot(&c, "reports").await;
    c.execute("window.scrollTo(0, 0)", vec![]).await.unwrap();

    // Forget backup 1 from the table: what it frees first, then confirmed.
    click(&c, "#nav-backups").await;
    click(
        &c,
        "#backups-table tbody tr:nth-child(2) input[type=checkbox]",
    )
    .await;
    click(&c, "#forget-selected").await;
    let asked = until(&c, "!document.getElementById('forget-confirm').hidden && document.getElementById('forget-text').textContent").await;
    assert!(asked.as_str().unwrap().contains("gc"), "{asked}");
    screenshot(&c, "forget").await;
    click(&c, "#forget-yes").await;
    until(
        &c,
        "document.querySelectorAll('#backups-table tbody tr').length === 1",
    )
    .await;
    let result = text(&c, "#forget-result").await;
    assert!(result.starts_with("Deleted backup 1"), "{result}");

    // A phone-sized window: the backups still fit.
    c.set_window_size(390, 800).await.unwrap();
    click(&c, "#nav-backups").await;
    let wide = c
        .execute("return document.documentElement.scrollWidth", vec![])
        .await
        .unwrap();
    assert!(
        wide.as_u64().unwrap() <= 400,
        "page {wide}px wide in a 390px window"
    );
    screenshot(&c, "backups-narrow").await;
    c.close().await.unwrap();
    drop(driver);
}
