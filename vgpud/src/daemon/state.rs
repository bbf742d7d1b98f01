//! The daemon's records (vGPUs, VMs, migrations) and the one lock that guards them.
//!
//! This module is the only place that takes the state lock: the operation modules read
//! and change the records through [`State::with`] (a closure run under the lock) and wait
//! for changes through [`State::wait_until`].
//!
//! A record's fields are private to this module (a VM's to `state/vm.rs`): the operation
//! modules read them through getters and change them only through the named transitions
//! here ([`VgpuRec::admitted`], [`VgpuRec::mark_ready`], [`VgpuRec::attach_to`],
//! [`VgpuRec::begin_release`], [`VgpuRec::end_worker`], [`VgpuRec::begin_migration`],
//! [`VgpuRec::apply_shares`], [`VmRec::launched`], [`VmRec::vmm_gone`], ...).
//!
//! The state lock's place in the daemon's lock order: see `locks.rs`.
//!
//! A closure passed to [`State::with`] never awaits and never takes the state lock again.

use std::collections::{BTreeMap, VecDeque};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use super::attach::ProcessAttach;
use super::link::Link;
use super::locks::{Rank, Ranked};
use super::procs::Proc;
use super::statefile::SavedVgpuState;
use crate::api::{self, VgpuState};
use crate::control::{MemReport, WorkerStats};
use crate::units::permille_to_fraction;

/// Getters of a record's fields: `copy { name: Type, .. }` by value, `by_ref { name:
/// Type, .. }` by reference; `copy { getter = field: Type }` names the getter apart.
macro_rules! getters {
    (copy { $($cg:ident $(= $cf:ident)?: $ct:ty),* $(,)? } by_ref { $($rf:ident: $rt:ty),* $(,)? }) => {
        $(getters!(@copy $cg $(= $cf)?: $ct);)*
        $(
            pub(in crate::daemon) fn $rf(&self) -> &$rt {
                &self.$rf
            }
        )*
    };
    (@copy $g:ident = $f:ident: $t:ty) => {
        pub(in crate::daemon) fn $g(&self) -> $t {
            self.$f
        }
    };
    (@copy $f:ident: $t:ty) => {
        pub(in crate::daemon) fn $f(&self) -> $t {
            self.$f
        }
    };
}

mod ask;
mod counters;
mod vm;

pub(super) use ask::VgpuAsk;
pub(super) use counters::Counters;
pub(super) use vm::{VmDef, VmRec};

/// A running worker: its process and its control channel.
pub(super) struct WorkerHandle {
    pub(super) proc: Proc,
    pub(super) link: Link,
}

/// One vGPU.
pub(super) struct VgpuRec {
    id: u32,
    gpu: u32,
    memory: u64,
    compute: u32,
    copy: u32,
    priority: i32,
    oversubscribe: bool,
    share_group: Option<String>,
    queues: u16,
    /// Storage namespaces, passed to the worker.
    storage: Vec<api::StorageAttachment>,
    /// Where it is in its lifecycle: changed only by the transitions below.
    state: VgpuState,
    vm: Option<u32>,
    owned: bool,
    socket: PathBuf,
    log: PathBuf,
    worker: Option<WorkerHandle>,
    /// We asked the worker to stop: its exit is not a failure.
    stopping: bool,
    samples: VecDeque<WorkerStats>,
    /// What its workers before the current one counted (a process vGPU's).
    earlier: counters::Earlier,
    /// An oversubscribed vGPU's latest memory report.
    memory_report: Option<MemReport>,
    /// A migration to this GPU is running (its shares are committed there too).
    migrating_to: Option<u32>,
    /// Restored from the state file but not running (it is still saved as a definition
    /// to bring back at the next start).
    restore_failed: bool,
    /// A share change on its way to the worker and the schedulers: until both applied
    /// it, the vGPU holds the larger of its current and its new shares on every GPU it
    /// counts on.
    pending: Option<Shares>,
    /// When it was first seen released (it is forgotten a retention time later).
    released_at: Option<Instant>,
    /// Its name, unique among live vGPUs.
    name: Option<String>,
    labels: BTreeMap<String, String>,
    /// Its own kernel deadline, ms (none: the daemon's).
    kernel_deadline_ms: Option<u32>,
    /// A process vGPU's hand-over (None: a VM's vGPU).
    process: Option<ProcessAttach>,
}

/// A vGPU's shares and priority (compute per-mille, copy per-mille, priority).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Shares {
    pub(super) compute: u32,
    pub(super) copy: u32,
    pub(super) priority: i32,
}

