//! The daemon's state and everything that changes it: admission, process supervision,
//! teardown, stats sampling.

use std::collections::{BTreeMap, VecDeque};
use std::fs::File;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use tokio::sync::Notify;

use super::error::{ApiError, DaemonError};
use super::link::{self, Link};
use super::procs::{self, Proc};
use super::shm;
use super::statefile;
use super::storage;
use super::{Config, GpuConfig, Listen};
use crate::api::{self, VgpuCreate, VgpuPatch, VgpuState, VmCreate, VmState};
use crate::control::{
    Answer, Ask, Command as Ctl, MemReport, MigrationMode, MigrationProgress, ReplyBody, TargetGpu,
    WorkerStats,
};
use crate::units::{fraction_to_permille, human_bytes, permille_to_fraction};
use vgpu_backend::pager::{Planner, Step, Tried};
use vgpu_grant::{GrantServer, ServerConfig, WorkerFds};
use vgpu_scheduler::Share;

#[path = "persist.rs"]
mod persist;
#[path = "rebalance.rs"]
mod rebalance;

/// How many times (20 ms apart, 10 s in all) a reservation waits for busy victims before it
/// is refused (a victim's memory may be in a long copy on a loaded host).
const BUSY_RETRIES: u32 = 500;
/// How long a migration may take in all.
const MIGRATION_TIMEOUT: Duration = Duration::from_secs(600);
/// How long one eviction may take (it may move gigabytes at host copy speed).
const SWAP_TIMEOUT: Duration = Duration::from_secs(120);

fn lock_planner(p: &Mutex<Planner>) -> MutexGuard<'_, Planner> {
    p.lock().unwrap_or_else(PoisonError::into_inner)
}

fn cfg_gpus_memory(cfg: &Config) -> Vec<GpuMemory> {
    cfg.gpus
        .iter()
        .map(|g| {
            let swap = (g.memory as f64 * cfg.swap_area) as u64;
            GpuMemory {
                planner: Mutex::new(Planner::new(g.memory - swap.min(g.memory), swap)),
                serial: tokio::sync::Mutex::new(()),
            }
        })
        .collect()
}

/// Per-mille of a whole GPU.
const WHOLE: u32 = 1000;
/// Most queues per vGPU (vgpu-device's limit).
const MAX_QUEUES: u16 = 64;
/// How long a worker may take to bind its socket.
const WORKER_START: Duration = Duration::from_secs(5);
/// How long a worker or vmm may take to stop after SIGTERM before SIGKILL.
const STOP_GRACE: Duration = Duration::from_millis(500);
/// How long a control-channel command may take.
const CONTROL_TIMEOUT: Duration = Duration::from_secs(1);
/// Guest RAM bounds.
const VM_MEMORY_MIN: u64 = 16 << 20;
const VM_MEMORY_MAX: u64 = 64 << 30;
/// Longest payload argument (payload-abi.md).
const MAX_PAYLOAD_ARG: usize = 4096;
/// Most vCPUs (payload-abi.md).
const MAX_VCPUS: u8 = 16;

struct WorkerHandle {
    proc: Proc,
    link: Link,
}

struct VgpuRec {
    id: u32,
    gpu: u32,
    memory: u64,
    compute: u32,
    copy: u32,
    priority: i32,
    oversubscribe: bool,
    share_group: Option<String>,
    queues: u16,
    /// Storage namespaces (issue 9), passed to the worker.
    storage: Vec<api::StorageAttachment>,
    state: VgpuState,
    vm: Option<u32>,
    owned: bool,
    socket: PathBuf,
    log: PathBuf,
    worker: Option<WorkerHandle>,
    /// We asked the worker to stop: its exit is not a failure.
    stopping: bool,
    samples: VecDeque<WorkerStats>,
    /// An oversubscribed vGPU's latest memory report.
    memory_report: Option<MemReport>,
    /// A migration to this GPU is running (its shares are committed there too).
    migrating_to: Option<u32>,
    /// Restored from the state file but not running (it is still saved as a definition
    /// to bring back at the next start).
    restore_failed: bool,
}

/// How a reservation on one pool ended.
enum Reserved {
    Granted,
    /// The vGPU is not (or no longer) in that pool.
    NotMember,
    Refused(String),
}

impl VgpuRec {
    /// The GPUs whose oversubscription pools hold its memory: its own, and during a
    /// migration the target's too.
    fn pools(&self) -> Vec<u32> {
        std::iter::once(self.gpu)
            .chain(self.migrating_to.filter(|t| *t != self.gpu))
            .collect()
    }

    fn holds_resources(&self) -> bool {
        matches!(
            self.state,
            VgpuState::Starting | VgpuState::Ready | VgpuState::Attached
        )
    }

    fn view(&self) -> api::Vgpu {
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
            socket: self.socket.display().to_string(),
            worker_pid: self.worker.as_ref().map(|w| w.proc.pid),
        }
    }
}

struct VmRec {
    id: u32,
    payload: PathBuf,
    payload_arg: String,
    memory: u64,
    vcpus: u8,
    vgpu: Option<u32>,
    state: VmState,
    proc: Option<Proc>,
    console: PathBuf,
    started: Instant,
    ended: Option<Instant>,
    /// Wall-clock launch time (saved in the state file).
    launched: SystemTime,
    /// A record restored from the state file: how long it ran.
    restored_uptime: Option<u64>,
}

impl VmRec {
    fn uptime_ms(&self) -> u64 {
        self.restored_uptime.unwrap_or_else(|| {
            let up = self.ended.unwrap_or_else(Instant::now) - self.started;
            u64::try_from(up.as_millis()).unwrap_or(u64::MAX)
        })
    }

    fn view(&self) -> api::Vm {
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
        }
    }
}

#[derive(Default)]
struct Inner {
    vgpus: BTreeMap<u32, VgpuRec>,
    vms: BTreeMap<u32, VmRec>,
    next_vgpu: u32,
    next_vm: u32,
    migrations: BTreeMap<u32, api::Migration>,
    next_migration: u32,
}

/// What one GPU has committed.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Committed {
    memory: u64,
    compute: u32,
    copy: u32,
}

impl Inner {
    fn committed(&self, gpu: u32, except: Option<u32>) -> Committed {
        let mut c = Committed::default();
        for v in self.vgpus.values() {
            let here = v.gpu == gpu || v.migrating_to == Some(gpu);
            if here && v.holds_resources() && Some(v.id) != except {
                if !v.oversubscribe {
                    c.memory = c.memory.saturating_add(v.memory);
                }
                c.compute += v.compute;
                c.copy += v.copy;
            }
        }
        c
    }
}

/// A validated vGPU request (shares in per-mille).
#[derive(Debug)]
struct VgpuAsk {
    gpu: Option<u32>,
    memory: u64,
    compute: u32,
    copy: u32,
    priority: i32,
    oversubscribe: bool,
    share_group: Option<String>,
    queues: u16,
    storage: Vec<api::StorageAttachment>,
}

/// One GPU's oversubscribed memory: the pool's plan, and one reservation at a time.
struct GpuMemory {
    planner: Mutex<Planner>,
    serial: tokio::sync::Mutex<()>,
}

/// The daemon.
pub struct Daemon {
    cfg: Config,
    /// One scheduler thread per GPU: every copy and kernel of every vGPU on it passes
    /// through its grant path (BAND by default).
    grants: Vec<GrantServer>,
    inner: Mutex<Inner>,
    /// Woken whenever a child exits or a state changes.
    changed: Notify,
    shutting_down: AtomicBool,
    /// Per GPU: the memory pool oversubscribed vGPUs share.
    memory: Vec<GpuMemory>,
    /// Shared device memory objects.
    shm: Mutex<shm::Registry>,
    /// Demand monitoring and the rebalancer (issue 13). Lock order: `inner` first.
    rebalance: Mutex<rebalance::State>,
    /// The state file's writer (persist.rs); taken before `inner`.
    saver: tokio::sync::Mutex<persist::Saver>,
    /// Wakes the background saver.
    save_kick: Notify,
}

fn share(field: &str, v: f64) -> Result<u32, ApiError> {
    if !(v.is_finite() && (0.0..=1.0).contains(&v)) {
        return Err(ApiError::bad(
            field,
            format!("{v} is not a share: give a fraction of the GPU between 0 and 1 (0.3 = 30%)"),
        ));
    }
    Ok(fraction_to_permille(v))
}

fn pct(permille: u32) -> String {
    format!("{:.1}%", f64::from(permille) / 10.0)
}

fn validate_share_group(g: &str) -> Result<(), ApiError> {
    let ok = (1..=64).contains(&g.len())
        && g.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(ApiError::bad(
            "share_group",
            format!("{g:?} is not a share group name: use 1 to 64 characters of A-Z a-z 0-9 _ . -"),
        ))
    }
}

/// The worker's last words, for failure reasons: its last error line (or last line),
/// without the log timestamp.
fn log_tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let pick = lines
        .iter()
        .rev()
        .find(|l| l.contains("error") || l.contains("ERROR") || l.contains("panicked"))
        .or(lines.last());
    match pick {
        Some(l) => {
            let l = l.trim();
            // "2026-11-29T12:20:53.99Z  INFO target: message" -> "INFO target: message"
            let l = match l.split_once(' ') {
                Some((ts, rest)) if ts.len() > 18 && ts.as_bytes().get(4) == Some(&b'-') => {
                    rest.trim_start()
                }
                _ => l,
            };
            format!(": {l}")
        }
        None => String::new(),
    }
}

impl Daemon {
    fn new(cfg: Config) -> Result<Self, vgpu_grant::GrantError> {
        let sched = ServerConfig {
            policy: cfg.policy,
            ..ServerConfig::default()
        };
        let grants = (0..cfg.gpus.len())
            .map(|i| GrantServer::start(sched, &format!("gpu{i}")))
            .collect::<Result<Vec<_>, _>>()?;
        let memory = cfg_gpus_memory(&cfg);
        let rebalance = Mutex::new(rebalance::State::new(&cfg));
        Ok(Self {
            cfg,
            grants,
            inner: Mutex::new(Inner {
                next_vgpu: 1,
                next_vm: 1,
                next_migration: 1,
                ..Inner::default()
            }),
            changed: Notify::new(),
            shutting_down: AtomicBool::new(false),
            memory,
            shm: Mutex::new(shm::Registry::default()),
            rebalance,
            saver: tokio::sync::Mutex::new(persist::Saver::default()),
            save_kick: Notify::new(),
        })
    }

    /// vGPU `id`'s shares joined its GPU's scheduler: the descriptors its worker needs.
    fn attach_grants(
        &self,
        id: u32,
        gpu: u32,
        compute: u32,
        copy: u32,
        priority: i32,
    ) -> Result<WorkerFds, ApiError> {
        let server = self
            .grants
            .get(gpu as usize)
            .ok_or_else(|| ApiError::internal(format!("vGPU {id} is on an unknown GPU")))?;
        let share = |permille: u32| Share {
            fraction: permille_to_fraction(permille),
            priority,
        };
        server
            .attach(id, share(compute), share(copy))
            .map_err(|e| ApiError::internal(format!("cannot schedule vGPU {id}: {e}")))
    }

