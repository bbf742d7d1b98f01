//! A VM's record: its lifecycle is private here and changes through the transitions
//! below; what defines it is read through getters.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use super::super::procs::Proc;
use super::super::statefile::{SavedVm, SavedVmState};
use crate::api::{self, VmState};

/// One VM.
pub(in crate::daemon) struct VmRec {
    id: u32,
    payload: PathBuf,
    payload_arg: String,
    memory: u64,
    vcpus: u8,
    vgpu: Option<u32>,
    /// Where it is in its lifecycle: changed only by the transitions below.
    state: VmState,
    proc: Option<Proc>,
    console: PathBuf,
    started: Instant,
    ended: Option<Instant>,
    /// Wall-clock launch time (saved in the state file).
    launched: SystemTime,
    /// A record restored from the state file: how long it ran.
    restored_uptime: Option<u64>,
    /// Its name, unique among live VMs.
    name: Option<String>,
    labels: BTreeMap<String, String>,
}

/// What defines a VM when it is launched.
pub(in crate::daemon) struct VmDef {
    pub(in crate::daemon) id: u32,
    pub(in crate::daemon) payload: PathBuf,
    pub(in crate::daemon) payload_arg: String,
    pub(in crate::daemon) memory: u64,
    pub(in crate::daemon) vcpus: u8,
    pub(in crate::daemon) vgpu: Option<u32>,
    pub(in crate::daemon) console: PathBuf,
    pub(in crate::daemon) name: Option<String>,
    pub(in crate::daemon) labels: BTreeMap<String, String>,
}

/// VM lifecycle transitions: the only places a VM's state changes.
impl VmRec {
    /// A VM being launched: starting until its vmm runs (and its vGPU is connected).
    pub(in crate::daemon) fn launched(d: VmDef) -> Self {
        Self {
            id: d.id,
            payload: d.payload,
            payload_arg: d.payload_arg,
            memory: d.memory,
            vcpus: d.vcpus,
            vgpu: d.vgpu,
            state: VmState::Starting,
            proc: None,
            console: d.console,
            started: Instant::now(),
            ended: None,
            launched: SystemTime::now(),
            restored_uptime: None,
            name: d.name,
            labels: d.labels,
        }
    }

    /// A VM read back from the state file (`console`: where its console is written):
    /// running with its adopted vmm `proc`, else as it ended (`lost`: why a VM that was
    /// running ended while no vgpud ran). `now_unix`: ms since the epoch.
    pub(in crate::daemon) fn restored(
        v: SavedVm,
        console: PathBuf,
        now_unix: u64,
        proc: Option<Proc>,
        lost: String,
    ) -> Self {
        let now = Instant::now();
        let ran_for = Duration::from_millis(now_unix.saturating_sub(v.launched_unix_ms));
        let (state, uptime) = match (v.state, &proc) {
            (SavedVmState::Live, Some(_)) => (VmState::Running, None),
            (SavedVmState::Live, None) => (
                VmState::Failed { reason: lost },
                Some(
                    v.uptime_ms
                        .unwrap_or_else(|| now_unix.saturating_sub(v.launched_unix_ms)),
                ),
            ),
            (SavedVmState::Exited { code }, _) => {
                (VmState::Exited { code }, Some(v.uptime_ms.unwrap_or(0)))
            }
            (SavedVmState::Failed { reason }, _) => {
                (VmState::Failed { reason }, Some(v.uptime_ms.unwrap_or(0)))
            }
        };
        let running = proc.is_some() && uptime.is_none();
        Self {
            id: v.id,
            payload: PathBuf::from(v.payload),
            payload_arg: v.payload_arg,
            memory: v.memory_bytes,
            vcpus: v.vcpus,
            vgpu: v.vgpu,
            state,
            proc: proc.filter(|_| running),
            console,
            started: if running {
                now.checked_sub(ran_for).unwrap_or(now)
            } else {
                now
            },
            ended: (!running).then_some(now),
            launched: UNIX_EPOCH + Duration::from_millis(v.launched_unix_ms),
            restored_uptime: uptime,
            name: v.name,
            labels: v.labels,
        }
    }

    // What defines it, read by the operations.
    getters! {
        copy {
            id: u32,
            memory: u64,
            vcpus: u8,
            vgpu: Option<u32>,
            launched_at = launched: SystemTime
        }
        by_ref {
            payload: PathBuf,
            payload_arg: String,
            console: PathBuf,
            name: Option<String>,
            labels: BTreeMap<String, String>
        }
    }

    pub(in crate::daemon) fn state(&self) -> &VmState {
        &self.state
    }

    /// Its running vmm.
    pub(in crate::daemon) fn proc(&self) -> Option<&Proc> {
        self.proc.as_ref()
    }

    /// It moved here from another host after running `ms`: its uptime continues that.
    pub(in crate::daemon) fn continue_uptime(&mut self, ms: u64) {
        if let Some(t) = Instant::now().checked_sub(Duration::from_millis(ms)) {
            self.started = t;
        }
    }

    /// Its vGPU is gone.
    pub(in crate::daemon) fn forget_vgpu(&mut self) {
        self.vgpu = None;
    }

    /// Its vmm `proc` started.
    pub(in crate::daemon) fn vmm_started(&mut self, proc: Proc) {
        self.proc = Some(proc);
    }

    /// Its vmm is gone: it ended now.
    pub(in crate::daemon) fn vmm_gone(&mut self) {
        self.proc = None;
        self.ended = Some(Instant::now());
    }

    /// Its vmm runs and its vGPU (if any) is connected.
    pub(in crate::daemon) fn mark_running(&mut self) {
        self.state = VmState::Running;
    }

    /// Its vmm exited with `code`.
    pub(in crate::daemon) fn mark_exited(&mut self, code: i32) {
        self.state = VmState::Exited { code };
    }

    /// It failed with `reason`.
    pub(in crate::daemon) fn fail(&mut self, reason: String) {
        self.state = VmState::Failed { reason };
    }
}

impl VmRec {
    pub(in crate::daemon) fn uptime_ms(&self) -> u64 {
        self.restored_uptime.unwrap_or_else(|| {
            let up = self.ended.unwrap_or_else(Instant::now) - self.started;
            u64::try_from(up.as_millis()).unwrap_or(u64::MAX)
        })
    }

    pub(in crate::daemon) fn view(&self) -> api::Vm {
        api::Vm {
            id: self.id,
            payload: self.payload.display().to_string(),
            payload_arg: self.payload_arg.clone(),
            memory_bytes: self.memory,
            vcpus: self.vcpus,
            vgpu: self.vgpu,
            state: self.state.clone(),
            pid: self.proc.as_ref().map(|p| p.pid),
            uptime_ms: self.uptime_ms(),
            name: self.name.clone(),
            labels: self.labels.clone(),
        }
    }
}