/// What defines a vGPU when it is admitted or restored: everything but its lifecycle and
/// its running worker.
pub(super) struct VgpuDef {
    pub(super) id: u32,
    pub(super) gpu: u32,
    pub(super) memory: u64,
    pub(super) compute: u32,
    pub(super) copy: u32,
    pub(super) priority: i32,
    pub(super) oversubscribe: bool,
    pub(super) share_group: Option<String>,
    pub(super) queues: u16,
    pub(super) storage: Vec<api::StorageAttachment>,
    pub(super) vm: Option<u32>,
    pub(super) owned: bool,
    pub(super) socket: PathBuf,
    pub(super) log: PathBuf,
    pub(super) name: Option<String>,
    pub(super) labels: BTreeMap<String, String>,
    pub(super) kernel_deadline_ms: Option<u32>,
    pub(super) process: Option<ProcessAttach>,
    pub(super) restore_failed: bool,
}

/// vGPU lifecycle transitions: the only places a vGPU's state changes
/// (docs/architecture.md, "Inside vgpud").
impl VgpuRec {
    fn from_def(d: VgpuDef, state: VgpuState) -> Self {
        Self {
            id: d.id,
            gpu: d.gpu,
            memory: d.memory,
            compute: d.compute,
            copy: d.copy,
            priority: d.priority,
            oversubscribe: d.oversubscribe,
            share_group: d.share_group,
            queues: d.queues,
            storage: d.storage,
            state,
            vm: d.vm,
            owned: d.owned,
            socket: d.socket,
            log: d.log,
            worker: None,
            stopping: false,
            samples: VecDeque::new(),
            earlier: counters::Earlier::default(),
            memory_report: None,
            migrating_to: None,
            restore_failed: d.restore_failed,
            pending: None,
            released_at: None,
            name: d.name,
            labels: d.labels,
            kernel_deadline_ms: d.kernel_deadline_ms,
            process: d.process,
        }
    }

    /// A newly admitted vGPU: starting until its worker is ready.
    pub(super) fn admitted(d: VgpuDef) -> Self {
        Self::from_def(d, VgpuState::Starting)
    }

    /// A vGPU read back from the state file. One to be brought back (`bring_back`) is
    /// held as failed until it is validated and admitted; a live one that is not came
    /// with a VM that ended with the old daemon, so it is released.
    pub(super) fn restored(d: VgpuDef, saved: SavedVgpuState, bring_back: bool) -> Self {
        let state = match saved {
            SavedVgpuState::Live if bring_back => VgpuState::Failed {
                reason: "being restored".into(),
            },
            SavedVgpuState::Live | SavedVgpuState::Released => VgpuState::Released,
            SavedVgpuState::Failed { reason } => VgpuState::Failed { reason },
        };
        Self::from_def(d, state)
    }

    // What defines it, read by the operations.
    getters! {
        copy {
            id: u32,
            gpu: u32,
            memory: u64,
            compute: u32,
            copy: u32,
            priority: i32,
            oversubscribe: bool,
            queues: u16,
            owned: bool,
            kernel_deadline_ms: Option<u32>,
            memory_report: Option<MemReport>
        }
        by_ref {
            share_group: Option<String>,
            storage: Vec<api::StorageAttachment>,
            socket: PathBuf,
            log: PathBuf,
            samples: VecDeque<WorkerStats>,
            name: Option<String>,
            labels: BTreeMap<String, String>,
            process: Option<ProcessAttach>
        }
    }

    pub(super) fn state(&self) -> &VgpuState {
        &self.state
    }

    /// The VM it serves (or served).
    pub(super) fn vm(&self) -> Option<u32> {
        self.vm
    }

    /// Its running worker.
    pub(super) fn worker(&self) -> Option<&WorkerHandle> {
        self.worker.as_ref()
    }

    /// Whether vgpud asked its worker to stop (its exit is then no failure).
    pub(super) fn stopping(&self) -> bool {
        self.stopping
    }

    /// The GPU a migration is moving it to.
    pub(super) fn migrating_to(&self) -> Option<u32> {
        self.migrating_to
    }

    /// The share change on its way, if any.
    pub(super) fn pending(&self) -> Option<Shares> {
        self.pending
    }

    /// Whether it was restored from the state file but does not run (yet).
    pub(super) fn restore_failed(&self) -> bool {
        self.restore_failed
    }

    /// Its worker `w` runs (started, adopted or taken from the pool).
    pub(super) fn worker_started(&mut self, w: WorkerHandle) {
        self.worker = Some(w);
    }

