//! `forget`: applies a retention policy ([`crate::commands::retention`]) to the
//! backups of a repository, group by group, and deletes the backups no rule
//! keeps. The container layout frees their space at the next `gc`/`prune`;
//! the lifecycle layout frees it at once.
//!
//! A backup whose snapshot cannot be read is never deleted by a policy (its
//! time and group are unknown): it is reported, and `repair` deals with it.

use jiff::tz::TimeZone;
use serde::Serialize;
use std::collections::BTreeMap;

use crate::backend::LockMode;
use crate::commands::retention::{decide, Candidate, Decision, Policy};
use crate::error::{Error, Result};
use crate::format::snapshot::{BackupId, Snapshot};
use crate::layout::lifecycle::DeleteStats;
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

impl GroupKey {
    /// Every key.
    pub const ALL: [GroupKey; 4] = [
        GroupKey::Host,
        GroupKey::Paths,
        GroupKey::Source,
        GroupKey::Tags,
    ];

    /// Its name in `--group-by` (and in JSON).
    pub fn name(self) -> &'static str {
        match self {
            GroupKey::Source => "source",
            GroupKey::Host => "host",
            GroupKey::Paths => "paths",
            GroupKey::Tags => "tags",
        }
    }
}

impl std::str::FromStr for GroupKey {
    type Err = Error;

