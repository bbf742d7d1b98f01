//! The backend wrapper that makes a vGPU movable, and the move itself.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard};
use std::time::{Duration, Instant};

use vgpu_backend::{
    copy_to_peer, require_paging, require_relocation, Allocated, ArgValue, Backend, BackendError,
    BackendInfo, HostRegion, ModuleImage,
};

use crate::report::{MigrateOptions, Mode, Phase, Progress, Report};
use crate::MigrationError;
use vgpu_backend::sync::{lock, read, write};

/// One allocation as the migration sees it.
#[derive(Debug)]
pub(crate) struct Alloc {
    pub(crate) size: u64,
    /// Epoch of the last operation that may have written it.
    pub(crate) written: Arc<AtomicU64>,
    /// Swapped-out ranges (offset -> length): no bytes to copy, and the target must not
    /// hold memory for them either.
    pub(crate) decommitted: Arc<Mutex<BTreeMap<u64, u64>>>,
}

#[derive(Debug, Clone)]
pub(crate) enum Image {
    Builtin(Vec<u8>),
    Ptx(Vec<u8>),
    Binary(Vec<u8>),
}

impl Image {
    pub(crate) fn as_module(&self) -> ModuleImage<'_> {
        match self {
            Image::Builtin(b) => ModuleImage::Builtin(b),
            Image::Ptx(b) => ModuleImage::Ptx(b),
            Image::Binary(b) => ModuleImage::Binary(b),
        }
    }
}

#[derive(Debug)]
pub(crate) struct Module {
    pub(crate) image: Image,
    pub(crate) real: u64,
}

#[derive(Debug)]
pub(crate) struct Func {
    pub(crate) module: u64,
    pub(crate) name: Vec<u8>,
    pub(crate) real: u64,
}

/// A vGPU's backend that can move to another GPU under the guest's feet.
pub struct Migratable {
    pub(crate) current: RwLock<Arc<dyn Backend>>,
    /// What the guest saw first (a moved vGPU keeps its identity).
    pub(crate) info: BackendInfo,
    /// Every operation holds it shared; a migration's stop phase holds it exclusively.
    pub(crate) dispatch: RwLock<()>,
    pub(crate) allocs: Mutex<BTreeMap<u64, Alloc>>,
    /// Shared objects mapped (they stay on their GPU).
    pub(crate) imported: Mutex<BTreeSet<u64>>,
    pub(crate) modules: Mutex<BTreeMap<u64, Module>>,
    pub(crate) functions: Mutex<BTreeMap<u64, Func>>,
    /// Module variables the guest holds addresses of, by that address.
    pub(crate) vars: Mutex<BTreeMap<u64, crate::globals::Var>>,
    /// Some variable lives elsewhere than the guest's address (after a move).
    pub(crate) vars_moved: AtomicBool,
    pub(crate) regions: Mutex<Vec<HostRegion>>,
    /// Host memory the GPU reaches at its host address (`HostMemory::map_for_device`):
    /// mapped on a migration target before the switch, let go on the source after it.
    pub(crate) device_mapped: Mutex<Vec<HostRegion>>,
    pub(crate) next_handle: AtomicU64,
    pub(crate) epoch: AtomicU64,
    pub(crate) migrating: AtomicBool,
    /// A move to another host runs: no new virtual memory objects (it cannot carry them).
    pub(crate) vmm_frozen: AtomicBool,
}

impl std::fmt::Debug for Migratable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Migratable")
            .field("info", &self.info)
            .finish_non_exhaustive()
    }
}

impl Migratable {
    /// Serves through `backend` until a migration moves it.
    pub fn new(backend: Arc<dyn Backend>) -> Self {
        Self {
            info: backend.info().clone(),
            current: RwLock::new(backend),
            dispatch: RwLock::new(()),
            allocs: Mutex::new(BTreeMap::new()),
            imported: Mutex::new(BTreeSet::new()),
            modules: Mutex::new(BTreeMap::new()),
            functions: Mutex::new(BTreeMap::new()),
            vars: Mutex::new(BTreeMap::new()),
            vars_moved: AtomicBool::new(false),
            regions: Mutex::new(Vec::new()),
            device_mapped: Mutex::new(Vec::new()),
            next_handle: AtomicU64::new(1),
            epoch: AtomicU64::new(1),
            migrating: AtomicBool::new(false),
            vmm_frozen: AtomicBool::new(false),
        }
    }