    /// Its worker is gone.
    pub(super) fn drop_worker(&mut self) {
        self.worker = None;
    }

    /// vgpud stops its worker: the exit that follows is no failure.
    pub(super) fn mark_stopping(&mut self) {
        self.stopping = true;
    }

    /// Restored but not running: it is saved as a definition to bring back.
    pub(super) fn mark_restore_failed(&mut self) {
        self.restore_failed = true;
    }

    /// Restored and running again.
    pub(super) fn clear_restore_failed(&mut self) {
        self.restore_failed = false;
    }

    /// A restored vGPU whose worker was adopted serves `vm` again (none: its VM's vmm
    /// was not adopted).
    pub(super) fn serve_restored_vm(&mut self, vm: Option<u32>) {
        self.vm = vm;
    }

    /// When it was first seen released (`now` if this is the first time).
    pub(super) fn released_since(&mut self, now: Instant) -> Instant {
        *self.released_at.get_or_insert(now)
    }

    /// It is not (or no longer) released and idle.
    pub(super) fn clear_released(&mut self) {
        self.released_at = None;
    }

    /// Starting again: a worker (re)starts for it.
    pub(super) fn mark_starting(&mut self) {
        self.state = VgpuState::Starting;
    }

    /// Its worker answered: it takes a VM or a process.
    pub(super) fn mark_ready(&mut self) {
        self.state = VgpuState::Ready;
    }

    /// Its VM or process is connected.
    pub(super) fn mark_attached(&mut self) {
        self.state = VgpuState::Attached;
    }

    /// VM `vm` takes it.
    pub(super) fn attach_to(&mut self, vm: u32) {
        self.vm = Some(vm);
        self.state = VgpuState::Attached;
    }

    /// Its VM let go of it: ready for another (a vGPU not attached stays as it is).
    pub(super) fn detach(&mut self) {
        self.vm = None;
        if self.state == VgpuState::Attached {
            self.state = VgpuState::Ready;
        }
    }

    /// It is being deleted: from now on it takes no change and no VM, and holds its
    /// resources until its worker is gone.
    pub(super) fn begin_release(&mut self) {
        self.stopping = true;
        if self.holds_resources() {
            self.state = VgpuState::Releasing;
        }
    }

    /// It cannot run: failed with `reason`.
    pub(super) fn fail(&mut self, reason: String) {
        self.state = VgpuState::Failed { reason };
    }

    /// A migration to GPU `target` begins: its shares are committed there too.
    pub(super) fn begin_migration(&mut self, target: u32) {
        self.migrating_to = Some(target);
    }

    /// Its migration ended: on GPU `landed` when it moved, where it was when not. It
    /// counts on that GPU only.
    pub(super) fn end_migration(&mut self, landed: Option<u32>) {
        self.migrating_to = None;
        if let Some(gpu) = landed {
            self.gpu = gpu;
        }
    }

    /// The worker and the schedulers took `new`: these are its shares now.
    pub(super) fn apply_shares(&mut self, new: Shares) {
        (self.compute, self.copy, self.priority) = (new.compute, new.copy, new.priority);
    }

    /// Its name, labels and own kernel deadline become those given (`None`: kept).
    pub(super) fn set_meta(
        &mut self,
        name: Option<Option<String>>,
        labels: Option<BTreeMap<String, String>>,
        kernel_deadline_ms: Option<Option<u32>>,
    ) {
        if let Some(n) = name {
            self.name = n;
        }
        if let Some(l) = labels {
            self.labels = l;
        }
        if let Some(ms) = kernel_deadline_ms {
            self.kernel_deadline_ms = ms;
        }
    }

    /// It is a process vGPU, handed over at `to`.
    pub(super) fn hand_over_at(&mut self, to: ProcessAttach) {
        self.process = Some(to);
    }

    /// Its worker's sample `s`, kept while it is within `keep_ns` of the newest. A
    /// worker's clock only moves forward (a process vGPU's fresh worker starts with no
    /// samples); a sample older than the newest one lost a race with a concurrent query
    /// and is dropped.
    pub(super) fn record_sample(&mut self, s: WorkerStats, keep_ns: u64) {
        if self
            .samples
            .back()
            .is_some_and(|b| b.uptime_ns >= s.uptime_ns)
        {
            return;
        }
        self.samples.push_back(s);
        while self
            .samples
            .front()
            .is_some_and(|f| s.uptime_ns.saturating_sub(f.uptime_ns) > keep_ns)
        {
            self.samples.pop_front();
        }
    }

