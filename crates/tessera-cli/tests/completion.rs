//! Shell completions and manual pages generated from the CLI definition.

mod common;

use common::*;

#[test]
fn completion_scripts_name_every_command() {
    for shell in ["bash", "zsh", "fish"] {
        let out = ok(["completion", shell]);
        for command in ["backup", "restore", "forget", "check", "repair"] {
            assert!(out.contains(command), "{shell}: {command} missing");
        }
    }
    let err = fail(["completion", "tcsh"]);
    assert!(err.contains("tcsh"), "{err}");
}

#[test]
fn man_writes_a_page_per_command() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("man1");
    ok(["man", dir.to_str().unwrap()]);
    let main = std::fs::read_to_string(dir.join("tessera.1")).unwrap();
    assert!(main.contains(".TH tessera"), "{main}");
    let forget = std::fs::read_to_string(dir.join("tessera-forget.1")).unwrap();
    assert!(forget.contains("keep\\-daily"), "{forget}");
}
