//! vGPUs whose frontend is a host or container process (`"attach": "process"`): the
//! socket handed over to the process's user, and a fresh worker for the next process
//! once one hangs up or its worker fails under it.
//!
//! A process vGPU's socket is handed over at a path that stays the same for the vGPU's
//! life: `attach/N/vgpu.sock`, bound afresh by vgpud for each new worker, which gets the
//! listening descriptor (the worker's own directory holds no vhost-user socket).
//! `attach/N/` holds nothing else; it belongs to vgpud's uid and the owner's group (0710;
//! 0711 when no group was given), and the socket to the owner's uid and group (0660), so
//! the owner reaches the socket and nothing else, and no worker reaches the directory. A container runtime bind-mounts `attach/N/` (the directory,
//! whose inode survives a worker's replacement) into the container (docs/hostile.md).

use std::sync::Arc;
use std::time::Duration;

use crate::api::VgpuState;
use crate::daemon::core::{Daemon, WORKER_START};
use crate::daemon::state::VgpuRec;

/// Whether vGPU `rec`'s worker ended with a process connected and no one asked it to
/// stop: its process hung up (a clean exit), or the worker failed under it (a crash, a
/// message it refused, a seccomp violation). Either way the vGPU holds its resources and a
/// fresh worker serves the next process on the same socket; the process that was
/// connected lost its connection and with it its device memory.
pub(in crate::daemon) fn next_process(rec: &VgpuRec) -> bool {
    rec.process().is_some()
        && !rec.stopping()
        && rec.migrating_to().is_none()
        && *rec.state() == VgpuState::Attached
}

/// Starts a fresh worker for process vGPU `id` (its last process hung up; the vGPU
/// held its resources meanwhile, state `starting`). If it cannot start, the vGPU
/// fails with the reason.
pub(in crate::daemon) async fn next_worker(d: &Arc<Daemon>, id: u32) {
    tracing::info!(
        vgpu = id,
        "its process hung up; starting a fresh worker for the next one"
    );
    // The fresh worker's counters and clock start at zero: the last one's counters are
    // kept and its samples go (again once the fresh one is ready: an answer of the last
    // one to a stats query may come in meanwhile; its final report is told apart).
    d.state.with(|i| {
        if let Some(rec) = i.vgpus.get_mut(&id) {
            rec.retire_worker();
        }
    });
    let result = super::start_worker(d, id).await;
    if result.is_ok() {
        d.state.with(|i| {
            if let Some(rec) = i.vgpus.get_mut(&id) {
                rec.drop_samples();
            }
        });
    }
    if let Err(e) = result {
        d.state.with(|i| {
            if let Some(rec) = i.vgpus.get_mut(&id) {
                if *rec.state() == VgpuState::Starting && rec.worker().is_none() {
                    rec.fail(format!(
                        "no fresh worker after its process hung up: {}",
                        e.error
                    ));
                }
            }
        });
        tracing::warn!(vgpu = id, error = %e.error, "no fresh worker for the process vGPU");
    }
    d.persist.mark_dirty();
    d.state.notify();
}

/// Waits while process vGPU `id` is between two workers (its old one gone, its fresh
/// one starting), so that a delete finds the fresh one.
pub(in crate::daemon) async fn await_next_worker(d: &Daemon, id: u32) {
    let between = |i: &crate::daemon::state::Inner| {
        i.vgpus.get(&id).is_some_and(|r| {
            r.process().is_some() && *r.state() == VgpuState::Starting && r.worker().is_none()
        })
    };
    if d.state.with(|i| between(i)) {
        let limit = WORKER_START + Duration::from_secs(2);
        d.state.wait_until(limit, |i| !between(i)).await;
    }
}