    /// vGPU `id` leaves its GPU's scheduler (its worker is gone): whatever it held passes on.
    fn detach_grants(&self, id: u32, gpu: u32) {
        if let Some(server) = self.grants.get(gpu as usize) {
            server.detach(id);
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn check_running(&self) -> Result<(), ApiError> {
        if self.shutting_down.load(Ordering::SeqCst) {
            Err(ApiError::shutting_down())
        } else {
            Ok(())
        }
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// Waits until `done` holds (checked after every state change) or `timeout` passes.
    async fn wait_until(&self, timeout: Duration, mut done: impl FnMut(&Inner) -> bool) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let notified = self.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if done(&self.lock()) {
                return true;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return done(&self.lock());
            }
        }
    }

    // ---- GPUs ----

    /// Every physical GPU with its commitments.
    pub fn gpus(&self) -> Vec<api::Gpu> {
        let inner = self.lock();
        self.cfg
            .gpus
            .iter()
            .enumerate()
            .map(|(i, g)| {
                let index = u32::try_from(i).unwrap_or(u32::MAX);
                let c = inner.committed(index, None);
                api::Gpu {
                    index,
                    name: g.name.clone(),
                    backend: if g.cuda_ordinal.is_some() {
                        "cuda"
                    } else {
                        "sim"
                    }
                    .into(),
                    memory_bytes: g.memory,
                    memory_committed_bytes: c.memory,
                    memory_free_bytes: g.memory.saturating_sub(c.memory),
                    memory_shared_bytes: self.shm_lock().bytes_on(index),
                    oversubscribed_pool_bytes: self.pool_of(index).0,
                    oversubscribed_resident_bytes: self.pool_of(index).1,
                    swap_area_bytes: self.pool_of(index).2,
                    swap_area_used_bytes: self.pool_of(index).3,
                    copy_bandwidth: g.copy_bandwidth,
                    speed: g.speed,
                    compute_committed: permille_to_fraction(c.compute),
                    copy_committed: permille_to_fraction(c.copy),
                    vgpus: inner
                        .vgpus
                        .values()
                        .filter(|v| v.gpu == index && v.holds_resources())
                        .map(|v| v.id)
                        .collect(),
                }
            })
            .collect()
    }

    fn gpu(&self, index: u32) -> Option<&GpuConfig> {
        self.cfg.gpus.get(usize::try_from(index).ok()?)
    }

    // ---- vGPUs ----

    fn validate_vgpu(&self, spec: &VgpuCreate) -> Result<VgpuAsk, ApiError> {
        if spec.memory_bytes == 0 {
            return Err(ApiError::bad(
                "memory_bytes",
                "a vGPU needs some device memory: give memory_bytes > 0",
            ));
        }
        let compute = share("compute_share", spec.compute_share)?;
        let copy = match spec.copy_share {
            Some(c) => share("copy_share", c)?,
            None => compute,
        };
        if spec.queues == 0 || spec.queues > MAX_QUEUES {
            return Err(ApiError::bad(
                "queues",
                format!("{} queues: give 1 to {MAX_QUEUES}", spec.queues),
            ));
        }
        if let Some(g) = &spec.share_group {
            validate_share_group(g)?;
        }
        storage::validate(&spec.storage)?;
        if let Some(g) = spec.gpu {
            let Some(gpu) = self.gpu(g) else {
                return Err(ApiError::bad(
                    "gpu",
                    format!(
                        "there is no GPU {g}: this host has GPUs 0..{} (GET /v1/gpus)",
                        self.cfg.gpus.len().saturating_sub(1)
                    ),
                ));
            };
            if spec.memory_bytes > gpu.memory {
                return Err(ApiError::bad(
                    "memory_bytes",
                    format!(
                        "{} is more than GPU {g} has ({}); ask for less",
                        human_bytes(spec.memory_bytes),
                        human_bytes(gpu.memory)
                    ),
                ));
            }
        } else if self.cfg.gpus.iter().all(|g| spec.memory_bytes > g.memory) {
            return Err(ApiError::bad(
                "memory_bytes",
                format!(
                    "{} is more than any GPU of this host has; ask for less",
                    human_bytes(spec.memory_bytes)
                ),
            ));
        }
        Ok(VgpuAsk {
            gpu: spec.gpu,
            memory: spec.memory_bytes,
            compute,
            copy,
            priority: spec.priority,
            oversubscribe: spec.oversubscribe,
            share_group: spec.share_group.clone(),
            queues: spec.queues,
            storage: spec.storage.clone(),
        })
    }

    /// Why `ask` does not fit on `gpu`, or None when it fits.
    fn misfit(
        &self,
        inner: &Inner,
        gpu: u32,
        ask: &VgpuAsk,
        except: Option<u32>,
    ) -> Option<ApiError> {
        let g = self.gpu(gpu)?;
        let c = inner.committed(gpu, except);
        let free = g.memory.saturating_sub(c.memory);
        // An oversubscribed vGPU's memory is not reserved: it competes for what the hard
        // shares leave, and swaps.
        if !ask.oversubscribe && ask.memory > free {
            return Some(ApiError::conflict(
                "memory_bytes",
                format!(
                    "GPU {gpu} has {} free of {} ({} committed to other vGPUs); ask for at most {} or pick another GPU",
                    human_bytes(free),
                    human_bytes(g.memory),
                    human_bytes(c.memory),
                    human_bytes(free)
                ),
            ));
        }
        for (field, have, want) in [
            ("compute_share", c.compute, ask.compute),
            ("copy_share", c.copy, ask.copy),
        ] {
            if have + want > WHOLE {
                return Some(ApiError::conflict(
                    field,
                    format!(
                        "{field} {} would bring GPU {gpu} to {} ({} already committed); at most {} is left",
                        pct(want),
                        pct(have + want),
                        pct(have),
                        pct(WHOLE - have)
                    ),
                ));
            }
        }
        None
    }

    /// Admits `ask` and inserts its record (state `starting`). Caller holds the lock.
    fn admit(&self, inner: &mut Inner, ask: VgpuAsk, vm: Option<u32>) -> Result<u32, ApiError> {
        let gpu = match ask.gpu {
            Some(g) => {
                if let Some(e) = self.misfit(inner, g, &ask, None) {
                    return Err(e);
                }
                g
            }
            None => {
                let mut fits = Vec::new();
                let mut first_err = None;
                for i in 0..self.cfg.gpus.len() {
                    let g = u32::try_from(i).unwrap_or(u32::MAX);
                    match self.misfit(inner, g, &ask, None) {
                        None => fits.push(g),
                        Some(e) => {
                            first_err.get_or_insert(e);
                        }
                    }
                }
                // By measured load and free memory share (issue 13).
                match self.place_auto(inner, &ask, &fits) {
                    Some(g) => g,
                    None => {
                        let why = first_err.map(|e| e.error).unwrap_or_default();
                        return Err(ApiError::conflict(
                            "gpu",
                            format!("no GPU has room for this vGPU (e.g. {why})"),
                        ));
                    }
                }
            }
        };
        let id = inner.next_vgpu;
        inner.next_vgpu += 1;
        let rec = VgpuRec {
            id,
            gpu,
            memory: ask.memory,
            compute: ask.compute,
            copy: ask.copy,
            priority: ask.priority,
            oversubscribe: ask.oversubscribe,
            share_group: ask.share_group,
            queues: ask.queues,
            storage: ask.storage,
            state: VgpuState::Starting,
            vm,
            owned: vm.is_some(),
            socket: self.cfg.state_dir.join(format!("vgpu-{id}.sock")),
            log: self.cfg.state_dir.join(format!("vgpu-{id}.log")),
            worker: None,
            stopping: false,
            samples: VecDeque::new(),
            memory_report: None,
            migrating_to: None,
            restore_failed: false,
        };
        tracing::info!(
            vgpu = id,
            gpu,
            memory = ask.memory,
            compute = ask.compute,
            copy = ask.copy,
            "vGPU admitted"
        );
        inner.vgpus.insert(id, rec);
        Ok(id)
    }

    /// Creates a vGPU and starts its worker.
    pub async fn create_vgpu(self: &Arc<Self>, spec: VgpuCreate) -> Result<api::Vgpu, ApiError> {
        self.check_running()?;
        let ask = self.validate_vgpu(&spec)?;
        let id = self.admit(&mut self.lock(), ask, None)?;
        if let Err(e) = self.start_worker(id).await {
            self.forget_vgpu(id);
            return Err(e);
        }
        // Answered only once the definition is on disk: a restart keeps it.
        self.save()
            .await
            .map_err(|e| ApiError::unsaved(&format!("vGPU {id} was created"), &e))?;
        self.vgpu(id)
    }

    /// Removes a vGPU record and its files (after its worker is gone).
    fn forget_vgpu(&self, id: u32) {
        if let Some(rec) = self.lock().vgpus.remove(&id) {
            let _ = std::fs::remove_file(&rec.log);
            let _ = std::fs::remove_file(&rec.socket);
        }
        self.mark_dirty();
        self.changed.notify_waiters();
    }

    /// Spawns vGPU `id`'s worker and waits until its socket is bound.
    async fn start_worker(self: &Arc<Self>, id: u32) -> Result<(), ApiError> {
        let (mut cmd, log, fds, gpu) = {
            let inner = self.lock();
            let rec = inner
                .vgpus
                .get(&id)
                .ok_or_else(|| ApiError::internal(format!("vGPU {id} vanished while starting")))?;
            let gpu = self
                .gpu(rec.gpu)
                .ok_or_else(|| ApiError::internal(format!("vGPU {id} is on an unknown GPU")))?;
            let fds = self.attach_grants(id, rec.gpu, rec.compute, rec.copy, rec.priority)?;
            let mut cmd = Command::new(&self.cfg.worker_bin);
            cmd.arg("--socket")
                .arg(&rec.socket)
                .args(["--vgpu-id", &id.to_string()])
                .args(["--memory", &rec.memory.to_string()])
                .args(["--queues", &rec.queues.to_string()])
                .args([
                    "--compute-share",
                    &permille_to_fraction(rec.compute).to_string(),
                ])
                .args(["--copy-share", &permille_to_fraction(rec.copy).to_string()])
                .args(["--priority", &rec.priority.to_string()]);
            if self.cfg.queue_poll_us > 0 {
                cmd.args(["--poll-us", &self.cfg.queue_poll_us.to_string()]);
            }
            match gpu.cuda_ordinal {
                Some(ordinal) => {
                    cmd.args(["--backend", "cuda", "--gpu", &ordinal.to_string()]);
                }
                None => {
                    // An oversubscribed vGPU's sim GPU also holds its swap-area buffers.
                    let sim_memory = if rec.oversubscribe {
                        gpu.memory.saturating_add(self.swap_area(gpu.memory))
                    } else {
                        gpu.memory
                    };
                    cmd.args(["--sim-memory", &sim_memory.to_string()])
                        .args(["--sim-copy-bw", &gpu.copy_bandwidth.to_string()])
                        .args(["--sim-speed", &gpu.speed.to_string()])
                        .args(["--sim-threads", &self.cfg.sim_threads.to_string()]);
                }
            }
            if rec.oversubscribe {
                cmd.arg("--oversubscribe");
            }
            cmd.arg("--shm");
            for s in &rec.storage {
                cmd.arg("--storage").arg(storage::worker_arg(s));
            }
            cmd.args(["--control-fd", &procs::CONTROL_FD.to_string()])
                .args([
                    "--grant-fds",
                    &format!("{},{}", procs::GRANT_PAGE_FD, procs::GRANT_DOORBELL_FD),
                ]);
            if rec.oversubscribe {
                if let Some(m) = self.memory.get(rec.gpu as usize) {
                    lock_planner(&m.planner).join(id, rec.priority);
                }
            }
            (cmd, rec.log.clone(), fds, rec.gpu)
        };
        self.refresh_pool(gpu);
        let log_file = File::create(&log).map_err(|e| {
            ApiError::internal(format!(
                "cannot create the worker log {}: {e}",
                log.display()
            ))
        })?;
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(log_file))
            .env("NO_COLOR", "1");
        let (ours, theirs) = procs::socketpair()
            .map_err(|e| ApiError::internal(format!("cannot create a control socket: {e}")))?;
        let extra = [
            (&fds.page, procs::GRANT_PAGE_FD),
            (&fds.doorbell, procs::GRANT_DOORBELL_FD),
        ];
        let (child, proc) =
            procs::spawn_with_fds(&mut cmd, Some(&theirs), &extra).map_err(|e| {
                self.detach_grants(id, gpu);
                ApiError::internal(format!(
                    "cannot start {}: {e}; check vgpud's --worker-bin",
                    self.cfg.worker_bin.display()
                ))
            })?;
        drop(theirs);
        drop(fds);
        let weak = Arc::downgrade(self);
        let on_event = move |e: link::Event| {
            if let Some(d) = weak.upgrade() {
                match e {
                    link::Event::Connected => d.on_connected(id),
                    link::Event::Final(stats) => d.record_sample(id, stats),
                    link::Event::Memory(m) => d.on_memory(id, m),
                    link::Event::Migration(p) => d.on_migration_progress(id, p),
                    link::Event::Ask { id: ask_id, ask } => {
                        tokio::spawn(async move {
                            let (answer, fd) = d.answer(id, ask).await;
                            let link = d.link_of(id);
                            if let Some(link) = link {
                                if let Err(e) =
                                    link.tell(Ctl::Answer { to: ask_id, answer }, fd).await
                                {
                                    tracing::debug!(vgpu = id, error = %e, "answer not delivered");
                                }
                            }
                        });
                    }
                }
            }
        };
        let (link, ready) = match link::start(std::os::unix::net::UnixStream::from(ours), on_event)
        {
            Ok(v) => v,
            Err(e) => {
                proc.signal(libc::SIGKILL);
                return Err(ApiError::internal(format!("control channel: {e}")));
            }
        };
        tracing::info!(vgpu = id, pid = proc.pid, "worker started");
        if let Some(rec) = self.lock().vgpus.get_mut(&id) {
            rec.worker = Some(WorkerHandle {
                proc: proc.clone(),
                link,
            });
        }
        let d = self.clone();
        let p = proc.clone();
        tokio::spawn(async move {
            let status = procs::reap(child, &p).await;
            d.on_worker_exit(id, p.pid, status);
        });
        match tokio::time::timeout(WORKER_START, ready).await {
            Ok(Ok(_pid)) => {
                if let Some(rec) = self.lock().vgpus.get_mut(&id) {
                    if rec.state == VgpuState::Starting {
                        rec.state = VgpuState::Ready;
                    }
                }
                self.changed.notify_waiters();
                tracing::info!(vgpu = id, "worker ready");
                Ok(())
            }
            Ok(Err(_)) => {
                // The channel closed: the worker exited. Wait for the reaper's verdict.
                self.wait_until(Duration::from_secs(2), |i| {
                    i.vgpus.get(&id).is_none_or(|r| r.worker.is_none())
                })
                .await;
                let why = match self.lock().vgpus.get(&id).map(|r| r.state.clone()) {
                    Some(VgpuState::Failed { reason }) => reason,
                    _ => format!("the worker exited before it was ready{}", log_tail(&log)),
                };
                Err(ApiError::internal(why))
            }
            Err(_) => {
                proc.signal(libc::SIGKILL);
                Err(ApiError::internal(format!(
                    "the worker did not bind its socket within {} s{}",
                    WORKER_START.as_secs(),
                    log_tail(&log)
                )))
            }
        }
    }