    /// Refuses a move to another host of a vGPU that holds virtual memory objects, and
    /// freezes them (`vmm_frozen`, set by the caller): operations that started before
    /// the freeze finish first (the dispatch lock, taken once exclusively), new ones see
    /// it and refuse.
    pub(crate) fn refuse_virtual_memory(&self) -> std::result::Result<(), MigrationError> {
        drop(write(&self.dispatch));
        let n = self.current().virtual_memory().map_or(0, |v| v.objects());
        if n > 0 {
            return Err(MigrationError::VirtualMemory(n));
        }
        Ok(())
    }

    /// The backend serving now.
    pub fn current(&self) -> Arc<dyn Backend> {
        read(&self.current).clone()
    }

    pub(crate) fn enter(&self) -> (RwLockReadGuard<'_, ()>, Arc<dyn Backend>) {
        let g = read(&self.dispatch);
        (g, self.current())
    }

    /// The epoch a write that has just finished belongs to. The fence orders the write
    /// before the load: if the load still sees a round's start epoch, the write finished
    /// before that round began copying, so the round's copy carried it.
    fn now_epoch(&self) -> u64 {
        std::sync::atomic::fence(Ordering::SeqCst);
        self.epoch.load(Ordering::SeqCst)
    }

    /// Marks the allocation holding `addr` as written now.
    pub(crate) fn mark(&self, addr: u64) {
        let e = self.now_epoch();
        if let Some((_, a)) = lock(&self.allocs).range(..=addr).next_back() {
            a.written.fetch_max(e, Ordering::AcqRel);
        }
    }

    fn mark_all(&self) {
        let e = self.now_epoch();
        for a in lock(&self.allocs).values() {
            a.written.fetch_max(e, Ordering::AcqRel);
        }
    }

    /// Marks what a launch may write: pointers declared write or read-write, or
    /// everything when an integer argument may be a raw device address.
    pub(crate) fn mark_launch(&self, args: &[ArgValue]) {
        let va = self.info.va_base..self.info.va_base.saturating_add(self.info.va_size);
        // A pointer the launch carries in a form other than a pointer argument — an
        // integer, a by-value parameter's bytes, or a by-value struct (a CUTLASS params
        // struct, a TMA tensor map: cuBLAS's kernels take both) — may be written through:
        // everything counts as written.
        if args.iter().any(|a| match a {
            ArgValue::U64(v) => va.contains(v),
            ArgValue::Bytes { bits, .. } => va.contains(bits),
            ArgValue::Blob { .. } => true,
            _ => false,
        }) {
            self.mark_all();
            return;
        }
        for a in args {
            if let ArgValue::Ptr { addr, access } = a {
                if access.writes() {
                    self.mark(*addr);
                }
            }
        }
    }

    pub(crate) fn track(&self, a: &Allocated, size: u64) {
        lock(&self.allocs).insert(
            a.addr,
            Alloc {
                size,
                written: Arc::new(AtomicU64::new(self.epoch.load(Ordering::Acquire))),
                decommitted: Arc::new(Mutex::new(BTreeMap::new())),
            },
        );
    }

    pub(crate) fn handle(&self) -> u64 {
        self.next_handle.fetch_add(1, Ordering::Relaxed)
    }
}

/// Swapped-out ranges of one allocation (offset -> length).
type Ranges = Arc<Mutex<BTreeMap<u64, u64>>>;
/// One allocation at a moment: address, size, written epoch, swapped-out ranges.
type Live = (u64, u64, u64, Ranges);

/// What the target holds of one allocation during a migration.
#[derive(Debug, Default)]
struct Placed {
    decommitted: BTreeMap<u64, u64>,
}

