//! The state file writer: the daemon's records saved to its state file after every change
//! that alters it (the format and the atomic write are in `statefile.rs`; bringing the
//! records back at start is `restore.rs`).
//!
//! Saves happen after every change that alters the file (create, PATCH, delete, a VM or
//! worker ending, a migration finishing), never on the grant or request path. API calls
//! that change it answer only once the change is on disk ([`Persistence::save`]); changes
//! that come from process events are saved by a background task
//! ([`Persistence::mark_dirty`], [`Persistence::run`]).

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use tokio::sync::Notify;

use super::procs::Proc;
use super::state::{Inner, State};
use super::statefile::{
    self, SavedProc, SavedStorage, SavedVgpu, SavedVgpuState, SavedVm, SavedVmState, StateFile,
};
use crate::api::{self, VgpuState, VmState};

/// The writer's state: one save at a time, each of the state as it is then.
#[derive(Debug, Default)]
struct Writer {
    /// Set once a graceful stop wrote its final state: later changes are the stop's own.
    frozen: bool,
    /// The last save failed (logged once until one succeeds).
    failing: bool,
    /// Every save ticket up to this one is covered by a finished write.
    saved_through: u64,
    /// That write's error, if it failed.
    last_error: Option<String>,
}

/// The state file and its writer.
#[derive(Debug)]
pub(super) struct Persistence {
    path: PathBuf,
    /// Taken before the state lock (lock rank 1 in `locks.rs`).
    writer: tokio::sync::Mutex<Writer>,
    /// Wakes the background saver.
    kick: Notify,
    /// Save tickets handed out (group commit: see [`Persistence::save`]).
    tickets: AtomicU64,
}

impl Persistence {
    /// The writer of the state file at `path`.
    pub(super) fn new(path: PathBuf) -> Self {
        Self {
            path,
            writer: tokio::sync::Mutex::new(Writer::default()),
            kick: Notify::new(),
            tickets: AtomicU64::new(0),
        }
    }

    /// The state file's path.
    pub(super) fn path(&self) -> &std::path::Path {
        &self.path
    }

    /// Asks the background saver to write the state soon (for changes that come from
    /// process events, in synchronous code).
    pub(super) fn mark_dirty(&self) {
        self.kick.notify_one();
    }

    /// Writes `state` now and returns once it is on disk. A failed write is logged and
    /// returned (the API answers the change with an error saying it is not saved; the
    /// next successful save includes it). Group commit: each caller takes a ticket after
    /// its change is in the state; a write covers every ticket taken before its snapshot,
    /// so callers arriving while a write is under way share the next one (64 VMs created
    /// at once cost a few writes, not 64 file and directory syncs one after another).
    pub(super) async fn save(&self, state: &State) -> Result<(), String> {
        let ticket = self.tickets.fetch_add(1, Ordering::AcqRel) + 1;
        let mut writer = self.writer.lock().await;
        if writer.frozen {
            return Ok(());
        }
        if writer.saved_through >= ticket {
            return writer.last_error.clone().map_or(Ok(()), Err);
        }
        // Every ticket up to `covers` was taken after its change: the snapshot has them.
        let covers = self.tickets.load(Ordering::Acquire);
        let snap = state.with(|inner| snapshot_of(inner, false));
        let r = self.write(&mut writer, snap).await;
        writer.saved_through = covers;
        writer.last_error = r.clone().err();
        r
    }

    /// The final save of a graceful stop: the state with every running vmm and worker,
    /// which stay running for the next vgpud to adopt; nothing is saved after it.
    pub(super) async fn save_final(&self, state: &State) {
        let mut writer = self.writer.lock().await;
        if writer.frozen {
            return;
        }
        let snap = state.with(|inner| snapshot_of(inner, false));
        // Logged inside; a stopping daemon has nobody to tell.
        let _ = self.write(&mut writer, snap).await;
        writer.frozen = true;
    }

    /// Saves `state` whenever something marked it dirty, for the daemon's life.
    pub(super) async fn run(&self, state: &State) {
        loop {
            self.kick.notified().await;
            // Logged inside; process events have no caller to answer.
            let _ = self.save(state).await;
        }
    }