    // ---- device memory: oversubscription and shared objects ----

    /// Bytes of GPU memory (of `memory` in all) kept as the swap area.
    fn swap_area(&self, memory: u64) -> u64 {
        (memory as f64 * self.cfg.swap_area) as u64
    }

    /// Recomputes GPU `gpu`'s oversubscription pool: what hard shares and shared objects
    /// leave, less the swap area.
    fn refresh_pool(&self, gpu: u32) {
        let (Some(g), Some(m)) = (self.gpu(gpu), self.memory.get(gpu as usize)) else {
            return;
        };
        let hard = self.lock().committed(gpu, None).memory;
        let shm = self.shm_lock().bytes_on(gpu);
        let left = g.memory.saturating_sub(hard).saturating_sub(shm);
        let swap = self.swap_area(g.memory).min(left);
        lock_planner(&m.planner).resize(left - swap, swap);
    }

    fn shm_lock(&self) -> MutexGuard<'_, shm::Registry> {
        self.shm.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn link_of(&self, id: u32) -> Option<Link> {
        self.lock()
            .vgpus
            .get(&id)
            .and_then(|r| r.worker.as_ref().map(|w| w.link.clone()))
    }

    fn on_memory(&self, id: u32, m: MemReport) {
        let pools = {
            let mut inner = self.lock();
            let Some(rec) = inner.vgpus.get_mut(&id) else {
                return;
            };
            rec.memory_report = Some(m);
            rec.pools()
        };
        for gpu in pools {
            if let Some(g) = self.memory.get(gpu as usize) {
                lock_planner(&g.planner).update(id, m.into());
            }
        }
    }

    /// Answers a worker's question.
    async fn answer(&self, id: u32, ask: Ask) -> (Answer, Option<std::os::fd::OwnedFd>) {
        let (gpu, group) = match self.lock().vgpus.get(&id) {
            Some(r) => (r.gpu, r.share_group.clone()),
            None => {
                return (
                    Answer::Refused {
                        why: format!("vGPU {id} is gone"),
                    },
                    None,
                )
            }
        };
        let who = shm::Asker {
            vgpu: id,
            gpu,
            group: group.as_deref(),
        };
        let shm_answer = |r: Result<[u64; 4], (crate::control::ShmFailure, String)>| match r {
            Ok(values) => Answer::Values { values },
            Err((failure, message)) => Answer::ShmError { failure, message },
        };
        match ask {
            Ask::Reserve { bytes } => (self.reserve(id, bytes).await, None),
            Ask::ShmGet { key, size, flags } => {
                let free = self.shm_free(gpu);
                let sim = self.gpu(gpu).is_some_and(|g| g.cuda_ordinal.is_none());
                let r = self.shm_lock().get(&who, key, size, flags, free, |size| {
                    if sim {
                        vgpu_backend::sim::shared_object(size).map_err(|e| e.to_string())
                    } else {
                        Err("shared device memory on CUDA GPUs needs exportable allocation handles, which this build does not create yet; use a sim GPU".into())
                    }
                });
                self.refresh_pool(gpu);
                (shm_answer(r.map(|id| [id, 0, 0, 0])), None)
            }
            Ask::ShmAttach { shmid } => match self.shm_lock().attach(&who, shmid) {
                Ok((fd, size)) => (Answer::Attach { size }, Some(fd)),
                Err((failure, message)) => (Answer::ShmError { failure, message }, None),
            },
            Ask::ShmDetach { shmid } => {
                let r = self.shm_lock().detach(id, shmid).map(|()| [0; 4]);
                self.refresh_pool(gpu);
                (shm_answer(r), None)
            }
            Ask::ShmCtl { shmid, cmd } => {
                let r = self.shm_lock().ctl(&who, shmid, cmd);
                self.refresh_pool(gpu);
                (shm_answer(r), None)
            }
        }
    }

    /// Device memory GPU `gpu` has left for a new shared object.
    fn shm_free(&self, gpu: u32) -> u64 {
        let Some(g) = self.gpu(gpu) else { return 0 };
        let hard = self.lock().committed(gpu, None).memory;
        let shm = self.shm_lock().bytes_on(gpu);
        let resident = self
            .memory
            .get(gpu as usize)
            .map_or(0, |m| lock_planner(&m.planner).resident());
        g.memory
            .saturating_sub(hard)
            .saturating_sub(shm)
            .saturating_sub(self.swap_area(g.memory))
            .saturating_sub(resident)
    }

    /// Makes room for `bytes` more resident memory of oversubscribed vGPU `id` in every
    /// pool its memory is in (its GPU's, and during a migration the target's too: the
    /// copy puts every resident byte there), swapping out other vGPUs' (or its own idle)
    /// memory as each plan says.
    ///
    /// The pools are read when each is planned, not when the worker asked: a migration
    /// may finish while the reservation waits for a pool (another reservation holds it),
    /// and then the vGPU's memory is no longer on the GPU it left.
    async fn reserve(&self, id: u32, bytes: u64) -> Answer {
        let mut done: Vec<u32> = Vec::new();
        let mut granted = false;
        loop {
            let Some(pools) = self.lock().vgpus.get(&id).map(VgpuRec::pools) else {
                return Answer::Refused {
                    why: format!("vGPU {id} is gone"),
                };
            };
            let Some(gpu) = pools.into_iter().find(|g| !done.contains(g)) else {
                break;
            };
            match self.reserve_on(id, gpu, bytes).await {
                Reserved::Granted => granted = true,
                // It left that pool meanwhile (its migration finished or failed).
                Reserved::NotMember => {}
                Reserved::Refused(why) => return Answer::Refused { why },
            }
            done.push(gpu);
        }
        if granted {
            Answer::Granted
        } else {
            let why = format!("vGPU {id} is in no GPU's memory pool (pools tried: {done:?})");
            tracing::warn!(vgpu = id, bytes, %why, "memory reservation refused");
            Answer::Refused { why }
        }
    }

    /// [`Daemon::reserve`] on GPU `gpu`'s pool.
    async fn reserve_on(&self, id: u32, gpu: u32, bytes: u64) -> Reserved {
        let Some(m) = self.memory.get(gpu as usize) else {
            return Reserved::Refused(format!("vGPU {id} is on an unknown GPU {gpu}"));
        };
        let _one = m.serial.lock().await;
        let mut tried = Tried::default();
        let mut busy_retries = 0;
        loop {
            let step = {
                let p = lock_planner(&m.planner);
                if p.member(id).is_none() {
                    return Reserved::NotMember;
                }
                p.next_step(id, bytes, &tried)
            };
            match step {
                Step::Grant => {
                    lock_planner(&m.planner).grant(id, bytes);
                    return Reserved::Granted;
                }
                Step::Deny(why) => {
                    // Victims that gave nothing were busy (their memory is in use by a
                    // copy or kernel right now): wait for them (up to 10 s) before refusing.
                    if !tried.evict.is_empty() && busy_retries < BUSY_RETRIES {
                        busy_retries += 1;
                        tried = Tried::default();
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        continue;
                    }
                    tracing::info!(vgpu = id, gpu, bytes, %why, "memory reservation refused");
                    return Reserved::Refused(why);
                }
                Step::Evict {
                    victim,
                    bytes: want,
                    tier,
                } => {
                    let freed = match self.link_of(victim) {
                        Some(l) => match l
                            .call(
                                Ctl::Evict {
                                    bytes: want,
                                    tier: tier.into(),
                                },
                                SWAP_TIMEOUT,
                            )
                            .await
                        {
                            Ok(ReplyBody::Evicted { freed, memory }) => {
                                self.on_memory(victim, memory);
                                freed
                            }
                            Ok(other) => {
                                tracing::warn!(vgpu = victim, ?other, "eviction not done");
                                0
                            }
                            Err(e) => {
                                tracing::warn!(vgpu = victim, error = %e, "eviction failed");
                                0
                            }
                        },
                        None => 0,
                    };
                    tracing::debug!(
                        vgpu = id,
                        victim,
                        want,
                        freed,
                        ?tier,
                        "evicted for a reservation"
                    );
                    if freed == 0 {
                        tried.evict.push(victim);
                    }
                }
                Step::Spill {
                    victim,
                    bytes: want,
                } => {
                    let moved = match self.link_of(victim) {
                        Some(l) => match l.call(Ctl::Spill { bytes: want }, SWAP_TIMEOUT).await {
                            Ok(ReplyBody::Spilled { moved, memory }) => {
                                self.on_memory(victim, memory);
                                moved
                            }
                            _ => 0,
                        },
                        None => 0,
                    };
                    if moved == 0 {
                        tried.spill.push(victim);
                    }
                }
            }
        }
    }

    /// Shared objects, for the API.
    pub fn shm_objects(&self) -> Vec<api::ShmObject> {
        self.shm_lock()
            .objects()
            .map(|o| api::ShmObject {
                id: o.id,
                key: o.key,
                size_bytes: o.size,
                gpu: o.gpu,
                share_group: o.group.clone(),
                creator_vgpu: o.creator,
                attachments: o.attachments(),
                attached_vgpus: o.attached.keys().copied().collect(),
                removed: o.removed,
            })
            .collect()
    }