struct Mover<'a> {
    src: &'a Migratable,
    source: Arc<dyn Backend>,
    target: Arc<dyn Backend>,
    placed: BTreeMap<u64, Placed>,
    bytes: u64,
    started: Instant,
}

impl Mover<'_> {
    fn target_err(what: String) -> impl FnOnce(BackendError) -> MigrationError {
        move |source| MigrationError::Target { what, source }
    }

    /// The allocations as of now: (addr, size, written epoch, decommitted ranges).
    fn snapshot(&self) -> Vec<Live> {
        lock(&self.src.allocs)
            .iter()
            .map(|(a, x)| {
                (
                    *a,
                    x.size,
                    x.written.load(Ordering::Acquire),
                    x.decommitted.clone(),
                )
            })
            .collect()
    }

    /// Makes the target's allocations match the source's (frees what was freed, places
    /// what is new at the same address).
    fn reconcile(&mut self, live: &[Live]) -> std::result::Result<(), MigrationError> {
        let keep: BTreeSet<u64> = live.iter().map(|l| l.0).collect();
        let gone: Vec<u64> = self
            .placed
            .keys()
            .filter(|a| !keep.contains(a))
            .copied()
            .collect();
        for a in gone {
            let _ = self.target.free(a);
            self.placed.remove(&a);
        }
        for (addr, size, _, _) in live {
            if !self.placed.contains_key(addr) {
                require_relocation(&*self.target)
                    .and_then(|t| t.alloc_at(*addr, *size))
                    .map_err(Self::target_err(format!(
                        "placing {size} bytes at {addr:#x}"
                    )))?;
                self.placed.insert(*addr, Placed::default());
            }
        }
        Ok(())
    }

    /// Copies allocation `addr`'s resident bytes; mirrors its swapped-out ranges.
    fn copy_one(
        &mut self,
        addr: u64,
        size: u64,
        dec: &Mutex<BTreeMap<u64, u64>>,
    ) -> std::result::Result<u64, MigrationError> {
        let this: *const Mutex<BTreeMap<u64, u64>> = dec;
        let dec = lock(dec);
        let placed = self.placed.entry(addr).or_default();
        // Ranges the target holds decommitted but the source has back: recommit first.
        let back: Vec<(u64, u64)> = placed
            .decommitted
            .iter()
            .filter(|(o, _)| !dec.contains_key(o))
            .map(|(o, l)| (*o, *l))
            .collect();
        for (o, l) in back {
            require_paging(&*self.target)
                .and_then(|t| t.recommit(addr, o, l))
                .map_err(Self::target_err(format!("recommitting {addr:#x}+{o:#x}")))?;
            placed.decommitted.remove(&o);
        }
        // Copy what is resident at the source, between its swapped-out ranges.
        let mut copied = 0;
        let mut at = 0;
        let mut copy = |from: u64, to: u64| -> std::result::Result<(), MigrationError> {
            let to = to.min(size);
            if to > from {
                let r = copy_to_peer(&*self.source, &*self.target, addr + from, to - from);
                // The allocation this copy is of: still the one at `addr` (one allocated
                // again at the same address has a table of its own).
                let same = || {
                    lock(&self.src.allocs)
                        .get(&addr)
                        .is_some_and(|a| std::ptr::eq(&*a.decommitted, this))
                };
                if r.is_err() && !same() {
                    // Freed while we copied (pre-copy runs beside the guest's requests and
                    // the pager's, which frees its device swap buffers), perhaps allocated
                    // again since: nothing of it to move; the next reconcile drops it from
                    // the target.
                    return Ok(());
                }
                r.map_err(|e| match e {
                    BackendError::NotSupported(_) | BackendError::BadPointer { .. } => {
                        MigrationError::Source(e)
                    }
                    other => MigrationError::Target {
                        what: format!("copying {addr:#x}+{from:#x}"),
                        source: other,
                    },
                })?;
                copied += to - from;
            }
            Ok(())
        };
        for (o, l) in dec.iter() {
            copy(at, *o)?;
            at = o + l;
        }
        copy(at, size)?;
        // Ranges swapped out at the source: give the target's memory back too.
        for (o, l) in dec.iter() {
            if !placed.decommitted.contains_key(o) {
                require_paging(&*self.target)
                    .and_then(|t| t.decommit(addr, *o, *l))
                    .map_err(Self::target_err(format!("decommitting {addr:#x}+{o:#x}")))?;
                placed.decommitted.insert(*o, *l);
            }
        }
        self.bytes += copied;
        Ok(copied)
    }
}

