//! Which catalog paths a restore or listing takes: `--include` and
//! `--exclude` glob patterns matched against a path and its parents.

use super::relative_path;
use crate::error::{Error, Result};
use globset::{Glob, GlobSet, GlobSetBuilder};
use std::path::{Path, PathBuf};

/// Include and exclude patterns over catalog paths.
#[derive(Clone, Debug, Default)]
pub struct Selection {
    include: Option<GlobSet>,
    exclude: Option<GlobSet>,
    /// The path of the only include pattern, when it is a literal path.
    literal: Option<Vec<u8>>,
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
            literal: match include {
                [p] => literal_path(p),
                _ => None,
            },
        })
    }

    /// The catalog path below which every selected path lies, when the
    /// selection is one include pattern naming a path without wildcards
    /// (`home/ann/a.txt`: it and what is below it).
    pub fn literal(&self) -> Option<Vec<u8>> {
        self.literal.clone()
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

/// The lines of `file` (newline-separated bytes, a trailing `\r` dropped),
/// without empty lines and lines starting with `#`: the patterns of an
/// `--exclude-file`, the paths of a `--files-from`.
pub fn read_lines(file: &Path) -> Result<Vec<Vec<u8>>> {
    let bytes = std::fs::read(file).map_err(|e| Error::Input {
        what: file.display().to_string(),
        source: e,
    })?;
    Ok(bytes
        .split(|&b| b == b'\n')
        .map(|l| l.strip_suffix(b"\r").unwrap_or(l))
        .filter(|l| !l.is_empty() && !l.starts_with(b"#"))
        .map(<[u8]>::to_vec)
        .collect())
}

/// The patterns of an `--exclude-file` (UTF-8 lines; see [`read_lines`]).
pub fn read_patterns(file: &Path) -> Result<Vec<String>> {
    read_lines(file)?
        .into_iter()
        .enumerate()
        .map(|(i, l)| {
            String::from_utf8(l).map_err(|_| {
                Error::InvalidConfig(format!(
                    "{}: pattern {} is not UTF-8",
                    file.display(),
                    i + 1
                ))
            })
        })
        .collect()
}

/// The paths of a `--files-from` list (any bytes; see [`read_lines`]).
pub fn read_paths(file: &Path) -> Result<Vec<PathBuf>> {
    use std::os::unix::ffi::OsStringExt;
    Ok(read_lines(file)?
        .into_iter()
        .map(|l| PathBuf::from(std::ffi::OsString::from_vec(l)))
        .collect())
}

/// The catalog path pattern `p` matches exactly, if it is one: with a
/// `/` (a pattern without one matches a name at any depth), no glob
/// syntax, and no empty, `.` or `..` component.
fn literal_path(p: &str) -> Option<Vec<u8>> {
    let trimmed = p.trim_start_matches('/').trim_end_matches('/');
    let plain = trimmed.contains('/')
        && !trimmed.contains(['*', '?', '[', ']', '{', '}', '\\', '!'])
        && trimmed
            .split('/')
            .all(|c| !c.is_empty() && c != "." && c != "..");
    plain.then(|| trimmed.as_bytes().to_vec())
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

    #[test]
    fn lists_skip_blank_lines_and_comments() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("list");
        std::fs::write(&f, b"# c\n/a/b\r\n\n/x/\xff\n").unwrap();
        let paths = read_paths(&f).unwrap();
        assert_eq!(paths.len(), 2);
        assert_eq!(paths[0], Path::new("/a/b"));
        assert!(read_patterns(&f).is_err());
        assert!(read_lines(&dir.path().join("missing")).is_err());
    }
}
