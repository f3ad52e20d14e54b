//! Repository configuration, fixed at `init` and stored as the `config` object.

use crate::chunker::ChunkerParams;
use crate::envelope;
use crate::error::{Error, Result};
use crate::fingerprint::FingerprintAlgo;
use serde::{Deserialize, Serialize};

/// Key of the configuration object.
pub const CONFIG_KEY: &str = "config";
/// Envelope kind of the configuration object.
const KIND: &[u8; 4] = b"CONF";
/// Repository format version this build reads and writes.
pub const FORMAT_VERSION: u32 = 1;

/// Default container capacity: 4 MiB.
pub const DEFAULT_CONTAINER_SIZE: u32 = 4 * 1024 * 1024;

/// Which deduplication index a repository uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum IndexKind {
    /// Every fingerprint in memory (persisted as one snapshot object).
    Exact,
}

/// The configuration of a repository.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Config {
    /// Repository format version.
    pub version: u32,
    /// Random repository id (hex), to tell repositories apart.
    pub id: String,
    /// Chunking algorithm and sizes.
    pub chunker: ChunkerParams,
    /// Fingerprint hash.
    pub fingerprint: FingerprintAlgo,
    /// Container capacity in bytes (metadata and data sections together).
    pub container_size: u32,
    /// Deduplication index policy.
    pub index: IndexKind,
    /// A trace repository: backups are fingerprint traces, containers hold
    /// metadata only (for experiments at scales beyond the machine's disk).
    #[serde(default)]
    pub trace: bool,
}

impl Config {
    /// The default configuration with a fresh id.
    pub fn new(id: String) -> Self {
        Config {
            version: FORMAT_VERSION,
            id,
            chunker: ChunkerParams::default(),
            fingerprint: FingerprintAlgo::Blake3,
            container_size: DEFAULT_CONTAINER_SIZE,
            index: IndexKind::Exact,
            trace: false,
        }
    }

    /// Checks that the parameters fit together.
    pub fn validate(&self) -> Result<()> {
        self.chunker.validate()?;
        let one_chunk = crate::container::HEADER_LEN
            + crate::container::META_ENTRY_LEN
            + self.chunker.max_size as usize;
        if (self.container_size as usize) < one_chunk {
            return Err(Error::InvalidConfig(format!(
                "container size {} cannot hold a maximum-size chunk ({} bytes with metadata)",
                self.container_size, one_chunk
            )));
        }
        if self.container_size > 1 << 30 {
            return Err(Error::InvalidConfig(format!(
                "container size {} exceeds 1 GiB",
                self.container_size
            )));
        }
        Ok(())
    }

    /// The configuration as a sealed object.
    pub fn encode(&self) -> Vec<u8> {
        // Serialising a struct of plain fields to JSON cannot fail.
        let json = serde_json::to_vec_pretty(self).unwrap_or_default();
        envelope::seal(KIND, FORMAT_VERSION, &json)
    }

    /// Parses and validates a sealed configuration object.
    pub fn decode(bytes: &[u8]) -> Result<Self> {
        let payload = envelope::open(CONFIG_KEY, KIND, FORMAT_VERSION, bytes)?;
        let config: Config = serde_json::from_slice(payload)
            .map_err(|e| Error::corrupt(CONFIG_KEY, format!("invalid JSON: {e}")))?;
        if config.version != FORMAT_VERSION {
            return Err(Error::UnsupportedVersion {
                object: CONFIG_KEY.into(),
                found: config.version,
                supported: FORMAT_VERSION,
            });
        }
        config.validate()?;
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let c = Config::new("abc".into());
        assert_eq!(Config::decode(&c.encode()).unwrap(), c);
    }

    #[test]
    fn rejects_future_versions() {
        let mut c = Config::new("abc".into());
        c.version = 99;
        let json = serde_json::to_vec(&c).unwrap();
        let sealed = envelope::seal(KIND, FORMAT_VERSION, &json);
        assert!(matches!(
            Config::decode(&sealed),
            Err(Error::UnsupportedVersion { found: 99, .. })
        ));
        let sealed = envelope::seal(KIND, 7, &json);
        assert!(matches!(
            Config::decode(&sealed),
            Err(Error::UnsupportedVersion { found: 7, .. })
        ));
    }

    #[test]
    fn rejects_containers_too_small_for_a_chunk() {
        let mut c = Config::new("abc".into());
        c.container_size = 1000;
        assert!(matches!(c.validate(), Err(Error::InvalidConfig(_))));
    }
}