impl Mover<'_> {
    /// Rebuilds the source's virtual memory objects on the target (dispatch is stopped):
    /// the same reserved ranges, handles and mappings at the same addresses, then each
    /// physical allocation's bytes copied through one of its mappings (two mappings of one
    /// allocation share it on the target too).
    fn move_virtual_memory(&mut self) -> std::result::Result<(), MigrationError> {
        let Some(src) = self.source.virtual_memory() else {
            return Ok(());
        };
        let snap = src.snapshot().map_err(MigrationError::Source)?;
        if snap.is_empty() {
            return Ok(());
        }
        self.target
            .virtual_memory()
            .ok_or_else(|| {
                BackendError::NotSupported("the target GPU has no virtual memory management".into())
            })
            .and_then(|t| t.restore(&snap))
            .map_err(Self::target_err(
                "rebuilding the virtual memory objects".into(),
            ))?;
        let mut copied = BTreeSet::new();
        for &(addr, size, handle) in &snap.maps {
            if !copied.insert(handle) {
                continue;
            }
            copy_to_peer(&*self.source, &*self.target, addr, size).map_err(Self::target_err(
                format!("copying the mapping at {addr:#x}"),
            ))?;
            self.bytes += size;
        }
        tracing::debug!(
            ranges = snap.ranges.len(),
            allocations = snap.allocations.len(),
            maps = snap.maps.len(),
            "virtual memory moved"
        );
        Ok(())
    }
}

impl Migratable {
    /// Moves the vGPU onto `target` (a fresh backend of the target GPU with the same
    /// address space). `progress` hears about every step. On error the vGPU stays on its
    /// current backend and `target` is dropped.
    pub fn migrate(
        &self,
        target: Arc<dyn Backend>,
        opts: &MigrateOptions,
        progress: impl FnMut(&Progress),
    ) -> std::result::Result<Report, MigrationError> {
        self.migrate_with(target, opts, progress, || {})
    }

    /// Like [`Migratable::migrate`]; `on_switch` runs at the switch, while dispatch is
    /// still stopped (the worker moves its grant channel to the target GPU's scheduler
    /// there).
    pub fn migrate_with(
        &self,
        target: Arc<dyn Backend>,
        opts: &MigrateOptions,
        mut progress: impl FnMut(&Progress),
        on_switch: impl FnOnce(),
    ) -> std::result::Result<Report, MigrationError> {
        if self.migrating.swap(true, Ordering::AcqRel) {
            return Err(MigrationError::Busy);
        }
        let r = self.migrate_inner(target, opts, &mut progress, on_switch);
        self.migrating.store(false, Ordering::Release);
        r
    }

