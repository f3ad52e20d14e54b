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
    /// The include patterns as given.
    patterns: Vec<String>,
    /// For each glob of `include`, the pattern it comes from.
    include_of: Vec<usize>,
    /// The backed-up paths relative patterns are taken relative to
    /// ([`Selection::for_backup`]).
    roots: Option<Vec<String>>,
    /// Exact catalog paths, as bytes ([`Selection::of_byte_paths`]): when
    /// there are some, they are the include patterns.
    exact: Vec<Vec<u8>>,
}

impl Selection {
    /// A selection of the paths matching (or inside a directory matching)
    /// one of `include` (every path when empty) and none of `exclude`.
    /// Patterns are globs over paths as listed (`home/ann/*.txt`; a
    /// leading `/` is ignored); one without `/` matches a name at any depth.
    pub fn new(include: &[String], exclude: &[String]) -> Result<Self> {
        Self::build(include, exclude, None)
    }

    /// [`Selection::new`] for a restore of a backup of `roots` (its
    /// backed-up paths, absolute): a pattern starting with `/` is an
    /// absolute path; one with a `/` elsewhere (or starting with `./`) is
    /// taken relative to each backed-up path (`etc/hostname` with `/srv/x`
    /// backed up: `/srv/x/etc/hostname`); one without `/` matches a name at
    /// any depth.
    pub fn for_backup(include: &[String], exclude: &[String], roots: &[String]) -> Result<Self> {
        Self::build(include, exclude, Some(roots))
    }

    fn build(include: &[String], exclude: &[String], roots: Option<&[String]>) -> Result<Self> {
        let globs = |patterns: &[String]| -> Vec<(usize, String, bool)> {
            let mut out = Vec::new();
            for (i, p) in patterns.iter().enumerate() {
                for (g, anchored) in expand(p, roots) {
                    out.push((i, g, anchored));
                }
            }
            out
        };
        let inc = globs(include);
        let literal = match inc.as_slice() {
            [(_, g, true)] => literal_path(g),
            _ => None,
        };
        Ok(Selection {
            include: set(&inc)?,
            exclude: set(&globs(exclude))?,
            literal,
            patterns: include.to_vec(),
            include_of: inc.iter().map(|(i, _, _)| *i).collect(),
            roots: roots.map(<[String]>::to_vec),
            exact: Vec::new(),
        })
    }

    /// A selection of exactly `paths` (as `ls` shows them, `/home/ann/a.txt`)
    /// and what is below each: no pattern syntax (`*`, `?`, `[` are plain
    /// characters), every path anchored at the root. What a caller that
    /// picked entries (the web interface) restores.
    pub fn of_paths(paths: &[String]) -> Result<Self> {
        let inc: Vec<(usize, String, bool)> = paths
            .iter()
            .enumerate()
            .map(|(i, p)| (i, escape(p.trim_matches('/')), true))
            .collect();
        let literal = match inc.as_slice() {
            [(_, g, true)] => literal_path(g),
            _ => None,
        };
        Ok(Selection {
            include: set(&inc)?,
            exclude: None,
            literal,
            patterns: paths.to_vec(),
            include_of: (0..inc.len()).collect(),
            roots: None,
            exact: Vec::new(),
        })
    }

    /// A selection of exactly `paths` (catalog form, bytes: `home/ann/a.txt`,
    /// any bytes but NUL, names that are not UTF-8 included) and what is
    /// below each, compared byte for byte: what the web interface restores.
    /// A path with an empty, `.` or `..` component selects nothing.
    pub fn of_byte_paths(paths: &[Vec<u8>]) -> Self {
        let exact: Vec<Vec<u8>> = paths
            .iter()
            .map(|p| {
                let start = p.iter().position(|&b| b != b'/').unwrap_or(p.len());
                let end = p.iter().rposition(|&b| b != b'/').map_or(start, |e| e + 1);
                p[start..end.max(start)].to_vec()
            })
            .collect();
        let literal = match exact.as_slice() {
            [p] if p
                .split(|&b| b == b'/')
                .all(|c| !c.is_empty() && c != b"." && c != b"..") =>
            {
                Some(p.clone())
            }
            _ => None,
        };
        Selection {
            literal,
            patterns: exact
                .iter()
                .map(|p| format!("/{}", String::from_utf8_lossy(p)))
                .collect(),
            exact,
            ..Selection::default()
        }
    }

