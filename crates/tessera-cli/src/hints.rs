//! Hints for habits brought from restic: a usage error that a restic user
//! makes (`restore --target DIR`, `snapshots`, `ls REPO` without a backup
//! id) gets a tip naming what Tessera wants instead, in place of clap's
//! guess (which suggests `--tar` for `--target`).

use clap::error::{ContextKind, ContextValue, ErrorKind};

/// The tip for a missing backup id.
const ID_TIP: &str = "tip: `tessera list REPO` lists the backups' ids; `latest` names the newest";
/// The tip for `restore --target DIR`.
const TARGET_TIP: &str = "tip: the directory to restore into is restore's third argument, \
     not an option: `tessera restore REPO ID DIR` (restic's --target DIR)";
/// The tip for `snapshots`.
const SNAPSHOTS_TIP: &str = "tip: `tessera list REPO` lists the backups (restic's `snapshots`)";

/// `message` (the one-line text of the usage error `e`) with Tessera's
/// tip for a restic habit in place of clap's tips, if `e` is one.
pub fn with_hint(e: &clap::Error, message: String) -> String {
    let Some(tip) = tip(e) else {
        return message;
    };
    // clap's own tips follow the message after "; tip:".
    let base = message
        .split_once("; tip:")
        .map_or(message.as_str(), |(m, _)| m);
    format!("{base}; {tip}")
}

fn tip(e: &clap::Error) -> Option<&'static str> {
    let named = |kind| match e.get(kind) {
        Some(ContextValue::String(s)) => vec![s.clone()],
        Some(ContextValue::Strings(v)) => v.clone(),
        _ => Vec::new(),
    };
    match e.kind() {
        ErrorKind::UnknownArgument => {
            let restore = e.render().to_string().contains("tessera restore ");
            let target = named(ContextKind::InvalidArg)
                .iter()
                .any(|a| a == "--target" || a.starts_with("--target="));
            (restore && target).then_some(TARGET_TIP)
        }
        ErrorKind::InvalidSubcommand => named(ContextKind::InvalidSubcommand)
            .iter()
            .any(|s| s == "snapshots")
            .then_some(SNAPSHOTS_TIP),
        ErrorKind::MissingRequiredArgument => named(ContextKind::InvalidArg)
            .iter()
            .any(|a| a == "<ID>" || a.starts_with("<ID"))
            .then_some(ID_TIP),
        _ => None,
    }
}
