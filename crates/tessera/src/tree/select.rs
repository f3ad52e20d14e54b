//! Which catalog paths a restore or listing takes: `--include` and
//! `--exclude` glob patterns matched against a path and its parents.

use super::relative_path;
use crate::error::{Error, Result};
use globset::{Glob, GlobSet, GlobSetBuilder};

/// Include and exclude patterns over catalog paths.
#[derive(Clone, Debug, Default)]
pub struct Selection {
    include: Option<GlobSet>,
    exclude: Option<GlobSet>,
}

impl Selection {
    /// A selection of the paths matching (or inside a directory matching)
    /// one of `include` (every path when empty) and none of `exclude`.
    /// Patterns are globs over paths as listed (`home/ann/*.txt`; a
    /// leading `/` is ignored); one without `/` matches a name at any depth.
    pub fn new(include: &[String], exclude: &[String]) -> Result<Self> {
        Ok(Selection {
            include: set(include)?,
            exclude: set(exclude)?,
        })
    }

    /// Whether `path` itself matches an include pattern and no exclude
    /// pattern (its parents are not considered): what `find` looks for.
    pub fn matches_path(&self, path: &[u8]) -> bool {
        let hit = |set: &GlobSet| set.is_match(relative_path(path));
        self.include.as_ref().is_none_or(hit) && !self.exclude.as_ref().is_some_and(hit)
    }

    /// Whether the entry at `path` is selected.
    pub fn matches(&self, path: &[u8]) -> bool {
        let hit = |set: &GlobSet| {
            set.is_match(relative_path(path))
                || path
                    .iter()
                    .enumerate()
                    .filter(|&(_, &b)| b == b'/')
                    .any(|(i, _)| set.is_match(relative_path(&path[..i])))
        };
        self.include.as_ref().is_none_or(hit) && !self.exclude.as_ref().is_some_and(hit)
    }
}

fn set(patterns: &[String]) -> Result<Option<GlobSet>> {
    if patterns.is_empty() {
        return Ok(None);
    }
    let mut b = GlobSetBuilder::new();
    for p in patterns {
        let trimmed = p.trim_start_matches('/').trim_end_matches('/');
        // A pattern without `/` matches a name at any depth.
        let pattern = match trimmed.contains('/') {
            true => trimmed.to_string(),
            false => format!("**/{trimmed}"),
        };
        let glob =
            Glob::new(&pattern).map_err(|e| Error::InvalidConfig(format!("pattern {p:?}: {e}")))?;
        b.add(glob);
    }
    b.build()
        .map(Some)
        .map_err(|e| Error::InvalidConfig(format!("patterns: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_match_paths_and_their_parents() {
        let s = Selection::new(&["/home/ann/docs".into()], &["*.tmp".into()]).unwrap();
        assert!(s.matches(b"home/ann/docs"));
        assert!(s.matches(b"home/ann/docs/a/b.txt"));
        assert!(!s.matches(b"home/ann/docs/a/b.tmp"));
        assert!(!s.matches(b"home/ann/docsx"));
        assert!(!s.matches(b"home/ann"));
        let all = Selection::new(&[], &["home/ann/cache".into()]).unwrap();
        assert!(all.matches(b"home/\xffname"));
        assert!(!all.matches(b"home/ann/cache/x"));
        let names = Selection::new(&[], &["*.o".into()]).unwrap();
        assert!(!names.matches(b"src/x/a.o"));
        assert!(names.matches(b"src/x/a.c"));
        let plain = Selection::new(&[], &["big[0-2]".into()]).unwrap();
        assert!(!plain.matches(b"tmp/.t/src/big1"));
        assert!(plain.matches(b"tmp/.t/src/big3"));
        assert!(Selection::new(&["a[".into()], &[]).is_err());
    }
}
