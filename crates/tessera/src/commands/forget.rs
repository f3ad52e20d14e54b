//! `forget`: applies a retention policy ([`crate::commands::retention`]) to the
//! backups of a repository, group by group, and deletes the backups no rule
//! keeps. The container layout frees their space at the next `gc`/`prune`;
//! the lifecycle layout frees it at once.
//!
//! A backup whose snapshot cannot be read is never deleted by a policy (its
//! time and group are unknown): it is reported, and `repair` deals with it.

use jiff::tz::TimeZone;
use serde::Serialize;

use crate::backend::LockMode;
use crate::commands::retention::{decide, Candidate, Decision, Policy};
use crate::error::{Error, Result};
use crate::format::snapshot::{BackupId, Snapshot};
use crate::layout::lifecycle::DeleteStats;
use crate::repo::config::Layout;
use crate::repo::Repository;

/// A snapshot property backups are grouped by.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum GroupKey {
    /// The source (lineage) name.
    Source,
    /// The host the backup was made on.
    Host,
    /// The paths a tree backup was given (empty for a stream backup).
    Paths,
    /// The backup's tags (as a set).
    Tags,
}

impl std::str::FromStr for GroupKey {
    type Err = Error;

    fn from_str(s: &str) -> Result<GroupKey> {
        match s {
            "source" => Ok(GroupKey::Source),
            "host" => Ok(GroupKey::Host),
            "paths" => Ok(GroupKey::Paths),
            "tags" => Ok(GroupKey::Tags),
            _ => Err(Error::InvalidOption(format!(
                "--group-by {s:?}: expected source, host, paths or tags (comma-separated)"
            ))),
        }
    }
}

/// Parses a `--group-by` list such as `source,paths`; an empty string
/// groups every backup together.
pub fn parse_group_by(s: &str) -> Result<Vec<GroupKey>> {
    s.split(',')
        .map(str::trim)
        .filter(|k| !k.is_empty())
        .map(str::parse)
        .collect()
}

/// The group of `snapshot` under `keys`.
fn group_of(snapshot: &Snapshot, keys: &[GroupKey]) -> String {
    keys.iter()
        .map(|k| match k {
            GroupKey::Source => format!("source={}", snapshot.source),
            GroupKey::Host => format!("host={}", snapshot.host),
            GroupKey::Tags => {
                let mut tags = snapshot.tags.clone();
                tags.sort_unstable();
                tags.dedup();
                format!("tags={}", tags.join(","))
            }
            GroupKey::Paths => format!(
                "paths={}",
                snapshot
                    .tree
                    .as_ref()
                    .map(|t| t.paths.join(","))
                    .unwrap_or_default()
            ),
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// What `forget` is asked to do.
#[derive(Clone, Debug)]
pub struct ForgetOptions {
    /// The retention rules.
    pub policy: Policy,
    /// What backups are grouped by (default: source).
    pub group_by: Vec<GroupKey>,
    /// Only decide, delete nothing.
    pub dry_run: bool,
    /// The time zone calendar periods are counted in (the user's).
    pub time_zone: TimeZone,
}

/// What `forget` decided and did.
#[derive(Clone, Debug, Serialize)]
pub struct ForgetReport {
    /// Every readable backup's decision, grouped, newest first.
    pub decisions: Vec<Decision>,
    /// The backups deleted (or, in a dry run, that would be).
    pub removed: Vec<BackupId>,
    /// Backups whose snapshot cannot be read, left alone.
    pub unreadable: Vec<BackupId>,
    /// Whether nothing was deleted because this was a dry run.
    pub dry_run: bool,
    /// The lifecycle layout: the space freed at once.
    pub freed: Option<DeleteStats>,
}

/// Applies `options` to `repo` (open exclusively unless a dry run).
pub fn forget(repo: &Repository, options: &ForgetOptions) -> Result<ForgetReport> {
    if options.policy.is_empty() {
        return Err(Error::InvalidOption(
            "no retention rule given: pass at least one --keep-* option (--keep-last 0 deletes every backup)"
                .into(),
        ));
    }
    if !options.dry_run {
        repo.require(LockMode::Exclusive, "forgetting backups")?;
    }
    let mut candidates = Vec::new();
    let mut unreadable = Vec::new();
    for listed in repo.listing()? {
        match listed.snapshot {
            Ok(s) => candidates.push(Candidate {
                id: s.id,
                time: i64::try_from(s.time).unwrap_or(i64::MAX),
                group: group_of(&s, &options.group_by),
                tags: s.tags.clone(),
            }),
            Err(_) => unreadable.push(listed.id),
        }
    }
    let decisions = decide(&options.policy, &candidates, &options.time_zone)?;
    let mut removed: Vec<BackupId> = decisions
        .iter()
        .filter(|d| !d.keep())
        .map(|d| d.id)
        .collect();
    removed.sort_unstable();
    let mut freed = None;
    if !options.dry_run && !removed.is_empty() {
        match repo.config().layout {
            Layout::Lifecycle => {
                freed = Some(crate::layout::lifecycle::delete_backups(repo, &removed)?)
            }
            Layout::Container => {
                for &id in &removed {
                    crate::commands::delete::delete_backup(repo, id)?;
                }
            }
        }
    }
    Ok(ForgetReport {
        decisions,
        removed,
        unreadable,
        dry_run: options.dry_run,
        freed,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn group_by_parses() {
        assert_eq!(
            parse_group_by("source").expect("parse"),
            vec![GroupKey::Source]
        );
        assert_eq!(
            parse_group_by("source, paths").expect("parse"),
            vec![GroupKey::Source, GroupKey::Paths]
        );
        assert!(parse_group_by("").expect("parse").is_empty());
        assert_eq!(
            parse_group_by("host,tags").expect("parse"),
            vec![GroupKey::Host, GroupKey::Tags]
        );
        assert!(parse_group_by("colour").is_err());
    }
}
