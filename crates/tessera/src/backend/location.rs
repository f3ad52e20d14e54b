//! Where a repository lives: a local directory or an S3 bucket, parsed
//! from the text a user gives (FORMAT.md §13.1).

use super::{Backend, Local, S3Options, S3};
use crate::error::{Error, Result};
use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

/// A repository location: a local path, or `s3:http[s]://HOST[:PORT]/BUCKET[/PREFIX]`
/// (also `s3:BUCKET[/PREFIX]`, with the endpoint from `AWS_ENDPOINT_URL`
/// or AWS's). Any text that looks like a URL (`scheme://…` or `s3:…`) is
/// a URL, never a local path: an unknown scheme is an error.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Location {
    /// A directory on a local file system.
    Local(PathBuf),
    /// A bucket (and key prefix) of an S3-compatible object store.
    S3(S3Location),
}

/// An S3 bucket and key prefix, and the endpoint serving it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct S3Location {
    /// `http://HOST[:PORT]` or `https://HOST[:PORT]` (`None`: from the environment).
    pub endpoint: Option<String>,
    /// The bucket.
    pub bucket: String,
    /// The key prefix below which the repository's objects live (no
    /// leading or trailing `/`; empty for the bucket's root).
    pub prefix: String,
    /// How the backend talks to the store (not part of the location's text).
    pub options: S3Options,
}

impl Location {
    /// The storage backend of this location (nothing is created or read yet).
    pub fn backend(&self) -> Result<Box<dyn Backend>> {
        Ok(match self {
            Location::Local(path) => Box::new(Local::new(path)),
            Location::S3(s3) => Box::new(S3::connect(s3)?),
        })
    }
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Location::Local(path) => write!(f, "{}", path.display()),
            Location::S3(s3) => write!(f, "{s3}"),
        }
    }
}

impl fmt::Display for S3Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "s3:")?;
        if let Some(endpoint) = &self.endpoint {
            write!(f, "{endpoint}/")?;
        }
        write!(f, "{}", self.bucket)?;
        if !self.prefix.is_empty() {
            write!(f, "/{}", self.prefix)?;
        }
        Ok(())
    }
}

/// Whether `text` starts like a URL: `scheme://` with a scheme of ASCII
/// letters, digits, `+`, `-` or `.` starting with a letter.
fn looks_like_url(text: &str) -> bool {
    match text.split_once("://") {
        Some((scheme, _)) => {
            scheme.starts_with(|c: char| c.is_ascii_alphabetic())
                && scheme
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c))
        }
        None => false,
    }
}

fn invalid(text: &str, why: &str) -> Error {
    Error::InvalidOption(format!(
        "repository location {text:?}: {why} (expected a local path, \
         s3:http://HOST:PORT/BUCKET/PREFIX, s3:https://HOST/BUCKET/PREFIX or s3:BUCKET/PREFIX)"
    ))
}

impl FromStr for Location {
    type Err = Error;

    fn from_str(text: &str) -> Result<Location> {
        if let Some(rest) = text.strip_prefix("s3:") {
            return parse_s3(text, rest).map(Location::S3);
        }
        if looks_like_url(text) {
            return Err(invalid(text, "unsupported URL scheme"));
        }
        if text.is_empty() {
            return Err(invalid(text, "empty"));
        }
        Ok(Location::Local(PathBuf::from(text)))
    }
}

/// Parses what follows `s3:` in `text`.
fn parse_s3(text: &str, rest: &str) -> Result<S3Location> {
    let (endpoint, path) = match rest.split_once("://") {
        Some((scheme @ ("http" | "https"), after)) => {
            let (host, path) = after.split_once('/').unwrap_or((after, ""));
            if host.is_empty() {
                return Err(invalid(text, "no host"));
            }
            (Some(format!("{scheme}://{host}")), path)
        }
        Some(_) => return Err(invalid(text, "the endpoint must be http:// or https://")),
        None => (None, rest),
    };
    let path = path.trim_matches('/');
    let (bucket, prefix) = path.split_once('/').unwrap_or((path, ""));
    if bucket.is_empty() {
        return Err(invalid(text, "no bucket"));
    }
    let prefix = prefix.trim_matches('/');
    if !prefix.is_empty() {
        super::check_key(prefix).map_err(|_| invalid(text, "invalid key prefix"))?;
    }
    Ok(S3Location {
        endpoint,
        bucket: bucket.to_string(),
        prefix: prefix.to_string(),
        options: S3Options::default(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s3(text: &str) -> S3Location {
        match text.parse::<Location>() {
            Ok(Location::S3(s)) => s,
            other => panic!("{text}: {other:?}"),
        }
    }

    #[test]
    fn s3_urls_parse_into_endpoint_bucket_and_prefix() {
        let l = s3("s3:http://127.0.0.1:7070/bucket/some/prefix/");
        assert_eq!(l.endpoint.as_deref(), Some("http://127.0.0.1:7070"));
        assert_eq!(
            (l.bucket.as_str(), l.prefix.as_str()),
            ("bucket", "some/prefix")
        );
        assert_eq!(l.to_string(), "s3:http://127.0.0.1:7070/bucket/some/prefix");
        let l = s3("s3:https://s3.example.com/b");
        assert_eq!((l.bucket.as_str(), l.prefix.as_str()), ("b", ""));
        let l = s3("s3:b/p");
        assert_eq!(l.endpoint, None);
        assert_eq!(l.to_string(), "s3:b/p");
    }

    #[test]
    fn urls_are_never_local_paths() {
        for bad in [
            "s3:",
            "s3:http://",
            "s3:http://host",
            "s3:ftp://host/b",
            "s3:http://host/b/../x",
            "http://host/bucket",
            "sftp://host/dir",
            "",
        ] {
            assert!(bad.parse::<Location>().is_err(), "{bad:?} accepted");
        }
        assert_eq!(
            "dir/with:colon".parse::<Location>().unwrap(),
            Location::Local(PathBuf::from("dir/with:colon"))
        );
        assert_eq!(
            "./s3:x".parse::<Location>().unwrap(),
            Location::Local(PathBuf::from("./s3:x"))
        );
    }
}