    fn migrate_inner(
        &self,
        target: Arc<dyn Backend>,
        opts: &MigrateOptions,
        progress: &mut impl FnMut(&Progress),
        on_switch: impl FnOnce(),
    ) -> std::result::Result<Report, MigrationError> {
        let shared = lock(&self.imported).len();
        if shared > 0 {
            return Err(MigrationError::SharedMappings(shared));
        }
        let mut m = Mover {
            src: self,
            source: self.current(),
            target,
            placed: BTreeMap::new(),
            bytes: 0,
            started: Instant::now(),
        };
        let total = |live: &[Live]| live.iter().map(|l| l.1).sum::<u64>();
        let mut timeline = Vec::new();
        let mut rounds = 0;
        // Every write since this epoch still has to reach the target.
        let mut since = 0u64;
        let mut rate_ns_per_byte = 0.0f64;
        if opts.mode == Mode::Precopy {
            let t0 = m.started.elapsed();
            loop {
                let round_start = self.epoch.fetch_add(1, Ordering::SeqCst);
                let live = m.snapshot();
                m.reconcile(&live)?;
                let t = Instant::now();
                let mut copied = 0;
                for (addr, size, written, dec) in &live {
                    if *written >= since {
                        copied += m.copy_one(*addr, *size, dec)?;
                    }
                }
                rounds += 1;
                if copied > 0 {
                    rate_ns_per_byte = t.elapsed().as_nanos() as f64 / copied as f64;
                }
                // Writes marked with `round_start` finished before this round copied
                // (see `now_epoch`); only later ones may be missing at the target. (With
                // `>= round_start`, everything written before round 1 counted as dirty
                // again: every pre-copy sent all bytes twice or all of them stopped.)
                since = round_start + 1;
                let live = m.snapshot();
                let dirty: u64 = live.iter().filter(|l| l.2 >= since).map(|l| l.1).sum();
                progress(&Progress {
                    phase: Phase::Precopy,
                    rounds,
                    bytes: m.bytes,
                    total: total(&live),
                    dirty,
                    elapsed: m.started.elapsed(),
                });
                let expect = Duration::from_nanos((dirty as f64 * rate_ns_per_byte) as u64);
                tracing::debug!(rounds, copied, dirty, ?expect, "pre-copy round");
                if expect <= opts.max_downtime || rounds >= opts.max_rounds || dirty == 0 {
                    break;
                }
            }
            timeline.push((Phase::Precopy, t0, m.started.elapsed()));
        }
        let precopy_bytes = m.bytes;
        // Stop: new operations wait here; running ones finish (a kernel boundary).
        let stop = Instant::now();
        let t_drain = m.started.elapsed();
        progress(&Progress {
            phase: Phase::Draining,
            rounds,
            bytes: m.bytes,
            total: total(&m.snapshot()),
            dirty: 0,
            elapsed: m.started.elapsed(),
        });
        let held = write(&self.dispatch);
        m.source.synchronize();
        let drain = stop.elapsed();
        let t_copy = m.started.elapsed();
        timeline.push((Phase::Draining, t_drain, t_copy));
        let live = m.snapshot();
        let finish = (|| {
            m.reconcile(&live)?;
            for (addr, size, written, dec) in &live {
                if opts.mode == Mode::StopCopy || *written >= since {
                    m.copy_one(*addr, *size, dec)?;
                }
            }
            // The virtual memory objects, rebuilt whole while stopped.
            m.move_virtual_memory()?;
            // Modules and functions under the same guest handles.
            let mut modules = lock(&self.modules);
            let mut functions = lock(&self.functions);
            let mut new_mod = BTreeMap::new();
            for (h, md) in modules.iter() {
                let real = m
                    .target
                    .modules()
                    .module_load(md.image.as_module())
                    .map_err(Mover::target_err(format!("loading module {h}")))?;
                new_mod.insert(*h, real);
            }
            let mut new_fn = BTreeMap::new();
            for (h, f) in functions.iter() {
                let module = new_mod.get(&f.module).copied().unwrap_or(0);
                let real = m
                    .target
                    .modules()
                    .get_function(module, &f.name)
                    .map_err(Mover::target_err(format!("looking up function {h}")))?;
                new_fn.insert(*h, real.handle);
            }
            // Module variables: read on the source, looked up (same size) on the target;
            // written once the target holds the vGPU's addresses.
            let pairs: Vec<(u64, u64)> = modules.iter().map(|(h, md)| (*h, md.real)).collect();
            let carried = self.read_vars(&*m.source, &pairs)?;
            let placed = crate::globals::place_vars(&*m.target, &new_mod, &carried)?;
            let regions = lock(&self.regions).clone();
            if let Some(h) = m.target.host_memory().filter(|_| !regions.is_empty()) {
                h.register(&regions)
                    .map_err(Mover::target_err("registering guest memory".into()))?;
            }
            // Device-mapped host memory (portable registrations: the target shares them).
            // A target that cannot map it refuses the migration: the tenant's kernels use
            // those addresses.
            let mapped = lock(&self.device_mapped).clone();
            for r in &mapped {
                let h = m
                    .target
                    .host_memory()
                    .ok_or_else(|| MigrationError::Target {
                        what: "mapping host memory for the GPU".into(),
                        source: vgpu_backend::BackendError::NotSupported(
                            "the target cannot map host memory for the GPU".into(),
                        ),
                    })?;
                h.map_for_device(*r)
                    .map_err(Mover::target_err("mapping host memory for the GPU".into()))?;
            }
            for (h, md) in modules.iter_mut() {
                md.real = new_mod.get(h).copied().unwrap_or(md.real);
            }
            for (h, f) in functions.iter_mut() {
                f.real = new_fn.get(h).copied().unwrap_or(f.real);
            }
            Ok::<_, MigrationError>((carried, placed))
        })();
        // The device addresses change hands (cuda: the target maps its memory where the
        // source's was; one process, one address space). The source keeps its memory until
        // the target holds the addresses, so a failure here still leaves the vGPU whole.
        let finish = finish.and_then(|(mut carried, placed)| {
            // A backend that cannot relocate holds no addresses to hand over.
            let source = m.source.relocation();
            if let Some(Err(e)) = source.map(|s| s.vacate_addresses()) {
                return Err(MigrationError::Source(e));
            }
            let give_back = || {
                if let Some(Err(back)) = source.map(|s| s.reoccupy_addresses()) {
                    tracing::error!(error = %back, "the source cannot take its device addresses back");
                }
            };
            let occupied = m.target.relocation().map_or(Ok(()), |t| t.occupy_addresses());
            occupied.map_err(|e| {
                give_back();
                MigrationError::Target {
                    what: "mapping its memory at the vGPU's device addresses".into(),
                    source: e,
                }
            })?;
            // The target serves guest work now (cuda: not while it staged): the module
            // variables' bytes go in; on failure the addresses go back to the source.
            if let Err(e) = crate::globals::write_vars(&*m.target, &mut carried, &placed) {
                if let Some(Err(back)) = m.target.relocation().map(|t| t.vacate_addresses()) {
                    tracing::error!(error = %back, "the target cannot give the device addresses back");
                }
                give_back();
                return Err(e);
            }
            Ok(placed)
        });
        let placed = match finish {
            Ok(p) => p,
            Err(e) => {
                drop(held);
                tracing::warn!(error = %e, "migration failed; the vGPU stays on its source");
                return Err(e);
            }
        };
        self.moved_vars(&*m.target, placed);
        let old = std::mem::replace(&mut *write(&self.current), m.target.clone());
        on_switch();
        let downtime = stop.elapsed();
        drop(held);
        let t_end = m.started.elapsed();
        timeline.push((Phase::StopCopy, t_copy, t_end));
        // The source's memory goes once nothing uses it.
        let regions = lock(&self.regions).clone();
        if let Some(h) = old.host_memory().filter(|_| !regions.is_empty()) {
            h.unregister(&regions);
        }
        if let Some(h) = old.host_memory() {
            for r in lock(&self.device_mapped).iter() {
                h.unmap_for_device(*r);
            }
        }
        drop(old);
        let live = m.snapshot();
        let report = Report {
            mode: opts.mode,
            rounds,
            precopy_bytes,
            stop_bytes: m.bytes - precopy_bytes,
            total: total(&live),
            downtime,
            drain,
            elapsed: m.started.elapsed(),
            timeline,
        };
        progress(&Progress {
            phase: Phase::Done,
            rounds,
            bytes: m.bytes,
            total: report.total,
            dirty: 0,
            elapsed: report.elapsed,
        });
        tracing::info!(
            rounds,
            bytes = m.bytes,
            downtime_us = downtime.as_micros() as u64,
            total_ms = report.elapsed.as_millis() as u64,
            "vGPU migrated"
        );
        Ok(report)
    }
}