    /// Per-GPU memory pool figures, for the API.
    fn pool_of(&self, gpu: u32) -> (u64, u64, u64, u64) {
        self.memory.get(gpu as usize).map_or((0, 0, 0, 0), |m| {
            let p = lock_planner(&m.planner);
            (p.capacity(), p.resident(), p.swap_area(), p.device_swap())
        })
    }

    // ---- live migration ----

    /// Starts moving vGPU `id` to another GPU; the migration runs on.
    pub async fn migrate_vgpu(
        self: &Arc<Self>,
        id: u32,
        req: api::MigrateRequest,
    ) -> Result<api::Migration, ApiError> {
        self.check_running()?;
        let mode = match req.mode.as_deref().unwrap_or("precopy") {
            "precopy" => MigrationMode::Precopy,
            "stop_copy" => MigrationMode::StopCopy,
            other => {
                return Err(ApiError::bad(
                    "mode",
                    format!("{other:?}: use \"precopy\" or \"stop_copy\""),
                ))
            }
        };
        let max_downtime_ms = req.max_downtime_ms.unwrap_or(50);
        if max_downtime_ms == 0 || max_downtime_ms > 600_000 {
            return Err(ApiError::bad(
                "max_downtime_ms",
                format!("{max_downtime_ms}: give 1 to 600000 ms"),
            ));
        }
        let (mid, source, target, link, target_gpu) = {
            let mut inner = self.lock();
            let rec = inner.vgpus.get(&id).ok_or_else(|| no_vgpu(id))?;
            if !matches!(rec.state, VgpuState::Ready | VgpuState::Attached) || rec.worker.is_none()
            {
                return Err(ApiError::conflict(
                    "id",
                    format!(
                        "vGPU {id} is not running (state {:?}); only a live vGPU migrates",
                        rec.state
                    ),
                ));
            }
            if rec.migrating_to.is_some() {
                return Err(ApiError::conflict(
                    "id",
                    format!("vGPU {id} is already migrating; follow GET /v1/migrations"),
                ));
            }
            let source = rec.gpu;
            let ask = VgpuAsk {
                gpu: None,
                memory: rec.memory,
                compute: rec.compute,
                copy: rec.copy,
                priority: rec.priority,
                oversubscribe: rec.oversubscribe,
                share_group: None,
                queues: rec.queues,
                storage: Vec::new(),
            };
            let link = rec
                .worker
                .as_ref()
                .map(|w| w.link.clone())
                .ok_or_else(|| ApiError::conflict("id", format!("vGPU {id} has no worker")))?;
            let target = match req.target_gpu {
                Some(t) => {
                    if self.gpu(t).is_none() {
                        return Err(ApiError::bad(
                            "target_gpu",
                            format!(
                                "there is no GPU {t}: this host has GPUs 0..{} (GET /v1/gpus)",
                                self.cfg.gpus.len().saturating_sub(1)
                            ),
                        ));
                    }
                    if t != source {
                        if let Some(e) = self.misfit(&inner, t, &ask, Some(id)) {
                            return Err(ApiError::conflict(
                                "target_gpu",
                                format!(
                                    "GPU {t} cannot take vGPU {id}; it stays on GPU {source}: {}",
                                    e.error
                                ),
                            ));
                        }
                    }
                    t
                }
                None => {
                    let mut best: Option<(u32, u32)> = None;
                    for i in 0..self.cfg.gpus.len() {
                        let g = u32::try_from(i).unwrap_or(u32::MAX);
                        if g != source && self.misfit(&inner, g, &ask, Some(id)).is_none() {
                            let load = inner.committed(g, None).compute;
                            if best.is_none_or(|(_, l)| load < l) {
                                best = Some((g, load));
                            }
                        }
                    }
                    best.map(|(g, _)| g).ok_or_else(|| {
                        ApiError::conflict(
                            "target_gpu",
                            format!(
                                "no other GPU has room for vGPU {id}; it stays on GPU {source}"
                            ),
                        )
                    })?
                }
            };
            if rec.oversubscribe && target != source {
                let resident = rec.memory_report.map_or(0, |m| m.resident);
                let pool = self.pool_of(target);
                if resident > pool.0.saturating_sub(pool.1) {
                    return Err(ApiError::conflict(
                        "target_gpu",
                        format!(
                            "GPU {target} has {} free for oversubscribed vGPUs, vGPU {id} holds {} resident; it stays on GPU {source}",
                            human_bytes(pool.0.saturating_sub(pool.1)),
                            human_bytes(resident)
                        ),
                    ));
                }
            }
            let g = self
                .gpu(target)
                .ok_or_else(|| ApiError::internal("target GPU vanished"))?;
            let target_gpu = TargetGpu {
                gpu: target,
                cuda_ordinal: g.cuda_ordinal,
                sim_memory: if rec.oversubscribe {
                    g.memory.saturating_add(self.swap_area(g.memory))
                } else {
                    g.memory
                },
                sim_copy_bw: g.copy_bandwidth,
                sim_speed: g.speed,
                sim_threads: self.cfg.sim_threads,
            };
            let mid = inner.next_migration;
            inner.next_migration += 1;
            self.mark_dirty();
            self.begin_move(&mut inner, id, target);
            let m = api::Migration {
                id: mid,
                vgpu: id,
                source_gpu: source,
                target_gpu: target,
                mode: req.mode.clone().unwrap_or_else(|| "precopy".into()),
                state: "running".into(),
                phase: "starting".into(),
                rounds: 0,
                bytes: 0,
                total_bytes: 0,
                dirty_bytes: 0,
                downtime_ms: None,
                elapsed_ms: 0.0,
                error: None,
                timeline: Vec::new(),
            };
            inner.migrations.insert(mid, m);
            (mid, source, target, link, target_gpu)
        };
        // The target GPU's scheduler takes the vGPU's shares; its grant channel rides to
        // the worker with the command.
        let fds = if target != source {
            let (compute, copy, priority) = {
                let inner = self.lock();
                let r = inner.vgpus.get(&id).ok_or_else(|| no_vgpu(id))?;
                (r.compute, r.copy, r.priority)
            };
            // Back to a GPU it left moments ago: its old channel there (kept for a grace
            // period) goes first.
            self.detach_grants(id, target);
            match self.attach_grants(id, target, compute, copy, priority) {
                Ok(f) => vec![f.page, f.doorbell],
                Err(e) => {
                    self.finish_migration(mid, id, Err(e.error.clone()), source, target);
                    return Err(e);
                }
            }
        } else {
            Vec::new()
        };
        let grant_fds = !fds.is_empty();
        tracing::info!(
            vgpu = id,
            migration = mid,
            source,
            target,
            ?mode,
            "migration started"
        );
        let d = self.clone();
        tokio::spawn(async move {
            let r = link
                .call_with_fds(
                    Ctl::Migrate {
                        target: target_gpu,
                        mode,
                        max_downtime_ms,
                        grant_fds,
                    },
                    fds,
                    MIGRATION_TIMEOUT,
                )
                .await;
            let r = match r {
                Ok(ReplyBody::Migrated { report }) => Ok(report),
                Ok(ReplyBody::Error { message }) => Err(message),
                Ok(other) => Err(format!("unexpected reply {other:?}")),
                Err(e) => Err(e),
            };
            d.finish_migration(mid, id, r, source, target);
        });
        self.migration(mid)
    }

    /// Records that vGPU `id` is moving to GPU `target`: its shares count there from now
    /// on, and an oversubscribed vGPU's memory joins the target's pool, because the copy
    /// puts its resident bytes there and from the switch on its reservations are for that
    /// GPU (vgpud hears of the switch only when the migration reports back). Caller holds
    /// `inner`.
    fn begin_move(&self, inner: &mut Inner, id: u32, target: u32) {
        let Some(rec) = inner.vgpus.get_mut(&id) else {
            return;
        };
        rec.migrating_to = Some(target);
        if rec.oversubscribe && target != rec.gpu {
            if let Some(m) = self.memory.get(target as usize) {
                let mut p = lock_planner(&m.planner);
                p.join(id, rec.priority);
                if let Some(r) = rec.memory_report {
                    p.update(id, r.into());
                }
            }
        }
    }

    fn finish_migration(
        self: &Arc<Self>,
        mid: u32,
        id: u32,
        r: Result<crate::control::MigrationDone, String>,
        source: u32,
        target: u32,
    ) {
        let moved = r.is_ok();
        {
            let mut inner = self.lock();
            if let Some(rec) = inner.vgpus.get_mut(&id) {
                rec.migrating_to = None;
                if moved {
                    rec.gpu = target;
                }
            }
            if let Some(m) = inner.migrations.get_mut(&mid) {
                match &r {
                    Ok(rep) => {
                        m.state = "completed".into();
                        m.phase = "done".into();
                        m.rounds = rep.rounds;
                        m.bytes = rep.precopy_bytes + rep.stop_bytes;
                        m.total_bytes = rep.total;
                        m.dirty_bytes = 0;
                        m.downtime_ms = Some(rep.downtime_ms);
                        m.elapsed_ms = rep.elapsed_ms;
                        m.timeline = rep
                            .timeline
                            .iter()
                            .map(|(p, a, b)| api::MigrationSpan {
                                phase: p.clone(),
                                start_ms: *a,
                                end_ms: *b,
                            })
                            .collect();
                    }
                    Err(why) => {
                        m.state = "failed".into();
                        m.error = Some(why.clone());
                    }
                }
            }
        }
        if source != target {
            // The GPU the vGPU left (or never reached) lets its shares and its memory
            // pool go (an oversubscribed vGPU joined the target's at the start).
            let leave = if moved { source } else { target };
            self.detach_grants_later(id, leave);
            {
                let inner = self.lock();
                let back = inner
                    .vgpus
                    .get(&id)
                    .is_some_and(|r| r.pools().contains(&leave));
                if !back {
                    if let Some(a) = self.memory.get(leave as usize) {
                        lock_planner(&a.planner).leave(id);
                    }
                }
            }
            self.refresh_pool(source);
            self.refresh_pool(target);
        }
        match &r {
            Ok(rep) => tracing::info!(
                vgpu = id,
                migration = mid,
                source,
                target,
                downtime_ms = rep.downtime_ms,
                total_ms = rep.elapsed_ms,
                "migration completed"
            ),
            Err(why) => tracing::warn!(vgpu = id, migration = mid, source, target, %why,
                "migration failed; the vGPU stays on its source"),
        }
        // Its GPU changed (or not): the state file says where it is.
        self.mark_dirty();
        self.changed.notify_waiters();
    }

    /// The GPU the vGPU left lets its shares go at once: the worker's requests that were
    /// still waiting for a grant there moved to the new GPU's channel at the switch
    /// (`SwitchGate` retires the old one), and a lingering attachment would keep its
    /// share counted there (new vGPUs refused, neighbours held behind grants nobody
    /// takes).
    fn detach_grants_later(self: &Arc<Self>, id: u32, gpu: u32) {
        let back = self
            .lock()
            .vgpus
            .get(&id)
            .is_some_and(|r| r.gpu == gpu || r.migrating_to == Some(gpu));
        if !back {
            self.detach_grants(id, gpu);
        }
    }

    fn on_migration_progress(&self, id: u32, p: MigrationProgress) {
        let mut inner = self.lock();
        if let Some(m) = inner
            .migrations
            .values_mut()
            .rev()
            .find(|m| m.vgpu == id && m.state == "running")
        {
            m.phase = p.phase;
            m.rounds = p.rounds;
            m.bytes = p.bytes;
            m.total_bytes = p.total;
            m.dirty_bytes = p.dirty;
            m.elapsed_ms = p.elapsed_ms;
        }
    }

    /// One migration.
    pub fn migration(&self, id: u32) -> Result<api::Migration, ApiError> {
        self.lock().migrations.get(&id).cloned().ok_or_else(|| {
            ApiError::not_found(
                "id",
                format!("no migration {id}; list them with GET /v1/migrations"),
            )
        })
    }