    /// Its worker's memory report `m` (an oversubscribed vGPU's).
    pub(super) fn record_memory(&mut self, m: MemReport) {
        self.memory_report = Some(m);
    }

    /// A fresh worker takes over: its counters and clock start at zero. What the last one
    /// counted is kept (the vGPU's counters add up over its workers); its samples and
    /// memory report go, and its later reports are told apart by their generation.
    pub(super) fn retire_worker(&mut self) {
        let last = self.samples.back().map(Counters::of).unwrap_or_default();
        self.earlier.retire(last);
        self.drop_samples();
    }

    /// Samples that arrived while the fresh worker started (the last one's, answering a
    /// query sent before it left) go: the fresh worker's clock is behind them.
    pub(super) fn drop_samples(&mut self) {
        self.samples.clear();
        self.memory_report = None;
    }

    /// The generation of the current worker, which its events carry.
    pub(super) fn worker_generation(&self) -> u64 {
        self.earlier.generation()
    }

    /// The worker of generation `generation` sent its final counters `s`: the current
    /// worker's are a sample; the last one's add what it counted since it was retired.
    pub(super) fn record_final(&mut self, generation: u64, s: WorkerStats, keep_ns: u64) {
        if generation == self.earlier.generation() {
            self.record_sample(s, keep_ns);
        } else {
            self.earlier.late(generation, &s);
        }
    }

    /// Its counters over all its workers: the earlier ones' and the current one's last
    /// sample.
    pub(super) fn counters(&self) -> Counters {
        let last = self.samples.back().map(Counters::of).unwrap_or_default();
        self.earlier.total().plus(last)
    }

    /// A share change is on its way to the worker and the schedulers: until both
    /// applied it, it holds the larger of its current and its new shares.
    pub(super) fn hold_pending(&mut self, new: Shares) {
        self.pending = Some(new);
    }

    /// The change on its way was applied or given up.
    pub(super) fn clear_pending(&mut self) {
        self.pending = None;
    }

    /// Its VM is gone (the vGPU keeps its state until its worker is).
    pub(super) fn forget_vm(&mut self) {
        self.vm = None;
    }

    /// Its worker is gone: `next` is `Starting` (it waits for its next process),
    /// `Released` or `Failed`.
    pub(super) fn end_worker(&mut self, next: VgpuState) {
        debug_assert!(
            matches!(
                next,
                VgpuState::Starting | VgpuState::Released | VgpuState::Failed { .. }
            ),
            "a worker's end leaves a vGPU starting, released or failed, not {next:?}"
        );
        self.state = next;
    }
}

impl VgpuRec {
    /// The GPUs whose oversubscription pools hold its memory: its own, and during a
    /// migration the target's too.
    pub(super) fn pools(&self) -> Vec<u32> {
        std::iter::once(self.gpu)
            .chain(self.migrating_to.filter(|t| *t != self.gpu))
            .collect()
    }

    pub(super) fn holds_resources(&self) -> bool {
        matches!(
            self.state,
            VgpuState::Starting | VgpuState::Ready | VgpuState::Attached | VgpuState::Releasing
        )
    }

    /// The shares its schedulers enforce (and its worker has).
    pub(super) fn shares(&self) -> Shares {
        Shares {
            compute: self.compute,
            copy: self.copy,
            priority: self.priority,
        }
    }

    /// The shares it holds against its GPUs: its enforced ones, or the larger ones while
    /// a change is on its way.
    pub(super) fn held(&self) -> (u32, u32) {
        let p = self.pending.unwrap_or_else(|| self.shares());
        (self.compute.max(p.compute), self.copy.max(p.copy))
    }

    /// Its worker's control channel, while it runs.
    pub(super) fn link(&self) -> Option<Link> {
        self.worker.as_ref().map(|w| w.link.clone())
    }

    /// Its worker's process, while it runs.
    pub(super) fn worker_proc(&self) -> Option<Proc> {
        self.worker.as_ref().map(|w| w.proc.clone())
    }

