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

pub(super) use incoming::{abort_incoming, commit_incoming, incoming_vm};
pub(super) use outgoing::migrate_vm_to_host;

pub(super) use super::host_registry::{IncomingVmm, IncomingWorker};
use super::state::Inner;
use crate::api;

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
