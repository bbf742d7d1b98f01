//! Whole-VM migration between two vgpud daemons (docs/migration.md, "Whole-VM migration
//! between hosts").
//!
//! The source (`outgoing.rs`) asks the destination to admit the VM
//! (`POST /v1/migrations/incoming`, with its bearer token over TCP); the destination
//! (`incoming.rs`) checks the VM's vGPU against its GPUs with its own admission rule
//! (409 with the reason, nothing moved), starts the vGPU's worker receiving its state
//! (`vgpu-worker --migrate-in`, the worker's fresh secret as the stream's one-time token)
//! and `vmm --migrate-from`, and answers where to send both streams. The source then
//! drives its worker (`migrate_out`, with the connected stream) and its vmm (`migrate`
//! over the vmm's API socket); the VM and its vGPU stop once, together (the worker
//! finishes the vGPU's state when the vmm stops the rings). When the vmm reports the VM
//! moved, the source hands the console over (`POST /v1/migrations/{id}/commit`) and frees
//! everything; on any failure before that the VM runs on at the source and the
//! destination frees what it reserved (`DELETE /v1/migrations/{id}`, or on its own when
//! its vmm ends before the commit).

mod incoming;
mod outgoing;

pub(super) use outgoing::vmm_api_socket;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Mutex;

use super::state::Inner;
use crate::api;

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
#[derive(Default)]
pub(crate) struct Registry {
    /// vGPU id -> the worker receiving its state.
    workers: Mutex<BTreeMap<u32, IncomingWorker>>,
    /// VM id -> the vmm receiving it.
    vmms: Mutex<BTreeMap<u32, IncomingVmm>>,
    /// VM id -> the console it had at its source (the console here continues it).
    consoles: Mutex<BTreeMap<u32, PathBuf>>,
    /// Incoming moves (migration id) the source committed or gave up.
    settled: Mutex<BTreeMap<u32, bool>>,
    /// vGPUs whose worker reported on its outgoing move since it was asked for it.
    reported: Mutex<BTreeSet<u32>>,
}

impl Registry {
    /// The `--migrate-in` address of vGPU `id`'s worker, when it receives a vGPU's state.
    pub(super) fn worker(&self, id: u32) -> Option<IncomingWorker> {
        vgpu_sync::lock(&self.workers).get(&id).cloned()
    }

    /// The `--migrate-from` address of VM `id`'s vmm, when it receives a VM.
    pub(super) fn vmm(&self, id: u32) -> Option<IncomingVmm> {
        vgpu_sync::lock(&self.vmms).get(&id).cloned()
    }

    /// The console VM `id` had at its source, if it moved here.
    pub(super) fn console_before(&self, id: u32) -> Option<PathBuf> {
        vgpu_sync::lock(&self.consoles).get(&id).cloned()
    }

    /// vGPU `id`'s worker reported on its outgoing move (it has taken it).
    pub(in crate::daemon) fn vgpu_reported(&self, id: u32) {
        vgpu_sync::lock(&self.reported).insert(id);
    }

    /// Whether vGPU `id`'s worker reported since [`Registry::forget_reported`].
    pub(super) fn reported(&self, id: u32) -> bool {
        vgpu_sync::lock(&self.reported).contains(&id)
    }

    /// Forgets vGPU `id`'s reports (a move of it starts).
    pub(super) fn forget_reported(&self, id: u32) {
        vgpu_sync::lock(&self.reported).remove(&id);
    }

    /// Forgets VM `id` (it is deleted).
    pub(super) fn forget_vm(&self, id: u32) {
        vgpu_sync::lock(&self.vmms).remove(&id);
        if let Some(p) = vgpu_sync::lock(&self.consoles).remove(&id) {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// Updates migration `mid`'s record.
fn update(inner: &mut Inner, mid: u32, f: impl FnOnce(&mut api::Migration)) {
    if let Some(m) = inner.migrations.get_mut(&mid) {
        f(m);
    }
}

/// A fresh record of a whole-VM move.
fn record(mid: u32, vgpu: u32, gpu: u32, host: api::HostMigration) -> api::Migration {
    api::Migration {
        id: mid,
        vgpu,
        source_gpu: gpu,
        target_gpu: gpu,
        mode: "precopy".into(),
        state: "running".into(),
        phase: "admitting".into(),
        rounds: 0,
        bytes: 0,
        total_bytes: 0,
        dirty_bytes: 0,
        downtime_ms: None,
        elapsed_ms: 0.0,
        error: None,
        timeline: Vec::new(),
        host: Some(host),
    }
}