    /// The catalog path below which every selected path lies, when the
    /// selection is one include pattern naming a path without wildcards
    /// (`home/ann/a.txt`: it and what is below it).
    pub fn literal(&self) -> Option<Vec<u8>> {
        self.literal.clone()
    }

    /// Whether the selection has include patterns (else it takes everything).
    pub fn has_include(&self) -> bool {
        self.include.is_some() || !self.exact.is_empty()
    }

    /// The number of include patterns.
    pub fn patterns(&self) -> usize {
        self.patterns.len()
    }

    /// Marks in `hits` (by include pattern) the patterns matching `path` itself.
    pub fn hits(&self, path: &[u8], hits: &mut [bool]) {
        for (p, h) in self.exact.iter().zip(hits.iter_mut()) {
            *h |= p == path;
        }
        if let Some(set) = &self.include {
            for g in set.matches(relative_path(path)) {
                if let Some(h) = self.include_of.get(g).and_then(|&i| hits.get_mut(i)) {
                    *h = true;
                }
            }
        }
    }

    /// The include patterns not marked in `hits`.
    pub fn unmatched(&self, hits: &[bool]) -> Vec<&str> {
        self.patterns
            .iter()
            .zip(hits)
            .filter(|(_, &h)| !h)
            .map(|(p, _)| p.as_str())
            .collect()
    }

    /// How pattern `p` was read, when it was taken relative to the
    /// backed-up paths (for an error saying it matches nothing).
    pub fn hint(&self, p: &str) -> String {
        match &self.roots {
            Some(roots) if relative(p) => format!(
                " (a relative pattern is taken relative to each backed-up path: {}; start it with / for an absolute path)",
                roots.join(", ")
            ),
            _ => String::new(),
        }
    }

    /// Whether `path` itself matches an include pattern and no exclude
    /// pattern (its parents are not considered): what `find` looks for.
    pub fn matches_path(&self, path: &[u8]) -> bool {
        let hit = |set: &GlobSet| set.is_match(relative_path(path));
        let included = match self.exact.is_empty() {
            true => self.include.as_ref().is_none_or(hit),
            false => self.exact.iter().any(|p| p == path),
        };
        included && !self.exclude.as_ref().is_some_and(hit)
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
        let below = |p: &Vec<u8>| {
            path.starts_with(p) && (path.len() == p.len() || path.get(p.len()) == Some(&b'/'))
        };
        let included = match self.exact.is_empty() {
            true => self.include.as_ref().is_none_or(hit),
            false => self.exact.iter().any(below),
        };
        included && !self.exclude.as_ref().is_some_and(hit)
    }
}

/// Whether pattern `p` is relative: with a `/`, but not at its start (or starting with `./`).
fn relative(p: &str) -> bool {
    let p = p.trim_end_matches('/');
    p.starts_with("./") || !p.starts_with('/') && p.contains('/')
}