    pub(super) fn view(&self) -> api::Vgpu {
        api::Vgpu {
            id: self.id,
            gpu: self.gpu,
            memory_bytes: self.memory,
            compute_share: permille_to_fraction(self.compute),
            copy_share: permille_to_fraction(self.copy),
            priority: self.priority,
            oversubscribe: self.oversubscribe,
            share_group: self.share_group.clone(),
            queues: self.queues,
            storage: self.storage.clone(),
            state: self.state.clone(),
            vm: self.vm,
            owned_by_vm: self.owned,
            socket: self
                .process
                .as_ref()
                .map_or(&self.socket, |p| &p.socket)
                .display()
                .to_string(),
            worker_pid: self.worker.as_ref().map(|w| w.proc.pid),
            name: self.name.clone(),
            labels: self.labels.clone(),
            kernel_deadline_ms: self.kernel_deadline_ms,
            attach: if self.process.is_some() {
                api::Attach::Process
            } else {
                api::Attach::Vm
            },
            owner_uid: self.process.as_ref().and_then(|p| p.owner_uid),
            owner_gid: self.process.as_ref().and_then(|p| p.owner_gid),
        }
    }
}

/// Everything the state lock guards.
pub(super) struct Inner {
    pub(super) vgpus: BTreeMap<u32, VgpuRec>,
    pub(super) vms: BTreeMap<u32, VmRec>,
    pub(super) next_vgpu: u32,
    pub(super) next_vm: u32,
    pub(super) migrations: BTreeMap<u32, api::Migration>,
    pub(super) next_migration: u32,
}

impl Default for Inner {
    fn default() -> Self {
        Self {
            vgpus: BTreeMap::new(),
            vms: BTreeMap::new(),
            next_vgpu: 1,
            next_vm: 1,
            migrations: BTreeMap::new(),
            next_migration: 1,
        }
    }
}

/// What one GPU has committed.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(super) struct Committed {
    pub(super) memory: u64,
    pub(super) compute: u32,
    pub(super) copy: u32,
}

impl Inner {
    /// What the live vGPUs on `gpu` (or migrating to it) hold, leaving out vGPU `except`.
    pub(super) fn committed(&self, gpu: u32, except: Option<u32>) -> Committed {
        let mut c = Committed::default();
        for v in self.vgpus.values() {
            let here = v.gpu == gpu || v.migrating_to == Some(gpu);
            if here && v.holds_resources() && Some(v.id) != except {
                if !v.oversubscribe {
                    c.memory = c.memory.saturating_add(v.memory);
                }
                let (compute, copy) = v.held();
                c.compute += compute;
                c.copy += copy;
            }
        }
        c
    }

    /// The control channel of vGPU `id`'s worker, while it runs.
    pub(super) fn link_of(&self, id: u32) -> Option<Link> {
        self.vgpus.get(&id).and_then(VgpuRec::link)
    }

    /// The live vGPU other than `except` that is called `name`.
    pub(super) fn vgpu_named(&self, name: &str, except: Option<u32>) -> Option<u32> {
        self.vgpus
            .values()
            .find(|v| {
                v.holds_resources() && Some(v.id) != except && v.name.as_deref() == Some(name)
            })
            .map(|v| v.id)
    }

    /// Whether vGPU `id` has no worker (or no record) any more.
    pub(super) fn worker_gone(&self, id: u32) -> bool {
        self.vgpus.get(&id).is_none_or(|r| r.worker.is_none())
    }
}

/// The records, their lock, and the wake-up for whoever waits on a change.
pub(super) struct State {
    inner: Ranked<Inner>,
    /// Woken whenever a child exits or a state changes.
    changed: Notify,
}

impl State {
    pub(super) fn new() -> Self {
        Self {
            inner: Ranked::new(Rank::State, Inner::default()),
            changed: Notify::new(),
        }
    }

    /// Runs `f` on the records under the state lock.
    pub(super) fn with<R>(&self, f: impl FnOnce(&mut Inner) -> R) -> R {
        let mut inner = self.inner.lock();
        f(&mut inner)
    }

    /// Wakes everyone waiting in [`State::wait_until`].
    pub(super) fn notify(&self) {
        self.changed.notify_waiters();
    }

    /// Waits until `done` holds (checked after every state change) or `timeout` passes.
    pub(super) async fn wait_until(
        &self,
        timeout: Duration,
        mut done: impl FnMut(&Inner) -> bool,
    ) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let notified = self.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.with(|i| done(i)) {
                return true;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return self.with(|i| done(i));
            }
        }
    }

    /// One vGPU's view.
    pub(super) fn vgpu_view(&self, id: u32) -> Option<api::Vgpu> {
        self.with(|i| i.vgpus.get(&id).map(VgpuRec::view))
    }

    /// The control channel of vGPU `id`'s worker, while it runs.
    pub(super) fn link_of(&self, id: u32) -> Option<Link> {
        self.with(|i| i.link_of(id))
    }
}

#[cfg(test)]
mod tests;