    /// Every migration.
    pub fn migrations(&self) -> Vec<api::Migration> {
        self.lock().migrations.values().cloned().collect()
    }

    fn on_connected(&self, vgpu: u32) {
        let mut inner = self.lock();
        let vm = inner.vgpus.get(&vgpu).and_then(|r| r.vm);
        if let Some(vm) = vm.and_then(|v| inner.vms.get_mut(&v)) {
            if vm.state == VmState::Starting {
                vm.state = VmState::Running;
                tracing::info!(vm = vm.id, vgpu, "VM running (its vGPU is connected)");
            }
        }
        drop(inner);
        self.changed.notify_waiters();
    }

    fn on_worker_exit(&self, id: u32, pid: u32, status: ExitStatus) {
        let how = procs::describe(&status);
        let mut inner = self.lock();
        let Some(rec) = inner.vgpus.get_mut(&id) else {
            return;
        };
        if rec.worker.as_ref().map(|w| w.proc.pid) != Some(pid) {
            return;
        }
        rec.worker = None;
        self.detach_grants(id, rec.gpu);
        let gpu_of_rec = rec.gpu;
        for gpu in rec.pools() {
            if let Some(m) = self.memory.get(gpu as usize) {
                lock_planner(&m.planner).leave(id);
            }
        }
        let vm = rec.vm;
        let stopping = rec.stopping;
        let was = rec.state.clone();
        let log = rec.log.clone();
        // A worker exits 0 when its vmm disconnects (the VM ended; its exit may be reaped a
        // moment later) or when told to stop; anything else is a crash.
        let new_state = if stopping || (was == VgpuState::Attached && status.success()) {
            VgpuState::Released
        } else {
            let reason = match was {
                VgpuState::Starting => {
                    format!("the worker exited while starting ({how}){}", log_tail(&log))
                }
                _ => format!("the worker exited unexpectedly ({how}){}", log_tail(&log)),
            };
            match &was {
                VgpuState::Failed { reason } => VgpuState::Failed {
                    reason: reason.clone(),
                },
                VgpuState::Released => VgpuState::Released,
                _ => VgpuState::Failed { reason },
            }
        };
        if let VgpuState::Failed { reason } = &new_state {
            tracing::warn!(vgpu = id, pid, %reason, "vGPU failed");
        } else {
            tracing::info!(vgpu = id, pid, how, "worker exited; vGPU released");
        }
        if let Some(rec) = inner.vgpus.get_mut(&id) {
            rec.state = new_state.clone();
        }
        if let (VgpuState::Failed { reason }, Some(vm_id)) = (&new_state, vm) {
            if let Some(v) = inner.vms.get_mut(&vm_id) {
                if v.state.is_live() {
                    v.state = VmState::Failed {
                        reason: format!("its vGPU {id} failed: {reason}"),
                    };
                    if let Some(p) = &v.proc {
                        p.signal(libc::SIGTERM);
                        let p = p.clone();
                        tokio::spawn(async move {
                            tokio::time::sleep(STOP_GRACE).await;
                            p.signal(libc::SIGKILL);
                        });
                    }
                }
            }
        }
        let alive: Vec<(u32, String)> = inner
            .vgpus
            .values()
            .filter(|r| r.id != id && r.worker.is_some())
            .filter_map(|r| r.share_group.clone().map(|g| (r.gpu, g)))
            .collect();
        drop(inner);
        self.shm_lock().vgpu_gone(id, |gpu, group| {
            alive.iter().any(|(g, n)| *g == gpu && n == group)
        });
        self.refresh_pool(gpu_of_rec);
        self.mark_dirty();
        self.changed.notify_waiters();
    }

    fn vgpu(&self, id: u32) -> Result<api::Vgpu, ApiError> {
        self.lock()
            .vgpus
            .get(&id)
            .map(VgpuRec::view)
            .ok_or_else(|| no_vgpu(id))
    }

    /// One vGPU.
    pub fn get_vgpu(&self, id: u32) -> Result<api::Vgpu, ApiError> {
        self.vgpu(id)
    }

    /// Every vGPU.
    pub fn list_vgpus(&self) -> Vec<api::Vgpu> {
        self.lock().vgpus.values().map(VgpuRec::view).collect()
    }

    /// Changes shares and priority at run time and tells the worker.
    pub async fn patch_vgpu(&self, id: u32, patch: VgpuPatch) -> Result<api::Vgpu, ApiError> {
        self.check_running()?;
        let compute = patch
            .compute_share
            .map(|v| share("compute_share", v))
            .transpose()?;
        let copy = patch
            .copy_share
            .map(|v| share("copy_share", v))
            .transpose()?;
        let (old, new, link) = {
            let mut inner = self.lock();
            let rec = inner.vgpus.get(&id).ok_or_else(|| no_vgpu(id))?;
            if !rec.holds_resources() {
                return Err(ApiError::conflict(
                    "id",
                    format!("vGPU {id} is no longer live (its worker is gone); create a new vGPU"),
                ));
            }
            let old = (rec.compute, rec.copy, rec.priority);
            let new = (
                compute.unwrap_or(rec.compute),
                copy.unwrap_or(rec.copy),
                patch.priority.unwrap_or(rec.priority),
            );
            let ask = VgpuAsk {
                gpu: Some(rec.gpu),
                memory: 0,
                compute: new.0,
                copy: new.1,
                priority: new.2,
                oversubscribe: false,
                share_group: None,
                queues: 1,
                storage: Vec::new(),
            };
            if let Some(e) = self.misfit(&inner, rec.gpu, &ask, Some(id)) {
                return Err(e);
            }
            let rec = inner.vgpus.get_mut(&id).ok_or_else(|| no_vgpu(id))?;
            (rec.compute, rec.copy, rec.priority) = new;
            if rec.oversubscribe {
                if let Some(m) = self.memory.get(rec.gpu as usize) {
                    lock_planner(&m.planner).join(id, new.2);
                }
            }
            (old, new, rec.worker.as_ref().map(|w| w.link.clone()))
        };
        if let Some(link) = link {
            let cmd = Ctl::SetShares {
                compute_share: new.0,
                copy_share: new.1,
                priority: new.2,
            };
            let res = link.call(cmd, CONTROL_TIMEOUT).await;
            let err = match res {
                Ok(ReplyBody::SharesSet { .. }) => None,
                Ok(ReplyBody::Error { message }) => Some(message),
                Ok(other) => Some(format!("unexpected reply {other:?}")),
                Err(e) => Some(e),
            };
            if let Some(why) = err {
                if let Some(rec) = self.lock().vgpus.get_mut(&id) {
                    (rec.compute, rec.copy, rec.priority) = old;
                }
                // A save in between may have caught the new values.
                self.mark_dirty();
                return Err(ApiError::worker(format!(
                    "vGPU {id}'s worker did not take the new shares ({why}); nothing changed"
                )));
            }
        }
        let gpu = self.lock().vgpus.get(&id).map(|r| r.gpu);
        if let Some(server) = gpu.and_then(|g| self.grants.get(g as usize)) {
            let share = |permille: u32| Share {
                fraction: permille_to_fraction(permille),
                priority: new.2,
            };
            if let Err(e) = server.set_shares(id, share(new.0), share(new.1)) {
                // Admission already checked the sums; this only fails for a vGPU whose
                // worker just went away.
                tracing::warn!(vgpu = id, "the scheduler did not take the new shares: {e}");
            }
        }
        tracing::info!(
            vgpu = id,
            compute = new.0,
            copy = new.1,
            priority = new.2,
            "vGPU shares changed"
        );
        // Answered only once the new shares are on disk: a restart keeps them.
        self.save()
            .await
            .map_err(|e| ApiError::unsaved(&format!("vGPU {id}'s change was made"), &e))?;
        self.vgpu(id)
    }

    /// Stops a vGPU's worker (if any) and removes the vGPU.
    pub async fn delete_vgpu(&self, id: u32) -> Result<(), ApiError> {
        let proc = {
            let mut inner = self.lock();
            let rec = inner.vgpus.get(&id).ok_or_else(|| no_vgpu(id))?;
            if let Some(vm) = rec.vm {
                if inner.vms.get(&vm).is_some_and(|v| v.state.is_live()) {
                    return Err(ApiError::conflict(
                        "id",
                        format!(
                            "vGPU {id} is in use by running VM {vm}; DELETE /v1/vms/{vm} first"
                        ),
                    ));
                }
            }
            let rec = inner.vgpus.get_mut(&id).ok_or_else(|| no_vgpu(id))?;
            rec.stopping = true;
            rec.worker
                .as_ref()
                .map(|w| (w.proc.clone(), w.link.clone()))
        };
        if let Some((p, link)) = proc {
            self.stop_worker(id, &p, &link).await;
        }
        let vm = self.lock().vgpus.get(&id).and_then(|r| r.vm);
        if let Some(vm) = vm {
            if let Some(v) = self.lock().vms.get_mut(&vm) {
                v.vgpu = None;
            }
        }
        self.forget_vgpu(id);
        tracing::info!(vgpu = id, "vGPU deleted");
        self.save()
            .await
            .map_err(|e| ApiError::unsaved(&format!("vGPU {id} was deleted"), &e))
    }

    /// Asks worker `id` to shut down over its control channel; falls back to signals.
    async fn stop_worker(&self, id: u32, p: &Proc, link: &Link) {
        let gone = |i: &Inner| i.vgpus.get(&id).is_none_or(|r| r.worker.is_none());
        match link.call(Ctl::Shutdown, STOP_GRACE).await {
            Ok(ReplyBody::ShuttingDown) => {
                if self.wait_until(STOP_GRACE * 2, gone).await {
                    return;
                }
                tracing::warn!(vgpu = id, pid = p.pid, "worker did not exit after shutdown");
            }
            Ok(other) => tracing::warn!(vgpu = id, reply = ?other, "unexpected reply to shutdown"),
            Err(e) => {
                tracing::debug!(vgpu = id, error = %e, "shutdown over the control channel failed")
            }
        }
        self.stop_proc(p, gone).await;
    }

    /// SIGTERM, then SIGKILL after the grace period, until `gone` holds.
    async fn stop_proc(&self, p: &Proc, mut gone: impl FnMut(&Inner) -> bool) {
        p.signal(libc::SIGTERM);
        if !self.wait_until(STOP_GRACE * 4, &mut gone).await {
            tracing::warn!(pid = p.pid, "did not stop after SIGTERM; sending SIGKILL");
            p.signal(libc::SIGKILL);
            self.wait_until(Duration::from_secs(2), gone).await;
        }
    }

    /// Counters and utilization of one vGPU (fresh from its worker when it runs).
    pub async fn vgpu_stats(&self, id: u32) -> Result<api::VgpuStats, ApiError> {
        let link = {
            let inner = self.lock();
            let rec = inner.vgpus.get(&id).ok_or_else(|| no_vgpu(id))?;
            rec.worker.as_ref().map(|w| w.link.clone())
        };
        if let Some(link) = link {
            if let Ok(ReplyBody::Stats { stats }) = link.call(Ctl::Stats, CONTROL_TIMEOUT).await {
                self.record_sample(id, stats);
            }
        }
        let inner = self.lock();
        let rec = inner.vgpus.get(&id).ok_or_else(|| no_vgpu(id))?;
        Ok(self.stats_of(rec))
    }

    fn record_sample(&self, id: u32, s: WorkerStats) {
        let keep_ns = u64::try_from(self.cfg.stats_window.as_nanos())
            .unwrap_or(u64::MAX)
            .saturating_mul(2);
        if let Some(rec) = self.lock().vgpus.get_mut(&id) {
            // A vGPU has one worker for its life, so its clock only moves forward; a sample
            // older than the newest one lost a race with a concurrent query: drop it.
            if rec
                .samples
                .back()
                .is_some_and(|b| b.uptime_ns >= s.uptime_ns)
            {
                return;
            }
            rec.samples.push_back(s);
            while rec
                .samples
                .front()
                .is_some_and(|f| s.uptime_ns.saturating_sub(f.uptime_ns) > keep_ns)
            {
                rec.samples.pop_front();
            }
        }
    }