    fn from_str(s: &str) -> Result<GroupKey> {
        GroupKey::ALL
            .into_iter()
            .find(|k| k.name() == s)
            .ok_or_else(|| {
                Error::InvalidOption(format!(
                    "--group-by {s:?}: expected host, paths, source or tags (comma-separated)"
                ))
            })
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

/// The grouping `forget` uses unless told otherwise: restic's (host and
/// paths), and the source lineage, which keeps apart backups that have no
/// paths (streams of standard input) and lineages named with `--source`.
/// A tree backup's default source is its host and paths: for those it adds
/// nothing.
pub const DEFAULT_GROUP_BY: &str = "host,paths,source";

/// One group of backups and what `forget` decided for its members.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Group {
    /// Its name, as each decision carries it: `key=value` per grouping
    /// key, separated by spaces (empty: every backup in one group).
    pub group: String,
    /// The host, when grouping by host.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// The paths, when grouping by paths (empty for a stream backup).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub paths: Option<Vec<String>>,
    /// The source lineage, when grouping by source.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// The tags (sorted, distinct), when grouping by tags.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tags: Option<Vec<String>>,
    /// Its backups kept, newest first.
    pub keep: Vec<BackupId>,
    /// Its backups removed (or, in a dry run, that would be), newest first.
    pub remove: Vec<BackupId>,
}

/// `value` as a group name shows it: as is, or quoted and escaped when it
/// is empty or holds a character that separates values (space, comma) or
/// a quote, a backslash or a control character — so that two different
/// values never show alike.
fn shown(value: &str) -> String {
    let plain = !value.is_empty()
        && value
            .chars()
            .all(|c| !(c.is_whitespace() || c.is_control() || matches!(c, ',' | '"' | '\\')));
    if plain {
        value.to_string()
    } else {
        format!("{value:?}")
    }
}

/// The group of `snapshot` under `keys` (its members not filled in).
fn group_of(snapshot: &Snapshot, keys: &[GroupKey]) -> Group {
    let mut group = Group::default();
    let mut names = Vec::with_capacity(keys.len());
    let list = |values: &[String]| {
        values
            .iter()
            .map(|v| shown(v))
            .collect::<Vec<_>>()
            .join(",")
    };
    for key in keys {
        match key {
            GroupKey::Source => {
                names.push(format!("source={}", shown(&snapshot.source)));
                group.source = Some(snapshot.source.clone());
            }
            GroupKey::Host => {
                names.push(format!("host={}", shown(&snapshot.host)));
                group.host = Some(snapshot.host.clone());
            }
            GroupKey::Tags => {
                let mut tags = snapshot.tags.clone();
                tags.sort_unstable();
                tags.dedup();
                names.push(format!("tags={}", list(&tags)));
                group.tags = Some(tags);
            }
            GroupKey::Paths => {
                let paths = snapshot
                    .tree
                    .as_ref()
                    .map(|t| t.paths.clone())
                    .unwrap_or_default();
                names.push(format!("paths={}", list(&paths)));
                group.paths = Some(paths);
            }
        }
    }
    group.group = names.join(" ");
    group
}

/// What `forget` is asked to do.
#[derive(Clone, Debug)]
pub struct ForgetOptions {
    /// The retention rules.
    pub policy: Policy,
    /// What backups are grouped by ([`DEFAULT_GROUP_BY`] unless told).
    pub group_by: Vec<GroupKey>,
    /// Only decide, delete nothing.
    pub dry_run: bool,
    /// The time zone calendar periods are counted in (the user's).
    pub time_zone: TimeZone,
}

/// What `forget` decided and did.
#[derive(Clone, Debug, Serialize)]
pub struct ForgetReport {
    /// What the backups were grouped by.
    pub group_by: Vec<GroupKey>,
    /// The groups, in the order of `decisions`, with their members.
    pub groups: Vec<Group>,
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
    let mut groups = BTreeMap::new();
    for listed in repo.listing()? {
        match listed.snapshot {
            Ok(s) => {
                let group = group_of(&s, &options.group_by);
                candidates.push(Candidate {
                    id: s.id,
                    time: i64::try_from(s.time).unwrap_or(i64::MAX),
                    group: group.group.clone(),
                    tags: s.tags.clone(),
                });
                groups.entry(group.group.clone()).or_insert(group);
            }
            Err(_) => unreadable.push(listed.id),
        }
    }
    let decisions = decide(&options.policy, &candidates, &options.time_zone)?;
    let groups = members(groups, &decisions);
    let mut removed: Vec<BackupId> = decisions
        .iter()
        .filter(|d| !d.keep())
        .map(|d| d.id)
        .collect();
    removed.sort_unstable();
    let mut freed = None;
    if !options.dry_run && !removed.is_empty() {
        freed = crate::layout::delete_backups(repo, &removed)?;
    }
    Ok(ForgetReport {
        group_by: options.group_by.clone(),
        groups,
        decisions,
        removed,
        unreadable,
        dry_run: options.dry_run,
        freed,
    })
}

/// The `groups` (by name) with their members as `decisions` (grouped,
/// newest first) decided, in the order of the decisions.
fn members(mut groups: BTreeMap<String, Group>, decisions: &[Decision]) -> Vec<Group> {
    let mut out: Vec<Group> = Vec::with_capacity(groups.len());
    for d in decisions {
        if out.last().is_none_or(|g| g.group != d.group) {
            let group = groups.remove(&d.group).unwrap_or_else(|| Group {
                group: d.group.clone(),
                ..Group::default()
            });
            out.push(group);
        }
        if let Some(g) = out.last_mut() {
            if d.keep() {
                g.keep.push(d.id);
            } else {
                g.remove.push(d.id);
            }
        }
    }
    out
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

    fn snapshot(host: &str, source: &str, paths: Option<&[&str]>) -> Snapshot {
        Snapshot {
            id: 1,
            time: 0,
            label: String::new(),
            source: source.into(),
            host: host.into(),
            tags: Vec::new(),
            logical_bytes: 0,
            stats: Default::default(),
            tree: paths.map(|p| crate::format::snapshot::TreeRef {
                paths: p.iter().map(|s| s.to_string()).collect(),
                ..Default::default()
            }),
        }
    }

    #[test]
    fn the_default_groups_by_host_paths_and_source() {
        let keys = parse_group_by(DEFAULT_GROUP_BY).expect("parse");
        let passwd = group_of(
            &snapshot("h", "h:/etc/passwd", Some(&["/etc/passwd"])),
            &keys,
        );
        assert_eq!(
            passwd.group,
            "host=h paths=/etc/passwd source=h:/etc/passwd"
        );
        assert_eq!(passwd.paths, Some(vec!["/etc/passwd".to_string()]));
        assert_eq!(passwd.host.as_deref(), Some("h"));
        assert_eq!(passwd.tags, None);
        let group = group_of(&snapshot("h", "h:/etc/group", Some(&["/etc/group"])), &keys);
        assert_ne!(passwd.group, group.group);
        // Streams have no paths: their source keeps them apart.
        let db = group_of(&snapshot("h", "db", None), &keys);
        let web = group_of(&snapshot("h", "web", None), &keys);
        assert_eq!(db.group, "host=h paths= source=db");
        assert_ne!(db.group, web.group);
        // Only the keys asked for are named.
        let by_host = group_of(&snapshot("h", "db", None), &[GroupKey::Host]);
        assert_eq!(by_host.group, "host=h");
        assert_eq!((by_host.paths, by_host.source), (None, None));
        assert_eq!(group_of(&snapshot("h", "db", None), &[]).group, "");
    }

    #[test]
    fn values_that_could_read_alike_are_quoted() {
        let keys = [GroupKey::Host, GroupKey::Paths];
        let one = group_of(&snapshot("h", "s", Some(&["/a,b"])), &keys);
        let two = group_of(&snapshot("h", "s", Some(&["/a", "b"])), &keys);
        assert_eq!(one.group, r#"host=h paths="/a,b""#);
        assert_eq!(two.group, "host=h paths=/a,b");
        let spaced = group_of(&snapshot("h paths=/x", "s", Some(&[])), &keys);
        assert_eq!(spaced.group, r#"host="h paths=/x" paths="#);
        let unnamed = group_of(&snapshot("", "s", Some(&[""])), &keys);
        assert_eq!(unnamed.group, r#"host="" paths="""#);
    }
}
