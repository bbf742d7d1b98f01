//! The whole-VM moves in flight, as the daemon owns them: the destination workers and vmms
//! receiving a VM, the consoles handed over, the moves settled. The moves themselves are
//! in `host_migration/`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use super::locks::{Rank, Ranked};

/// Where a destination worker receives its vGPU's state.
#[derive(Clone, Debug)]
pub(super) struct IncomingWorker {
    /// Its `--migrate-in` address.
    pub(super) address: String,
}

/// A VM this daemon receives.
#[derive(Clone, Debug)]
pub(super) struct IncomingVmm {
    /// Its `--migrate-from` address.
    pub(super) address: String,
    /// Its `--migrate-token-file`.
    pub(super) token_file: PathBuf,
}

/// The daemon's whole-VM moves in flight.
pub(crate) struct Registry {
    /// vGPU id -> the worker receiving its state.
    workers: Ranked<BTreeMap<u32, IncomingWorker>>,
    /// VM id -> the vmm receiving it.
    vmms: Ranked<BTreeMap<u32, IncomingVmm>>,
    /// VM id -> the console it had at its source (the console here continues it).
    consoles: Ranked<BTreeMap<u32, PathBuf>>,
    /// Incoming moves (migration id) the source committed or gave up.
    settled: Ranked<BTreeMap<u32, bool>>,
    /// vGPUs whose worker reported on its outgoing move since it was asked for it.
    reported: Ranked<BTreeSet<u32>>,
}

impl Default for Registry {
    fn default() -> Self {
        Self {
            workers: Ranked::with_default(Rank::HostMigration),
            vmms: Ranked::with_default(Rank::HostMigration),
            consoles: Ranked::with_default(Rank::HostMigration),
            settled: Ranked::with_default(Rank::HostMigration),
            reported: Ranked::with_default(Rank::HostMigration),
        }
    }
}

impl Registry {
    /// vGPU `id`'s worker receives its state at `w`.
    pub(super) fn receive_worker(&self, id: u32, w: IncomingWorker) {
        self.workers.lock().insert(id, w);
    }

    /// vGPU `id`'s receiving worker started (or did not).
    pub(super) fn worker_gone(&self, id: u32) {
        self.workers.lock().remove(&id);
    }

    /// VM `id`'s vmm receives it at `v`.
    pub(super) fn receive_vmm(&self, id: u32, v: IncomingVmm) {
        self.vmms.lock().insert(id, v);
    }

    /// VM `id`'s vmm no longer waits for its source.
    pub(super) fn vmm_gone(&self, id: u32) {
        self.vmms.lock().remove(&id);
    }

    /// Incoming move `mid` is settled: the source committed it, or gave it up.
    pub(super) fn settle(&self, mid: u32, committed: bool) {
        self.settled.lock().insert(mid, committed);
    }

    /// Whether incoming move `mid` is settled.
    pub(super) fn is_settled(&self, mid: u32) -> bool {
        self.settled.lock().contains_key(&mid)
    }

    /// VM `id` moved here; its console at the source was kept at `path`.
    pub(super) fn console_moved_here(&self, id: u32, path: PathBuf) {
        self.consoles.lock().insert(id, path);
    }

    /// The `--migrate-in` address of vGPU `id`'s worker, when it receives a vGPU's state.
    pub(super) fn worker(&self, id: u32) -> Option<IncomingWorker> {
        self.workers.lock().get(&id).cloned()
    }

    /// The `--migrate-from` address of VM `id`'s vmm, when it receives a VM.
    pub(super) fn vmm(&self, id: u32) -> Option<IncomingVmm> {
        self.vmms.lock().get(&id).cloned()
    }

    /// The console VM `id` had at its source, if it moved here.
    pub(super) fn console_before(&self, id: u32) -> Option<PathBuf> {
        self.consoles.lock().get(&id).cloned()
    }

    /// vGPU `id`'s worker reported on its outgoing move (it has taken it).
    pub(in crate::daemon) fn vgpu_reported(&self, id: u32) {
        self.reported.lock().insert(id);
    }

    /// Whether vGPU `id`'s worker reported since [`Registry::forget_reported`].
    pub(super) fn reported(&self, id: u32) -> bool {
        self.reported.lock().contains(&id)
    }

    /// Forgets vGPU `id`'s reports (a move of it starts).
    pub(super) fn forget_reported(&self, id: u32) {
        self.reported.lock().remove(&id);
    }

    /// Forgets VM `id` (it is deleted).
    pub(super) fn forget_vm(&self, id: u32) {
        self.vmms.lock().remove(&id);
        if let Some(p) = self.consoles.lock().remove(&id) {
            let _ = std::fs::remove_file(p);
        }
    }
}