    fn stats_of(&self, rec: &VgpuRec) -> api::VgpuStats {
        let window_ns = u64::try_from(self.cfg.stats_window.as_nanos()).unwrap_or(u64::MAX);
        let last = rec.samples.back().copied().unwrap_or_default();
        let first = rec
            .samples
            .iter()
            .find(|s| last.uptime_ns.saturating_sub(s.uptime_ns) <= window_ns)
            .copied()
            .unwrap_or(last);
        let dt = last.uptime_ns.saturating_sub(first.uptime_ns);
        let bw = self.gpu(rec.gpu).map_or(0, |g| g.copy_bandwidth);
        let (compute, copy) = if dt == 0 {
            (0.0, (bw > 0).then_some(0.0))
        } else {
            let secs = dt as f64 / 1e9;
            let k = last.kernel_ns.saturating_sub(first.kernel_ns) as f64 / dt as f64;
            let bytes = (last.bytes_htod + last.bytes_dtoh)
                .saturating_sub(first.bytes_htod + first.bytes_dtoh) as f64;
            (k, (bw > 0).then(|| bytes / (bw as f64 * secs)))
        };
        let live = rec.worker.is_some() && !rec.samples.is_empty();
        api::VgpuStats {
            vgpu: rec.id,
            gpu: rec.gpu,
            live,
            window_ms: dt / 1_000_000,
            compute_utilization: compute,
            copy_utilization: copy,
            memory_share_bytes: rec.memory,
            memory_used_bytes: last.memory_used,
            memory_resident_bytes: rec.memory_report.map_or(last.memory_used, |m| m.resident),
            memory_swapped_bytes: rec.memory_report.map_or(0, |m| m.device_swap + m.host_swap),
            memory_device_swap_bytes: rec.memory_report.map_or(0, |m| m.device_swap),
            swap_out_bytes: rec.memory_report.map_or(0, |m| m.swap_out_bytes),
            swap_in_bytes: rec.memory_report.map_or(0, |m| m.swap_in_bytes),
            swap_out_ms: rec
                .memory_report
                .map_or(0.0, |m| m.swap_out_ns as f64 / 1e6),
            swap_in_ms: rec.memory_report.map_or(0.0, |m| m.swap_in_ns as f64 / 1e6),
            evictions: rec.memory_report.map_or(0, |m| m.evictions),
            allocations: last.allocations,
            requests: last.requests,
            errors: last.errors,
            kernels: last.kernels,
            kernel_ns: last.kernel_ns,
            bytes_htod: last.bytes_htod,
            bytes_dtoh: last.bytes_dtoh,
            bytes_dtod: last.bytes_dtod,
            compute_share: permille_to_fraction(if rec.samples.is_empty() {
                rec.compute
            } else {
                last.compute_share
            }),
            copy_share: permille_to_fraction(if rec.samples.is_empty() {
                rec.copy
            } else {
                last.copy_share
            }),
            priority: if rec.samples.is_empty() {
                rec.priority
            } else {
                last.priority
            },
        }
    }

    /// Stats of every vGPU, from the latest samples (for metrics and `top`).
    pub fn all_stats(&self) -> Vec<api::VgpuStats> {
        let inner = self.lock();
        inner.vgpus.values().map(|r| self.stats_of(r)).collect()
    }

    /// Samples every running worker every `stats_interval`.
    async fn sampler(self: Arc<Self>) {
        let mut tick = tokio::time::interval(self.cfg.stats_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let links: Vec<(u32, Link)> = self
                .lock()
                .vgpus
                .values()
                .filter_map(|r| r.worker.as_ref().map(|w| (r.id, w.link.clone())))
                .collect();
            for (id, link) in links {
                if let Ok(ReplyBody::Stats { stats }) = link.call(Ctl::Stats, CONTROL_TIMEOUT).await
                {
                    self.record_sample(id, stats);
                }
            }
        }
    }

    // ---- VMs ----

    fn resolve_payload(&self, p: &str) -> Result<PathBuf, ApiError> {
        if p.is_empty() {
            return Err(ApiError::bad(
                "payload",
                "payload is empty; give the path of a payload ELF",
            ));
        }
        let path = if p.contains('/') {
            let path = PathBuf::from(p);
            if !path.is_absolute() {
                return Err(ApiError::bad(
                    "payload",
                    format!("{p:?} is relative; give an absolute path (vgpud resolves it on its own host) or a bare payload name"),
                ));
            }
            path
        } else {
            match &self.cfg.payload_dir {
                Some(dir) => dir.join(p),
                None => {
                    return Err(ApiError::bad(
                        "payload",
                        format!("{p:?} is a bare name but vgpud has no --payload-dir; give an absolute path"),
                    ))
                }
            }
        };
        match std::fs::metadata(&path) {
            Ok(m) if m.is_file() => Ok(path),
            Ok(_) => Err(ApiError::bad(
                "payload",
                format!("{} is not a regular file; give a payload ELF", path.display()),
            )),
            Err(e) => Err(ApiError::bad(
                "payload",
                format!("cannot read payload {}: {e}; check the path (build payloads with `cargo run -p payload-build -- --out DIR`)", path.display()),
            )),
        }
    }

    /// Launches a VM (and its inline vGPU).
    pub async fn create_vm(self: &Arc<Self>, req: VmCreate) -> Result<api::Vm, ApiError> {
        self.check_running()?;
        for (field, v) in [
            ("kernel", &req.kernel),
            ("initrd", &req.initrd),
            ("cmdline", &req.cmdline),
        ] {
            if v.is_some() {
                return Err(ApiError::not_implemented(
                    Some(field),
                    "Linux guests arrive with issue 12; launch a payload guest (payload) for now",
                ));
            }
        }
        let Some(payload) = req.payload.as_deref() else {
            return Err(ApiError::bad(
                "payload",
                "give payload: the path of a payload ELF to boot",
            ));
        };
        let payload = self.resolve_payload(payload)?;
        if req.payload_arg.len() > MAX_PAYLOAD_ARG || req.payload_arg.contains('\0') {
            return Err(ApiError::bad(
                "payload_arg",
                format!("payload_arg must be at most {MAX_PAYLOAD_ARG} bytes without NUL"),
            ));
        }
        if !(VM_MEMORY_MIN..=VM_MEMORY_MAX).contains(&req.memory_bytes)
            || req.memory_bytes % 4096 != 0
        {
            return Err(ApiError::bad(
                "memory_bytes",
                format!(
                    "{} of guest RAM: give a multiple of 4 KiB between {} and {}",
                    req.memory_bytes,
                    human_bytes(VM_MEMORY_MIN),
                    human_bytes(VM_MEMORY_MAX)
                ),
            ));
        }
        if req.vcpus == 0 || req.vcpus > MAX_VCPUS {
            return Err(ApiError::bad(
                "vcpus",
                format!("{} vCPUs: give 1 to {MAX_VCPUS}", req.vcpus),
            ));
        }
        if req.vgpu_id.is_some() && req.vgpu.is_some() {
            return Err(ApiError::bad(
                "vgpu",
                "give either vgpu_id (an existing vGPU) or vgpu (a new one), not both",
            ));
        }
        let ask = req
            .vgpu
            .as_ref()
            .map(|s| self.validate_vgpu(s).map_err(|e| e.within("vgpu")))
            .transpose()?;

        let (vm_id, vgpu_id) = {
            let mut inner = self.lock();
            let vm_id = inner.next_vm;
            let vgpu_id = match (req.vgpu_id, ask) {
                (Some(g), _) => {
                    let vm_of = |inner: &Inner, v: u32| {
                        inner.vms.get(&v).is_some_and(|v| v.state.is_live())
                    };
                    let Some(rec) = inner.vgpus.get(&g) else {
                        return Err(ApiError::bad(
                            "vgpu_id",
                            format!("there is no vGPU {g} (GET /v1/vgpus lists them)"),
                        ));
                    };
                    match (&rec.state, rec.vm) {
                        (VgpuState::Ready, None) => {}
                        (_, Some(v)) if vm_of(&inner, v) => {
                            return Err(ApiError::conflict(
                                "vgpu_id",
                                format!("vGPU {g} is in use by VM {v}; create another vGPU"),
                            ));
                        }
                        (state, _) => {
                            return Err(ApiError::conflict(
                                "vgpu_id",
                                format!("vGPU {g} is {state:?}, not ready; a vGPU serves one VM, so create a new one"),
                            ));
                        }
                    }
                    if let Some(rec) = inner.vgpus.get_mut(&g) {
                        rec.vm = Some(vm_id);
                        rec.state = VgpuState::Attached;
                    }
                    Some(g)
                }
                (None, Some(ask)) => Some(
                    self.admit(&mut inner, ask, Some(vm_id))
                        .map_err(|e| e.within("vgpu"))?,
                ),
                (None, None) => None,
            };
            inner.next_vm += 1;
            let console = self.cfg.state_dir.join(format!("vm-{vm_id}.log"));
            inner.vms.insert(
                vm_id,
                VmRec {
                    id: vm_id,
                    payload: payload.clone(),
                    payload_arg: req.payload_arg.clone(),
                    memory: req.memory_bytes,
                    vcpus: req.vcpus,
                    vgpu: vgpu_id,
                    state: VmState::Starting,
                    proc: None,
                    console,
                    started: Instant::now(),
                    ended: None,
                    launched: SystemTime::now(),
                    restored_uptime: None,
                },
            );
            (vm_id, vgpu_id)
        };
        let inline = req.vgpu.is_some();
        if let (true, Some(g)) = (inline, vgpu_id) {
            if let Err(e) = self.start_worker(g).await {
                self.forget_vgpu(g);
                self.lock().vms.remove(&vm_id);
                self.mark_dirty();
                return Err(e);
            }
            if let Some(rec) = self.lock().vgpus.get_mut(&g) {
                if rec.state == VgpuState::Ready {
                    rec.state = VgpuState::Attached;
                }
            }
        }
        if let Err(e) = self.spawn_vmm(vm_id) {
            self.undo_vm(vm_id, vgpu_id, inline).await;
            return Err(e);
        }
        self.save()
            .await
            .map_err(|e| ApiError::unsaved(&format!("VM {vm_id} was created"), &e))?;
        self.lock()
            .vms
            .get(&vm_id)
            .map(VmRec::view)
            .ok_or_else(|| ApiError::internal(format!("VM {vm_id} vanished while starting")))
    }

    /// Rolls back a VM whose vmm could not start.
    async fn undo_vm(&self, vm_id: u32, vgpu: Option<u32>, inline: bool) {
        if let Some(vm) = self.lock().vms.remove(&vm_id) {
            let _ = std::fs::remove_file(&vm.console);
        }
        self.mark_dirty();
        let Some(g) = vgpu else { return };
        if inline {
            let proc = {
                let mut inner = self.lock();
                inner.vgpus.get_mut(&g).and_then(|r| {
                    r.stopping = true;
                    r.worker.as_ref().map(|w| (w.proc.clone(), w.link.clone()))
                })
            };
            if let Some((p, link)) = proc {
                self.stop_worker(g, &p, &link).await;
            }
            self.forget_vgpu(g);
        } else if let Some(rec) = self.lock().vgpus.get_mut(&g) {
            rec.vm = None;
            if rec.state == VgpuState::Attached {
                rec.state = VgpuState::Ready;
            }
        }
    }

