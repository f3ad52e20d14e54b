//! Which backups a listing shows: `--host`, `--path`, `--tag` and
//! `--source` filters over snapshots.

use crate::format::snapshot::Snapshot;

/// Filters over backups. Each given kind of filter must match (and); within
/// a kind, any of its values may (or). A tag value may name several tags
/// separated by `,`, all of which the backup must carry.
#[derive(Clone, Debug, Default)]
pub struct BackupFilter {
    /// Host names.
    pub hosts: Vec<String>,
    /// Paths given to a tree backup (absolute; a trailing `/` is ignored).
    pub paths: Vec<String>,
    /// Tags, or comma-separated groups of tags.
    pub tags: Vec<String>,
    /// Source lineages.
    pub sources: Vec<String>,
}

impl BackupFilter {
    /// Whether `snap` passes every filter.
    pub fn matches(&self, snap: &Snapshot) -> bool {
        let any = |values: &[String], hit: &dyn Fn(&str) -> bool| {
            values.is_empty() || values.iter().any(|v| hit(v))
        };
        let trim = |p: &str| -> String {
            let t = p.trim_end_matches('/');
            if t.is_empty() {
                "/".into()
            } else {
                t.into()
            }
        };
        let paths: Vec<String> = snap
            .tree
            .as_ref()
            .map(|t| t.paths.iter().map(|p| trim(p)).collect())
            .unwrap_or_default();
        any(&self.hosts, &|h| snap.host == h)
            && any(&self.sources, &|s| snap.source == s)
            && any(&self.paths, &|p| paths.contains(&trim(p)))
            && any(&self.tags, &|group| {
                group
                    .split(',')
                    .filter(|t| !t.is_empty())
                    .all(|t| snap.tags.iter().any(|have| have == t))
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::snapshot::TreeRef;

    #[test]
    fn filters_combine_with_and_across_kinds_and_or_within() {
        let snap = Snapshot {
            id: 1,
            time: 0,
            label: String::new(),
            source: "h:/home".into(),
            host: "h".into(),
            tags: vec!["daily".into(), "home".into()],
            logical_bytes: 0,
            stats: Default::default(),
            tree: Some(TreeRef {
                paths: vec!["/home".into(), "/etc".into()],
                ..TreeRef::default()
            }),
        };
        let f = |hosts: &[&str], paths: &[&str], tags: &[&str], sources: &[&str]| {
            let v = |x: &[&str]| x.iter().map(|s| s.to_string()).collect();
            BackupFilter {
                hosts: v(hosts),
                paths: v(paths),
                tags: v(tags),
                sources: v(sources),
            }
            .matches(&snap)
        };
        assert!(f(&[], &[], &[], &[]));
        assert!(f(&["x", "h"], &["/etc/"], &["daily,home"], &["h:/home"]));
        assert!(!f(&["x"], &[], &[], &[]));
        assert!(!f(&[], &["/et"], &[], &[]));
        assert!(!f(&[], &[], &["daily,weekly"], &[]));
        assert!(f(&[], &[], &["weekly", "home"], &[]));
        assert!(!f(&[], &[], &[], &["h"]));
    }
}