    async fn write(&self, writer: &mut Writer, snap: StateFile) -> Result<(), String> {
        let path = self.path.clone();
        let p = path.clone();
        let r = tokio::task::spawn_blocking(move || statefile::save(&p, &snap))
            .await
            .unwrap_or_else(|e| {
                Err(statefile::StateError::Write {
                    path: path.clone(),
                    source: std::io::Error::other(e.to_string()),
                })
            });
        match r {
            Ok(()) => {
                if writer.failing {
                    tracing::info!(path = %path.display(), "state file saved again");
                }
                writer.failing = false;
                Ok(())
            }
            Err(e) => {
                if !writer.failing {
                    tracing::error!("{e}");
                }
                writer.failing = true;
                Err(e.to_string())
            }
        }
    }
}

pub(super) fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// What the state file holds for `inner`. `stopping`: the daemon stops gracefully, so
/// running VMs get their uptime until now.
pub(super) fn snapshot_of(inner: &Inner, stopping: bool) -> StateFile {
    let vgpus = inner
        .vgpus
        .values()
        // A free vGPU whose create has not answered yet is not the user's yet.
        .filter(|r| !(*r.state() == VgpuState::Starting && !r.owned() && !r.restore_failed()))
        .map(|r| SavedVgpu {
            id: r.id(),
            gpu: r.gpu(),
            memory_bytes: r.memory(),
            compute_permille: r.compute(),
            copy_permille: r.copy(),
            priority: r.priority(),
            oversubscribe: r.oversubscribe(),
            share_group: r.share_group().clone(),
            queues: r.queues(),
            storage: r
                .storage()
                .iter()
                .map(|s| SavedStorage {
                    namespace: s.namespace,
                    path: s.path.clone(),
                    read_only: s.read_only,
                })
                .collect(),
            owned_by_vm: r.owned(),
            vm: r.vm(),
            worker: r.worker().map(|w| saved_proc(&w.proc)),
            name: r.name().clone(),
            labels: r.labels().clone(),
            state: match r.state() {
                // Not restored at the last start: still a definition to bring back.
                _ if r.restore_failed() => SavedVgpuState::Live,
                VgpuState::Starting | VgpuState::Ready | VgpuState::Attached => {
                    SavedVgpuState::Live
                }
                // Being deleted: it does not come back.
                VgpuState::Released | VgpuState::Releasing => SavedVgpuState::Released,
                VgpuState::Failed { reason } => SavedVgpuState::Failed {
                    reason: reason.clone(),
                },
            },
            kernel_deadline_ms: r.kernel_deadline_ms(),
            attach: if r.process().is_some() {
                api::Attach::Process
            } else {
                api::Attach::Vm
            },
            owner_uid: r.process().as_ref().and_then(|p| p.owner_uid),
            owner_gid: r.process().as_ref().and_then(|p| p.owner_gid),
        })
        .collect();
    let vms = inner
        .vms
        .values()
        .map(|v| {
            let live = v.state().is_live();
            SavedVm {
                id: v.id(),
                payload: v.payload().display().to_string(),
                payload_arg: v.payload_arg().clone(),
                memory_bytes: v.memory(),
                vcpus: v.vcpus(),
                vgpu: v.vgpu(),
                state: match v.state() {
                    VmState::Starting | VmState::Running => SavedVmState::Live,
                    VmState::Exited { code } => SavedVmState::Exited { code: *code },
                    VmState::Failed { reason } => SavedVmState::Failed {
                        reason: reason.clone(),
                    },
                },
                launched_unix_ms: unix_ms(v.launched_at()),
                uptime_ms: (!live || stopping).then(|| v.uptime_ms()),
                vmm: v.proc().map(saved_proc),
                name: v.name().clone(),
                labels: v.labels().clone(),
            }
        })
        .collect();
    StateFile {
        version: statefile::VERSION,
        next_vgpu: inner.next_vgpu,
        next_vm: inner.next_vm,
        next_migration: inner.next_migration,
        vgpus,
        vms,
    }
}

fn saved_proc(p: &Proc) -> SavedProc {
    SavedProc {
        pid: p.pid,
        start_time: p.start_time,
    }
}
