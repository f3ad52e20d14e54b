//! Records the git commit the lab is built from (`TESSERA_GIT_COMMIT`), for
//! the provenance of experiment results; none outside a git checkout.

use std::path::Path;
use std::process::Command;

/// The trimmed standard output of `git ARGS`, if it succeeds.
fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    if let Some(dir) = git(&["rev-parse", "--absolute-git-dir"]) {
        // HEAD moves on checkout; logs/HEAD grows on every commit.
        for file in ["HEAD", "logs/HEAD"] {
            let path = Path::new(&dir).join(file);
            if path.exists() {
                println!("cargo:rerun-if-changed={}", path.display());
            }
        }
    }
    if let Some(commit) = git(&["rev-parse", "HEAD"]) {
        println!("cargo:rustc-env=TESSERA_GIT_COMMIT={commit}");
    }
}