    fn spawn_vmm(self: &Arc<Self>, vm_id: u32) -> Result<(), ApiError> {
        let mut inner = self.lock();
        let vm = inner
            .vms
            .get(&vm_id)
            .ok_or_else(|| ApiError::internal(format!("VM {vm_id} vanished while starting")))?;
        let socket = vm
            .vgpu
            .and_then(|g| inner.vgpus.get(&g))
            .map(|r| r.socket.clone());
        let mut cmd = Command::new(&self.cfg.vmm_bin);
        cmd.arg("--payload")
            .arg(&vm.payload)
            .args(["--memory", &vm.memory.to_string()])
            .args(["--vcpus", &vm.vcpus.to_string()])
            .arg("--payload-arg")
            .arg(&vm.payload_arg);
        if let Some(s) = socket {
            let mut spec = std::ffi::OsString::from("socket=");
            spec.push(s.as_os_str());
            cmd.arg("--vgpu").arg(spec);
        }
        let console = File::create(&vm.console).map_err(|e| {
            ApiError::internal(format!(
                "cannot create the console log {}: {e}",
                vm.console.display()
            ))
        })?;
        let console2 = console
            .try_clone()
            .map_err(|e| ApiError::internal(format!("console log: {e}")))?;
        cmd.stdin(Stdio::null())
            .stdout(Stdio::from(console))
            .stderr(Stdio::from(console2));
        let (child, proc) = procs::spawn(&mut cmd, None).map_err(|e| {
            ApiError::internal(format!(
                "cannot start {}: {e}; check vgpud's --vmm-bin",
                self.cfg.vmm_bin.display()
            ))
        })?;
        tracing::info!(vm = vm_id, pid = proc.pid, payload = %vm.payload.display(), "vmm started");
        let has_vgpu = vm.vgpu.is_some();
        if let Some(vm) = inner.vms.get_mut(&vm_id) {
            vm.proc = Some(proc.clone());
            if !has_vgpu {
                vm.state = VmState::Running;
            }
        }
        drop(inner);
        let d = self.clone();
        tokio::spawn(async move {
            let status = procs::reap(child, &proc).await;
            d.on_vmm_exit(vm_id, proc.pid, status);
        });
        Ok(())
    }

    fn on_vmm_exit(&self, vm_id: u32, pid: u32, status: ExitStatus) {
        let mut inner = self.lock();
        let Some(vm) = inner.vms.get_mut(&vm_id) else {
            return;
        };
        if vm.proc.as_ref().map(|p| p.pid) != Some(pid) {
            return;
        }
        vm.proc = None;
        vm.ended = Some(Instant::now());
        if vm.state.is_live() {
            vm.state = match status.code() {
                Some(code) => VmState::Exited { code },
                None => VmState::Failed {
                    reason: format!("the vmm was {}", procs::describe(&status)),
                },
            };
        }
        tracing::info!(vm = vm_id, pid, state = ?vm.state, "vmm exited");
        self.mark_dirty();
        let worker = vm
            .vgpu
            .and_then(|g| inner.vgpus.get(&g))
            .and_then(|r| r.worker.as_ref())
            .map(|w| w.proc.clone());
        drop(inner);
        // The worker exits by itself when its frontend disconnects; make sure of it, so
        // the vGPU's memory and shares are free within a second.
        if let Some(p) = worker {
            p.signal(libc::SIGTERM);
            tokio::spawn(async move {
                tokio::time::sleep(STOP_GRACE).await;
                p.signal(libc::SIGKILL);
            });
        }
        self.changed.notify_waiters();
    }

    /// One VM.
    pub fn get_vm(&self, id: u32) -> Result<api::Vm, ApiError> {
        self.lock()
            .vms
            .get(&id)
            .map(VmRec::view)
            .ok_or_else(|| no_vm(id))
    }

    /// Every VM.
    pub fn list_vms(&self) -> Vec<api::Vm> {
        self.lock().vms.values().map(VmRec::view).collect()
    }

    /// The VM's console output from byte `offset` on.
    pub fn console(&self, id: u32, offset: u64) -> Result<Vec<u8>, ApiError> {
        let path = self
            .lock()
            .vms
            .get(&id)
            .map(|v| v.console.clone())
            .ok_or_else(|| no_vm(id))?;
        let data = std::fs::read(&path).unwrap_or_default();
        let start = usize::try_from(offset)
            .unwrap_or(usize::MAX)
            .min(data.len());
        Ok(data[start..].to_vec())
    }

    /// Stops a VM (SIGTERM, then SIGKILL), waits until its vGPU is released, removes it
    /// (and its inline vGPU).
    pub async fn delete_vm(&self, id: u32) -> Result<(), ApiError> {
        let (proc, vgpu) = {
            let inner = self.lock();
            let vm = inner.vms.get(&id).ok_or_else(|| no_vm(id))?;
            // A vGPU restored after a restart no longer belongs to the VM it served before
            // (it may serve a new one): leave it alone.
            let vgpu = vm
                .vgpu
                .filter(|g| inner.vgpus.get(g).is_some_and(|r| r.vm == Some(id)));
            (vm.proc.clone(), vgpu)
        };
        if let Some(p) = proc {
            self.stop_proc(&p, |i| i.vms.get(&id).is_none_or(|v| v.proc.is_none()))
                .await;
        }
        if let Some(g) = vgpu {
            // Its worker stops on the vmm's disconnect (with SIGKILL after the grace).
            let worker = self
                .lock()
                .vgpus
                .get(&g)
                .and_then(|r| r.worker.as_ref().map(|w| w.proc.clone()));
            if let Some(p) = worker {
                self.stop_proc(&p, |i| i.vgpus.get(&g).is_none_or(|r| r.worker.is_none()))
                    .await;
            }
        }
        let (vm, owned) = {
            let mut inner = self.lock();
            let vm = inner.vms.remove(&id);
            let owned = vgpu.filter(|g| inner.vgpus.get(g).is_some_and(|r| r.owned));
            if let Some(rec) = vgpu.and_then(|g| inner.vgpus.get_mut(&g)) {
                rec.vm = None;
            }
            (vm, owned)
        };
        if let Some(vm) = vm {
            let _ = std::fs::remove_file(&vm.console);
        }
        if let Some(g) = owned {
            self.forget_vgpu(g);
        }
        self.changed.notify_waiters();
        tracing::info!(vm = id, "VM deleted");
        self.save()
            .await
            .map_err(|e| ApiError::unsaved(&format!("VM {id} was deleted"), &e))
    }

    /// Counts of VMs per state name, for metrics.
    pub fn vm_states(&self) -> BTreeMap<&'static str, u64> {
        let mut m = BTreeMap::new();
        for v in self.lock().vms.values() {
            let k = match v.state {
                VmState::Starting => "starting",
                VmState::Running => "running",
                VmState::Exited { .. } => "exited",
                VmState::Failed { .. } => "failed",
            };
            *m.entry(k).or_insert(0) += 1;
        }
        m
    }

    /// Stops every VM and worker (daemon shutdown) and removes their files.
    async fn stop_all(&self) {
        self.shutting_down.store(true, Ordering::SeqCst);
        // What the next start brings back: the state before this stop tears it down.
        self.save_final().await;
        let (vms, workers): (Vec<Proc>, Vec<Proc>) = {
            let mut inner = self.lock();
            for r in inner.vgpus.values_mut() {
                r.stopping = true;
            }
            (
                inner.vms.values().filter_map(|v| v.proc.clone()).collect(),
                inner
                    .vgpus
                    .values()
                    .filter_map(|r| r.worker.as_ref().map(|w| w.proc.clone()))
                    .collect(),
            )
        };
        if !vms.is_empty() || !workers.is_empty() {
            tracing::info!(
                vms = vms.len(),
                workers = workers.len(),
                "stopping every VM and worker"
            );
        }
        for p in vms.iter().chain(&workers) {
            p.signal(libc::SIGTERM);
        }
        let all_gone = |i: &Inner| {
            i.vms.values().all(|v| v.proc.is_none()) && i.vgpus.values().all(|r| r.worker.is_none())
        };
        if !self.wait_until(Duration::from_secs(3), all_gone).await {
            let left: Vec<Proc> = {
                let inner = self.lock();
                inner
                    .vms
                    .values()
                    .filter_map(|v| v.proc.clone())
                    .chain(
                        inner
                            .vgpus
                            .values()
                            .filter_map(|r| r.worker.as_ref().map(|w| w.proc.clone())),
                    )
                    .collect()
            };
            for p in left {
                tracing::warn!(pid = p.pid, "still running after SIGTERM; SIGKILL");
                p.signal(libc::SIGKILL);
            }
            self.wait_until(Duration::from_secs(2), all_gone).await;
        }
        // The VMs' consoles stay with their records (the state file keeps them; DELETE
        // removes both).
        let inner = self.lock();
        for r in inner.vgpus.values() {
            let _ = std::fs::remove_file(&r.socket);
            let _ = std::fs::remove_file(&r.log);
        }
    }
}

fn no_vgpu(id: u32) -> ApiError {
    ApiError::not_found(
        "id",
        format!("there is no vGPU {id} (GET /v1/vgpus lists them)"),
    )
}

fn no_vm(id: u32) -> ApiError {
    ApiError::not_found(
        "id",
        format!("there is no VM {id} (GET /v1/vms lists them)"),
    )
}

/// Holds the lock file for the daemon's life.
struct LockFile {
    _file: File,
}

fn take_lock(path: &Path, socket: &Path) -> Result<LockFile, DaemonError> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(path)
        .map_err(|source| DaemonError::Lock {
            path: path.to_owned(),
            source,
        })?;
    // SAFETY: flock on a descriptor we own; no memory is passed.
    let rc = unsafe {
        libc::flock(
            std::os::fd::AsRawFd::as_raw_fd(&file),
            libc::LOCK_EX | libc::LOCK_NB,
        )
    };
    if rc != 0 {
        let pid = std::fs::read_to_string(path)
            .unwrap_or_default()
            .trim()
            .to_owned();
        return Err(DaemonError::AlreadyRunning {
            socket: socket.to_owned(),
            pid: if pid.is_empty() {
                "unknown".into()
            } else {
                pid
            },
        });
    }
    let mut f = &file;
    let _ = file.set_len(0);
    let _ = writeln!(f, "{}", std::process::id());
    Ok(LockFile { _file: file })
}

fn check_binaries(cfg: &Config) -> Result<(), DaemonError> {
    for (name, path, flag) in [
        (
            "vgpu-worker",
            &cfg.worker_bin,
            "--worker-bin (or VGPUD_WORKER_BIN)",
        ),
        ("vmm", &cfg.vmm_bin, "--vmm-bin (or VGPUD_VMM_BIN)"),
    ] {
        if !path.is_file() {
            return Err(DaemonError::MissingBinary {
                name,
                package: if name == "vmm" { "vmm" } else { "vgpud" },
                path: path.clone(),
                flag,
            });
        }
    }
    Ok(())
}

