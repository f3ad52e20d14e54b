//! Delta compression settings of a repository (fixed at `init`, stored in
//! its `config`): which policy, which features, which bases.

use super::features::FeatureKind;
use serde::{Deserialize, Serialize};

/// Which chunks a repository delta-compresses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DeltaKind {
    /// No delta compression.
    #[default]
    None,
    /// PFC-delta: chunks around persistent fragmented chunks, against bases
    /// prefetched with the index's container reads.
    Pfc,
    /// Every stored chunk against any similar stored chunk, bases read from storage.
    Greedy,
}

impl DeltaKind {
    /// The name used on the command line.
    pub fn name(self) -> &'static str {
        match self {
            DeltaKind::None => "none",
            DeltaKind::Pfc => "pfc",
            DeltaKind::Greedy => "greedy",
        }
    }
}

impl std::str::FromStr for DeltaKind {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "none" => Ok(DeltaKind::None),
            "pfc" => Ok(DeltaKind::Pfc),
            "greedy" => Ok(DeltaKind::Greedy),
            other => Err(format!(
                "unknown delta compression {other:?} (expected none, pfc or greedy)"
            )),
        }
    }
}

/// Which containers PFC-delta has the index read whole for their bases.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BasePrefetch {
    /// PFC-CID_last: containers of the last backup's persistent fragmented
    /// chunks (the paper's Algorithm 1).
    #[default]
    Pfc,
    /// FC-CID_last as well: containers of all the last backup's fragmented
    /// chunks (beyond the paper: more bases, more bytes transferred).
    Fc,
}

impl std::str::FromStr for BasePrefetch {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "pfc" => Ok(BasePrefetch::Pfc),
            "fc" => Ok(BasePrefetch::Fc),
            other => Err(format!(
                "unknown base prefetch set {other:?} (expected pfc or fc)"
            )),
        }
    }
}

/// Which cached chunks PFC-delta may use as bases.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BaseScope {
    /// Any whole chunk of the base chunk cache.
    #[default]
    Any,
    /// Only chunks of the last [`BASE_CONTAINERS`](super::BASE_CONTAINERS) distinct containers
    /// this backup's recipe referenced for a duplicate it keeps: a restore
    /// has just read those and keeps as many for bases, so bases cost it no
    /// extra read (the paper's premise, §III-A).
    Referenced,
}

impl std::str::FromStr for BaseScope {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "any" => Ok(BaseScope::Any),
            "referenced" => Ok(BaseScope::Referenced),
            other => Err(format!(
                "unknown base scope {other:?} (expected any or referenced)"
            )),
        }
    }
}

/// Default base chunk cache size, in containers (the paper's default).
pub const DEFAULT_BASE_CACHE_CONTAINERS: u32 = 16;

fn default_base_cache_containers() -> u32 {
    DEFAULT_BASE_CACHE_CONTAINERS
}

/// Delta compression settings of a repository.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct DeltaParams {
    /// The policy.
    pub kind: DeltaKind,
    /// Super-features that find similar chunks.
    pub features: FeatureKind,
    /// Containers the base chunk cache holds (greedy: base containers read).
    #[serde(default = "default_base_cache_containers")]
    pub base_cache_containers: u32,
    /// PFC-delta: the containers read whole for their bases.
    pub prefetch: BasePrefetch,
    /// PFC-delta: which cached chunks may be bases.
    pub scope: BaseScope,
}

impl Default for DeltaParams {
    fn default() -> Self {
        DeltaParams {
            kind: DeltaKind::None,
            features: FeatureKind::Odess,
            base_cache_containers: DEFAULT_BASE_CACHE_CONTAINERS,
            prefetch: BasePrefetch::Pfc,
            scope: BaseScope::Any,
        }
    }
}