/// The globs of pattern `p` over catalog paths, each with whether it is
/// anchored (else it matches a name at any depth): relative to each of
/// `roots` when given and `p` is [`relative`].
fn expand(p: &str, roots: Option<&[String]>) -> Vec<(String, bool)> {
    let trimmed = p.trim_end_matches('/');
    match roots {
        Some(roots) if relative(p) => {
            let rel = trimmed.trim_start_matches("./");
            roots
                .iter()
                .map(|r| match r.trim_matches('/') {
                    "" => (rel.to_string(), true),
                    r => (format!("{r}/{rel}"), true),
                })
                .collect()
        }
        _ => {
            let t = trimmed.trim_start_matches('/');
            vec![(t.to_string(), t.contains('/'))]
        }
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

/// `path` as a glob that matches it alone: each glob character in a class
/// of its own, a backslash escaped.
fn escape(path: &str) -> String {
    let mut out = String::with_capacity(path.len());
    for c in path.chars() {
        match c {
            '?' | '*' | '[' | ']' | '{' | '}' => {
                out.push('[');
                out.push(c);
                out.push(']');
            }
            '\\' => out.push_str("\\\\"),
            c => out.push(c),
        }
    }
    out
}

/// The catalog path glob `g` (anchored) matches exactly, if it is one:
/// no glob syntax, and no empty, `.` or `..` component.
fn literal_path(g: &str) -> Option<Vec<u8>> {
    let plain = !g.contains(['*', '?', '[', ']', '{', '}', '\\', '!'])
        && g.split('/').all(|c| !c.is_empty() && c != "." && c != "..");
    plain.then(|| g.as_bytes().to_vec())
}

/// The set of `globs` (pattern number, glob, anchored); a glob not
/// anchored matches a name at any depth.
fn set(globs: &[(usize, String, bool)]) -> Result<Option<GlobSet>> {
    if globs.is_empty() {
        return Ok(None);
    }
    let mut b = GlobSetBuilder::new();
    for (_, g, anchored) in globs {
        let pattern = match anchored {
            true => g.clone(),
            false => format!("**/{g}"),
        };
        let glob =
            Glob::new(&pattern).map_err(|e| Error::InvalidConfig(format!("pattern {g:?}: {e}")))?;
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
    fn relative_patterns_are_taken_relative_to_each_backed_up_path() {
        let roots = ["/srv/x".to_string(), "/home".to_string()];
        let s = Selection::for_backup(&["etc/hostname".into()], &[], &roots).unwrap();
        assert!(s.matches(b"srv/x/etc/hostname"));
        assert!(s.matches(b"home/etc/hostname"));
        assert!(!s.matches(b"etc/hostname"));
        assert_eq!(s.literal(), None);
        let one =
            Selection::for_backup(&["./etc/".into()], &["*.bak".into()], &roots[..1]).unwrap();
        assert_eq!(one.literal(), Some(b"srv/x/etc".to_vec()));
        assert!(one.matches(b"srv/x/etc/apt/sources.list"));
        assert!(!one.matches(b"srv/x/etc/a.bak"));
        let abs =
            Selection::for_backup(&["/srv/x/etc".into(), "hostname".into()], &[], &roots).unwrap();
        assert!(abs.matches(b"srv/x/etc/passwd"));
        assert!(abs.matches(b"home/ann/hostname"));
        let mut hits = vec![false; abs.patterns()];
        abs.hits(b"srv/x/etc", &mut hits);
        assert_eq!(abs.unmatched(&hits), ["hostname"]);
        assert!(abs.hint("hostname").is_empty());
        assert!(s.hint("etc/hostname").contains("/srv/x, /home"));
        // Under a backup of `/`, relative and absolute patterns agree.
        let slash = Selection::for_backup(&["etc/hostname".into()], &[], &["/".into()]).unwrap();
        assert_eq!(slash.literal(), Some(b"etc/hostname".to_vec()));
    }

    #[test]
    fn exact_paths_are_not_patterns() {
        let s =
            Selection::of_paths(&["/a/b*[1].txt".into(), "/top".into(), "/c\\d".into()]).unwrap();
        assert!(s.matches(b"a/b*[1].txt"));
        assert!(!s.matches(b"a/bx1.txt"));
        assert!(s.matches(b"top/x"));
        assert!(!s.matches(b"a/top"), "a name without / is still anchored");
        assert!(s.matches(b"c\\d"));
        assert!(!s.matches(b"cd"));
        let one = Selection::of_paths(&["/home/ann/".into()]).unwrap();
        assert_eq!(one.literal(), Some(b"home/ann".to_vec()));
        assert!(!Selection::of_paths(&[]).unwrap().has_include());
    }

    #[test]
    fn byte_paths_are_compared_byte_for_byte() {
        let s = Selection::of_byte_paths(&[b"/d/\xff*".to_vec(), b"top/".to_vec()]);
        assert!(s.has_include());
        assert!(s.matches(b"d/\xff*") && s.matches(b"d/\xff*/below"));
        assert!(!s.matches(b"d/\xffx") && !s.matches(b"d/\xff*x") && !s.matches(b"d"));
        assert!(s.matches(b"top") && s.matches(b"top/x") && !s.matches(b"a/top"));
        assert!(s.matches_path(b"top") && !s.matches_path(b"top/x"));
        let mut hits = [false, false];
        s.hits(b"top", &mut hits);
        assert_eq!(hits, [false, true]);
        assert_eq!(s.unmatched(&hits), ["/d/\u{fffd}*"]);
        let one = Selection::of_byte_paths(&[b"/x/\xfe".to_vec()]);
        assert_eq!(one.literal(), Some(b"x/\xfe".to_vec()));
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
