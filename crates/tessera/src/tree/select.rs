//! Which catalog paths a restore or listing takes: `--include` and
//! `--exclude` glob patterns matched against a path and its parents.
