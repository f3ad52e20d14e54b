//! What the index tests share: a repository of trace containers that
//! simulated backups fill (over the in-memory [`crate::backend::testing::Mem`]).

use crate::backend::Backend;
use crate::fingerprint::Fingerprint;
use crate::layout::container::{self, ContainerId};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// A repository of trace containers written by simulated backups (each
/// test module drives its indexes through it with its own `impl Sim`).
pub(crate) struct Sim {
    pub backend: Arc<dyn Backend>,
    /// Written containers and the fingerprints they hold.
    pub containers: BTreeMap<ContainerId, BTreeSet<Fingerprint>>,
    /// The next container id.
    pub next: ContainerId,
    /// Unique chunks a container takes.
    pub per_container: usize,
    /// Length of every chunk.
    pub chunk_len: u32,
}

impl Sim {
    pub fn new(backend: Arc<dyn Backend>, per_container: usize, chunk_len: u32) -> Sim {
        Sim {
            backend,
            containers: BTreeMap::new(),
            next: 1,
            per_container,
            chunk_len,
        }
    }

    /// The written containers' ids.
    pub fn ids(&self) -> Vec<ContainerId> {
        self.containers.keys().copied().collect()
    }

    /// Writes trace container `id` holding `fps`.
    pub fn write(&mut self, id: ContainerId, fps: &[Fingerprint]) {
        let mut b = container::Builder::without_data(id, 1 << 30);
        for f in fps {
            b.push_len(*f, self.chunk_len);
        }
        self.backend.write(&container::key(id), &b.seal()).unwrap();
        self.containers.insert(id, fps.iter().copied().collect());
    }

    /// Starts filling containers for one backup.
    pub fn filling(&self) -> Filling {
        Filling {
            open: Vec::new(),
            open_id: self.next,
            closed: BTreeMap::new(),
            per_container: self.per_container,
        }
    }

    /// Whether container `cid` holds `fp`: written before, or by `backup`.
    pub fn holds(&self, backup: &Filling, cid: ContainerId, fp: &Fingerprint) -> bool {
        self.containers.get(&cid).is_some_and(|s| s.contains(fp))
            || backup.closed.get(&cid).is_some_and(|v| v.contains(fp))
            || (cid == backup.open_id && backup.open.contains(fp))
    }

    /// Writes the containers `backup` filled.
    pub fn finish(&mut self, mut backup: Filling) {
        if !backup.open.is_empty() {
            backup.closed.insert(backup.open_id, backup.open);
            backup.open_id += 1;
        }
        for (id, fps) in backup.closed {
            self.write(id, &fps);
        }
        self.next = backup.open_id;
    }
}

/// The containers one simulated backup fills with its unique chunks, as the
/// pipeline does: `per_container` chunks each, in order.
pub(crate) struct Filling {
    open: Vec<Fingerprint>,
    open_id: ContainerId,
    closed: BTreeMap<ContainerId, Vec<Fingerprint>>,
    per_container: usize,
}

impl Filling {
    /// Stores a unique chunk; returns its container.
    pub fn place(&mut self, fp: Fingerprint) -> ContainerId {
        if self.open.len() == self.per_container {
            self.closed
                .insert(self.open_id, std::mem::take(&mut self.open));
            self.open_id += 1;
        }
        self.open.push(fp);
        self.open_id
    }
}