/// Binds the API, serves it until SIGTERM/SIGINT, then stops everything.
pub(super) async fn serve(cfg: Config, on_listening: impl FnOnce()) -> Result<(), DaemonError> {
    check_binaries(&cfg)?;
    if cfg.gpus.is_empty() {
        return Err(DaemonError::Option(
            "no GPUs configured; give --sim-gpus 1 or more".into(),
        ));
    }
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&cfg.state_dir)
        .map_err(|source| DaemonError::StateDir {
            path: cfg.state_dir.clone(),
            source,
        })?;
    // One daemon per state directory (worker sockets, logs and consoles live there); a
    // second one is refused before it touches anything.
    let sock_for_msg = match &cfg.listen {
        Listen::Unix(p) => p.clone(),
        Listen::Tcp(a) => PathBuf::from(a.to_string()),
    };
    let lock_path = cfg.state_dir.join("vgpud.lock");
    let _lock = take_lock(&lock_path, &sock_for_msg)?;

    // What the last vgpud on this state directory saved; a damaged or newer file stops
    // the start (with what to do) unless the operator said to set it aside.
    let state_path = statefile::path_in(&cfg.state_dir);
    let saved = match statefile::load(&state_path) {
        Ok(s) => s,
        Err(e) if cfg.discard_state => {
            let to = statefile::discard(&state_path)?;
            tracing::warn!(error = %e, set_aside = %to.display(),
                "--discard-state: the state file is set aside; starting without its vGPUs and VMs");
            None
        }
        Err(e) => return Err(e.into()),
    };

    let daemon = Arc::new(Daemon::new(cfg.clone())?);
    // Signals are ours from here on: a stop during the restore below is a graceful one.
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
    let mut int = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt()).ok();
    let shutdown = async move {
        tokio::select! {
            _ = async { match term.as_mut() { Some(s) => { s.recv().await; } None => std::future::pending().await } } => {}
            _ = async { match int.as_mut() { Some(s) => { s.recv().await; } None => std::future::pending().await } } => {}
        }
        tracing::info!("signal received; shutting down");
    };
    let listener = bind(&cfg).await?;
    // Bound but not yet serving: a client that connects now waits for the restore.
    match saved {
        Some(saved) => daemon.restore(saved).await,
        None => tracing::info!(path = %state_path.display(), "no state file; starting fresh"),
    }
    // A state directory that cannot be written is logged here and reported to every API
    // change until a save succeeds.
    let _ = daemon.save().await;
    let saver = tokio::spawn(daemon.clone().saver());
    let app = super::http::router(daemon.clone());
    let sampler = tokio::spawn(daemon.clone().sampler());
    let rebalancer = tokio::spawn(daemon.clone().rebalancer());
    on_listening();
    let served = match listener {
        Bound::Unix(listener, path) => {
            let r = axum::serve(listener, app)
                .with_graceful_shutdown(shutdown)
                .await;
            let _ = std::fs::remove_file(path);
            r
        }
        Bound::Tcp(listener) => {
            axum::serve(listener, app)
                .with_graceful_shutdown(shutdown)
                .await
        }
    };
    sampler.abort();
    rebalancer.abort();
    daemon.stop_all().await;
    saver.abort();
    let _ = std::fs::remove_file(&lock_path);
    tracing::info!("vgpud stopped");
    served.map_err(DaemonError::Runtime)
}

/// The API's listener.
enum Bound {
    Unix(tokio::net::UnixListener, PathBuf),
    Tcp(tokio::net::TcpListener),
}

/// Binds the API's socket (replacing a stale unix socket, refusing a live one).
async fn bind(cfg: &Config) -> Result<Bound, DaemonError> {
    match &cfg.listen {
        Listen::Unix(path) => {
            if let Ok(meta) = std::fs::symlink_metadata(path) {
                use std::os::unix::fs::FileTypeExt;
                if !meta.file_type().is_socket() {
                    return Err(DaemonError::NotASocket { path: path.clone() });
                }
                if std::os::unix::net::UnixStream::connect(path).is_ok() {
                    return Err(DaemonError::AlreadyRunning {
                        socket: path.clone(),
                        pid: "unknown".into(),
                    });
                }
                let _ = std::fs::remove_file(path);
            }
            if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                let _ = std::fs::DirBuilder::new()
                    .recursive(true)
                    .mode(0o700)
                    .create(dir);
            }
            let listener =
                tokio::net::UnixListener::bind(path).map_err(|source| DaemonError::Bind {
                    addr: path.display().to_string(),
                    source,
                })?;
            let _ = std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600));
            tracing::info!(socket = %path.display(), gpus = cfg.gpus.len(), "vgpud listening");
            Ok(Bound::Unix(listener, path.clone()))
        }
        Listen::Tcp(addr) => {
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|source| DaemonError::Bind {
                    addr: addr.to_string(),
                    source,
                })?;
            tracing::info!(%addr, gpus = cfg.gpus.len(), "vgpud listening (TCP, bearer token required)");
            Ok(Bound::Tcp(listener))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn daemon(gpus: u32) -> Daemon {
        Daemon::new(Config {
            listen: Listen::Unix("/nonexistent/vgpud.sock".into()),
            token: None,
            state_dir: "/nonexistent".into(),
            gpus: (0..gpus)
                .map(|i| GpuConfig {
                    name: format!("g{i}"),
                    cuda_ordinal: None,
                    memory: 4 << 30,
                    copy_bandwidth: 0,
                    speed: 1.0,
                })
                .collect(),
            worker_bin: "/nonexistent/vgpu-worker".into(),
            vmm_bin: "/nonexistent/vmm".into(),
            sim_threads: 1,
            queue_poll_us: 0,
            payload_dir: None,
            stats_interval: Duration::from_millis(250),
            stats_window: Duration::from_secs(1),
            swap_area: 0.1,
            policy: vgpu_scheduler::gpu::PolicyKind::Band,
            rebalance: Default::default(),
            rebalance_interval: Duration::from_millis(250),
            discard_state: false,
        })
        .expect("scheduler threads")
    }

    fn spec(gpu: Option<u32>, memory: u64, compute: f64) -> VgpuCreate {
        VgpuCreate {
            gpu,
            memory_bytes: memory,
            compute_share: compute,
            copy_share: None,
            priority: 0,
            oversubscribe: false,
            share_group: None,
            queues: 1,
            storage: Vec::new(),
        }
    }

    fn admit(d: &Daemon, s: VgpuCreate) -> Result<u32, ApiError> {
        let ask = d.validate_vgpu(&s)?;
        let mut inner = d.lock();
        d.admit(&mut inner, ask, None)
    }

    #[test]
    fn shares_and_memory_are_admitted_up_to_the_gpu() {
        let d = daemon(1);
        admit(&d, spec(Some(0), 3 << 30, 0.7)).expect("fits");
        let e = admit(&d, spec(Some(0), 1 << 20, 0.31)).expect_err("compute past 100%");
        assert_eq!(
            (e.status, e.field.as_deref()),
            (axum::http::StatusCode::CONFLICT, Some("compute_share"))
        );
        assert!(e.error.contains("at most 30.0% is left"), "{e}");
        let e = admit(&d, spec(Some(0), 2 << 30, 0.1)).expect_err("memory past the GPU");
        assert_eq!(e.field.as_deref(), Some("memory_bytes"));
        admit(&d, spec(Some(0), 1 << 30, 0.3)).expect("exactly full fits");
        let g = &d.gpus()[0];
        assert_eq!((g.memory_free_bytes, g.compute_committed), (0, 1.0));
        // Released and failed vGPUs hold nothing.
        for r in d.lock().vgpus.values_mut() {
            r.state = VgpuState::Released;
        }
        assert_eq!(d.gpus()[0].memory_committed_bytes, 0);
        admit(&d, spec(Some(0), 4 << 30, 1.0)).expect("all free again");
    }

    #[test]
    fn placement_picks_the_least_loaded_gpu_that_fits() {
        let d = daemon(3);
        admit(&d, spec(Some(0), 1 << 30, 0.5)).expect("gpu 0");
        admit(&d, spec(Some(1), 1 << 30, 0.2)).expect("gpu 1");
        admit(&d, spec(Some(2), 4 << 30, 0.1)).expect("gpu 2 memory full");
        let id = admit(&d, spec(None, 1 << 30, 0.3)).expect("placed");
        assert_eq!(
            d.lock().vgpus[&id].gpu,
            1,
            "gpu 2 is less loaded but has no memory left"
        );
        let e = admit(&d, spec(None, 1 << 30, 0.9)).expect_err("nowhere");
        assert_eq!(e.field.as_deref(), Some("gpu"));
    }

    #[test]
    fn bad_specs_name_their_field() {
        let d = daemon(1);
        for (s, field) in [
            (spec(Some(0), 0, 0.1), "memory_bytes"),
            (spec(Some(0), 1, f64::NAN), "compute_share"),
            (spec(Some(0), 1, -0.1), "compute_share"),
            (spec(Some(5), 1, 0.1), "gpu"),
            (spec(None, 5 << 30, 0.1), "memory_bytes"),
            (
                VgpuCreate {
                    copy_share: Some(2.0),
                    ..spec(None, 1, 0.1)
                },
                "copy_share",
            ),
            (
                VgpuCreate {
                    queues: 65,
                    ..spec(None, 1, 0.1)
                },
                "queues",
            ),
            (
                VgpuCreate {
                    share_group: Some(String::new()),
                    ..spec(None, 1, 0.1)
                },
                "share_group",
            ),
            (
                VgpuCreate {
                    oversubscribe: true,
                    ..spec(None, 8 << 30, 0.1)
                },
                "memory_bytes",
            ),
        ] {
            let e = d.validate_vgpu(&s).expect_err("invalid");
            assert_eq!(e.field.as_deref(), Some(field), "{e}");
        }
        assert!(d.lock().vgpus.is_empty(), "validation changed the state");
    }

    /// Regression (migration::swapped_out_memory_migrates_intact failed 4 in 15): a
    /// worker's reservation that waits for its source GPU's pool (another reservation holds
    /// it) while its migration finishes was planned on the pool the vGPU had just left:
    /// refused ("not in this GPU's memory pool"), and the guest's next copy failed with
    /// OUT_OF_MEMORY. It must land on the target's pool.
    #[test]
    fn a_reservation_during_a_migration_lands_where_the_memory_is() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async {
            let d = Arc::new(daemon(2));
            let id = admit(
                &d,
                VgpuCreate {
                    oversubscribe: true,
                    ..spec(Some(0), 1 << 30, 0.2)
                },
            )
            .expect("admitted");
            // As its worker starts, it joins GPU 0's pool.
            lock_planner(&d.memory[0].planner).join(id, 0);
            let resident = |g: usize| lock_planner(&d.memory[g].planner).resident();
            let member = |g: usize| lock_planner(&d.memory[g].planner).member(id).is_some();

            // The migration to GPU 1 starts: the memory is in both pools until it ends,
            // and a reservation now (its worker may have switched already) counts in both.
            d.begin_move(&mut d.lock(), id, 1);
            assert!(member(0) && member(1));
            assert_eq!(d.reserve(id, 2 << 20).await, Answer::Granted);
            assert_eq!((resident(0), resident(1)), (2 << 20, 2 << 20));

            // Another reservation holds GPU 0's pool; the vGPU asks for more meanwhile...
            let held = d.memory[0].serial.lock().await;
            let asking = tokio::spawn({
                let d = d.clone();
                async move { d.reserve(id, 4 << 20).await }
            });
            tokio::task::yield_now().await;
            assert!(!asking.is_finished(), "it waits for GPU 0's pool");
            // ... and the migration completes before it gets GPU 0's pool.
            let done = crate::control::MigrationDone {
                rounds: 1,
                precopy_bytes: 0,
                stop_bytes: 0,
                total: 0,
                downtime_ms: 1.0,
                drain_ms: 0.0,
                elapsed_ms: 1.0,
                timeline: Vec::new(),
            };
            d.finish_migration(1, id, Ok(done), 0, 1);
            assert!(!member(0) && member(1), "it left GPU 0's pool");
            drop(held);
            assert_eq!(asking.await.expect("task"), Answer::Granted);
            assert_eq!(resident(1), 6 << 20, "counted on the GPU its memory is on");
            assert_eq!(d.lock().vgpus[&id].gpu, 1);

            // A failed migration leaves the target's pool again.
            d.begin_move(&mut d.lock(), id, 0);
            assert!(member(0) && member(1));
            d.finish_migration(2, id, Err("injected".into()), 1, 0);
            assert!(!member(0) && member(1));
        });
    }

    #[test]
    fn log_tail_picks_the_error_without_the_timestamp() {
        let p = std::env::temp_dir().join(format!("vgpud-logtail-{}", std::process::id()));
        std::fs::write(
            &p,
            "2026-11-29T12:20:53.997651Z  INFO vgpu_worker: listening\n\
             2026-11-29T12:20:53.998011Z ERROR vgpu_worker: cannot bind\n\
             2026-11-29T12:20:53.998011Z  INFO vgpu_worker: bye\n",
        )
        .expect("write");
        assert_eq!(log_tail(&p), ": ERROR vgpu_worker: cannot bind");
        std::fs::remove_file(&p).expect("rm");
        assert_eq!(log_tail(&p), "");
    }
}
