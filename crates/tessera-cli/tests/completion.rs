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

/// The commands of `tessera --help`: (name, first line of its description).
fn help_commands() -> Vec<(String, String)> {
    let help = ok(["--help"]);
    let list = help
        .split("Commands:\n")
        .nth(1)
        .and_then(|rest| rest.split("\n\n").next())
        .expect("a Commands: section");
    list.lines()
        .filter_map(|line| {
            let line = line.trim_start();
            let (name, about) = line.split_once(' ')?;
            Some((name.to_string(), about.trim().to_string()))
        })
        .collect()
}

#[test]
fn every_command_describes_itself_once() {
    let commands = help_commands();
    assert!(commands.len() > 20, "{commands:?}");
    let mut seen = std::collections::HashSet::new();
    for (name, about) in &commands {
        assert!(!about.is_empty(), "{name} has no description");
        // An argument struct's doc comment is not a description of the command.
        assert!(!about.starts_with("The arguments"), "{name}: {about}");
        assert!(!about.starts_with("Arguments of"), "{name}: {about}");
        assert!(
            seen.insert(about.clone()),
            "{name} repeats a description: {about}"
        );
        let first_sentence = about.split(". ").next().unwrap_or(about);
        assert_eq!(
            about.matches(first_sentence).count(),
            1,
            "{name} repeats itself: {about}"
        );
    }
}

#[test]
fn the_cli_reference_lists_every_command() {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/CLI.md"))
        .expect("docs/CLI.md");
    let block = doc
        .split("Commands:\n")
        .nth(1)
        .expect("a Commands: block in docs/CLI.md");
    let block = block.split("```").next().unwrap_or(block);
    let listed: Vec<&str> = block
        .lines()
        .filter(|l| l.starts_with("  ") && !l.starts_with("   "))
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    let names: Vec<String> = help_commands().into_iter().map(|(n, _)| n).collect();
    assert_eq!(
        listed, names,
        "docs/CLI.md's command list differs from `tessera --help`"
    );
}
