//! Repository verification: every object parses and its checksums hold,
//! every chunk of every recipe exists where the recipe says, every delta's
//! base is stored whole where its entry says, and with `read_data` every
//! stored chunk is re-hashed (deltas after decoding them against their base).

use crate::error::{Error, Result};
use crate::progress::{Progress, Silent};
use crate::repo::Repository;

pub mod last;
pub(crate) mod records;
pub(crate) mod report;
pub(crate) use records::index_problems;
pub use report::{CheckOptions, CheckReport, Problem, ProblemKind};

/// Checks `repo`.
pub fn check(repo: &Repository, options: CheckOptions) -> Result<CheckReport> {
    check_with_progress(repo, options, &Silent)
}

/// Checks `repo`, reporting progress to `progress`: containers (or, in
/// the lifecycle layout, objects), then backups.
pub fn check_with_progress(
    repo: &Repository,
    options: CheckOptions,
    progress: &dyn Progress,
) -> Result<CheckReport> {
    let mut report = crate::layout::check(repo, options, progress)?;
    report
        .warnings
        .extend(exposed_key_files(repo.backend().as_ref())?);
    if repo.config().dictionaries() {
        // Compression dictionaries (FORMAT.md §7.8): every entry naming a
        // damaged one is unreadable (the chunk checks name it too).
        let loaded = crate::format::dictionary::load_all(repo.backend().as_ref())?;
        for e in loaded.damaged {
            let object = match &e {
                Error::Corrupt { object, .. } => object.clone(),
                other => other.to_string(),
            };
            report
                .problems
                .push(Problem::damaged(object, &e, Vec::new()));
        }
    }
    Ok(report)
}

/// A warning for each key file users other than its owner can read: with
/// a copy, they can try passwords offline (files Tessera creates are
/// private; an older version's, or a copied repository's, may not be).
fn exposed_key_files(backend: &dyn crate::backend::Backend) -> Result<Vec<String>> {
    let mut warnings = Vec::new();
    for id in crate::crypto::keyfile::ids(backend)? {
        let key = crate::crypto::keyfile::key_path(&id);
        match backend.readable_by_others(&key) {
            Ok(true) => warnings.push(format!(
                "{key}: the key file can be read by other users, who could try passwords on a copy \
                 of it: make it private (`chmod 600 {}/{key}`)",
                backend.location()
            )),
            Ok(false) | Err(Error::NotFound(_)) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(warnings)
}
