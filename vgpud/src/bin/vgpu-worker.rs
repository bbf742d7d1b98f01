//! `vgpu-worker`: serves exactly one vGPU's vhost-user socket from the sim backend.
//!
//! One process per vGPU (DESIGN.md: GPU contexts in one process are not isolated). The
//! worker binds the socket, waits for the VM's vmm (the vhost-user frontend) to connect,
//! serves the vGPU's queues until the frontend disconnects, then exits with status 0 and
//! removes the socket. It does not accept a second connection: a vGPU's device memory dies
//! with its VM (invariant 5), so the daemon starts a fresh worker for a fresh VM.
//! SIGTERM or SIGINT end it the same way, at any time.
//!
//! Control channel (`--control-fd N`, see `vgpud::control`): newline-delimited JSON on an
//! inherited unix socket. The worker says `ready` once its socket is bound and `connected`
//! when the vmm connected, and answers `stats`, `set_shares` and `shutdown`. When vgpud's
//! end closes, the worker shuts down as on SIGTERM. Without `--control-fd` it runs alone.

use std::io::{BufRead, BufReader, Read};
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use clap::Parser;
use vgpu_backend::pager::Pager;
use vgpu_backend::{Backend, BackendError, CudaConfig, CudaGpu, SimConfig, SimGpu};
use vgpu_device::{
    ConfigError, DeviceConfig, Vgpu, VgpuVhostBackend, DEFAULT_QUEUE_SIZE, MAX_QUEUES,
};
use vgpu_migration::{Migratable, MigrateOptions, Mode, Progress};
use vgpud::control::{
    self, Command, MigrationDone, MigrationMode, MigrationProgress, ReplyBody, Request, TargetGpu,
    WorkerMessage, WorkerStats,
};
use vgpud::memlink::{Asker, ControlBroker, ControlOut, FdQueue, FdReader, WorkerShm};
use vgpud::units::{parse_bandwidth, parse_share, parse_size};
use vhost::vhost_user::{Error as VhostUserError, Listener};
use vhost_user_backend::{ShutdownHandle, VhostUserDaemon};
use vm_memory::{GuestMemoryAtomic, GuestMemoryMmap};

/// Serve one vGPU's vhost-user socket from a GPU backend: the simulated GPU (default) or
/// an NVIDIA GPU through CUDA (`--backend cuda --gpu N`).
///
/// Sizes take binary suffixes (K, M, G, T = 2^10.. ; "1G", "512M", "4096").
/// Bandwidths take decimal suffixes in bytes per second ("12G" = 12e9 B/s).
/// Shares are fractions of the physical GPU ("0.3") or percentages ("30%").
/// Exits with status 0 when the frontend disconnects or on SIGTERM/SIGINT.
#[derive(Parser, Debug)]
#[command(name = "vgpu-worker", version)]
struct Args {
    /// Path of the vhost-user socket to listen on (the VM's vmm connects to it).
    #[arg(long)]
    socket: PathBuf,
    /// Host-wide id of the vGPU (shown to the guest in the config space).
    #[arg(long)]
    vgpu_id: u32,
    /// Device memory the vGPU may allocate (its memory share).
    #[arg(long, value_parser = parse_size)]
    memory: u64,
    /// Request queues (guest streams), each served by its own thread.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=i64::from(MAX_QUEUES)))]
    queues: u16,
    /// Largest virtqueue size the guest may use (a power of two).
    #[arg(long, default_value_t = DEFAULT_QUEUE_SIZE)]
    queue_size: u16,
    /// Guaranteed compute share of the physical GPU.
    #[arg(long, value_parser = parse_share, default_value = "1")]
    compute_share: u32,
    /// Guaranteed copy-bandwidth share of the physical GPU.
    #[arg(long, value_parser = parse_share, default_value = "1")]
    copy_share: u32,
    /// Which backend serves the vGPU: `sim` (simulated GPU) or `cuda` (an NVIDIA GPU).
    #[arg(long, value_enum, default_value_t = BackendKind::Sim)]
    backend: BackendKind,
    /// CUDA device ordinal of the GPU to use (with --backend cuda).
    #[arg(long, default_value_t = 0)]
    gpu: i32,
    /// Memory of the simulated GPU [default: the --memory value].
    #[arg(long, value_parser = parse_size)]
    sim_memory: Option<u64>,
    /// Host-device copy bandwidth of the simulated GPU in bytes/s; 0 = as fast as the host.
    #[arg(long, value_parser = parse_bandwidth, default_value = "0")]
    sim_copy_bw: u64,
    /// Compute-rate factor of the simulated GPU (1.0 = 1e9 element operations per second).
    #[arg(long, default_value_t = 1.0)]
    sim_speed: f64,
    /// Host threads one kernel may use; 0 = all available.
    #[arg(long, default_value_t = 0)]
    sim_threads: usize,
    /// Scheduling priority (larger = more important); reported, used by the scheduler.
    #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
    priority: i32,
    /// An inherited unix stream socket to vgpud (the control channel).
    #[arg(long)]
    control_fd: Option<i32>,
    /// Inherited grant page and scheduler doorbell, `PAGE,DOORBELL` (given by vgpud):
    /// every copy and kernel then waits for the GPU scheduler's grant. Without it the
    /// worker runs ungated.
    #[arg(long, value_parser = parse_fd_pair)]
    grant_fds: Option<(i32, i32)>,
    /// Hardware queue slots this vGPU's streams share; 0 = one per stream.
    #[arg(long, default_value_t = 0)]
    hw_slots: u32,
    /// Which waiting stream gets a free hardware slot: priority (HEFT rank) or fifo.
    #[arg(long, default_value = "priority")]
    slot_policy: vgpu_device::SlotPolicy,
    /// Let the vGPU's memory be swapped out when the GPU runs short (memory
    /// oversubscription): vgpud decides what is resident. Needs --control-fd.
    #[arg(long)]
    oversubscribe: bool,
    /// Serve shared device memory requests through vgpud's registry. Needs --control-fd.
    #[arg(long)]
    shm: bool,
    /// Microseconds each queue thread keeps polling its ring after a request before it
    /// sleeps on the guest's kick (adaptive polling; 0 = off). See
    /// `VgpuVhostBackend::with_poll`.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=10_000))]
    poll_us: u64,
    /// Attach a storage namespace for GPU-initiated reads (issue 9), `ID=PATH[:ro|:rw]`
    /// (read-only unless `:rw`); repeat for more. The guest attaches it with
    /// STORAGE_ATTACH; it is opened (emulated NVMe controller over the file) then.
    #[arg(long, value_parser = vgpu_backend::storage::NamespaceSpec::parse)]
    storage: Vec<vgpu_backend::storage::NamespaceSpec>,
}

fn parse_fd_pair(s: &str) -> Result<(i32, i32), String> {
    let (a, b) = s
        .split_once(',')
        .ok_or_else(|| format!("{s:?}: give two descriptors, PAGE,DOORBELL"))?;
    let fd = |v: &str| {
        v.trim()
            .parse::<i32>()
            .ok()
            .filter(|n| *n >= 0)
            .ok_or_else(|| format!("{v:?} is not a file descriptor"))
    };
    Ok((fd(a)?, fd(b)?))
}

/// Opens the grant channel from inherited descriptors.
fn grant_gate(page: i32, doorbell: i32) -> Result<vgpu_grant::GrantClient, WorkerError> {
    use std::os::fd::{FromRawFd, OwnedFd};
    for fd in [page, doorbell] {
        // SAFETY: F_GETFD only inspects the descriptor table.
        if unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
            return Err(WorkerError::Grant(format!(
                "descriptor {fd} is not open; start the worker from vgpud or drop --grant-fds"
            )));
        }
    }
    // SAFETY: both descriptors are open (checked above) and were handed to this process
    // for the grant channel alone; nothing else in the worker owns them.
    let (page, doorbell) = unsafe { (OwnedFd::from_raw_fd(page), OwnedFd::from_raw_fd(doorbell)) };
    vgpu_grant::GrantClient::from_fds(page, doorbell).map_err(|e| WorkerError::Grant(e.to_string()))
}

/// The backends a worker can run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum BackendKind {
    /// The simulated GPU (CPU threads, host memory).
    Sim,
    /// An NVIDIA GPU through the CUDA driver.
    Cuda,
}

/// Why the worker stopped with an error. Each message names what to change.
#[derive(Debug, thiserror::Error)]
enum WorkerError {
    #[error("grant channel: {0}")]
    Grant(String),
    #[error("cannot bind vhost-user socket {path}: {why}")]
    Bind { path: PathBuf, why: String },
    #[error("GPU backend: {0}")]
    Backend(#[from] BackendError),
    #[error("vGPU configuration: {0}")]
    Config(#[from] ConfigError),
    #[error("vhost-user: {0}; check that the frontend speaks vhost-user to this socket")]
    Daemon(String),
    #[error("signal setup: {0}")]
    Signals(std::io::Error),
    #[error("control channel (fd {fd}): {why}; start the worker from vgpud or drop --control-fd")]
    Control { fd: i32, why: String },
}

/// Binds the socket, refusing to steal one another process is serving.
fn bind(path: &Path) -> Result<Listener, WorkerError> {
    let err = |why: String| WorkerError::Bind {
        path: path.to_owned(),
        why,
    };
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() {
            return Err(err(
                "the path exists and is not a socket; remove it or pick another path".into(),
            ));
        }
        if UnixStream::connect(path).is_ok() {
            return Err(err(
                "another process is serving this socket; pick another path".into(),
            ));
        }
        std::fs::remove_file(path)
            .map_err(|e| err(format!("cannot remove the stale socket: {e}")))?;
    }
    Listener::new(path, false).map_err(|e| {
        err(match e {
            VhostUserError::SocketError(io) => {
                format!("{io}; check that the directory exists and is writable")
            }
            other => other.to_string(),
        })
    })
}

/// Blocks SIGTERM and SIGINT in this thread (and every thread spawned after), so that
/// `wait_signal` receives them.
fn block_signals() -> Result<libc::sigset_t, WorkerError> {
    // SAFETY: an all-zero sigset_t is a valid value to hand to sigemptyset.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid sigset_t owned by this frame; the calls only write to it and
    // to this thread's signal mask.
    let rc = unsafe {
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut())
    };
    if rc != 0 {
        return Err(WorkerError::Signals(std::io::Error::from_raw_os_error(rc)));
    }
    Ok(set)
}

/// Waits for one of the blocked signals.
fn wait_signal(set: &libc::sigset_t) -> i32 {
    let mut sig = 0;
    // SAFETY: `set` is an initialised signal set and `sig` a valid out-pointer.
    let rc = unsafe { libc::sigwait(set, &mut sig) };
    if rc == 0 {
        sig
    } else {
        libc::SIGTERM
    }
}

/// Connection state the signal thread acts on.
type Shutdown = Arc<Mutex<Option<ShutdownHandle>>>;

/// Ends the worker: closes the frontend connection when there is one (serve() then
/// returns), else removes the socket and exits at once. Requests waiting for a grant run
/// ungated from now on: vgpud may be gone, and its scheduler with it.
fn stop(shutdown: &Shutdown, socket: &Path, gate: Option<&vgpu_grant::SwitchGate>, why: &str) {
    if let Some(g) = gate {
        g.close();
    }
    match shutdown
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .as_ref()
    {
        Some(handle) => {
            tracing::info!(why, "stopping: closing the frontend connection");
            handle.shutdown();
        }
        None => {
            tracing::info!(why, "stopping before any frontend connected");
            let _ = std::fs::remove_file(socket);
            std::process::exit(0);
        }
    }
}

/// Serves one frontend connection on `listener` until it disconnects or `shutdown` is
/// triggered, then logs the vGPU's stats. `on_connected` runs once the frontend is in.
fn serve(
    listener: &mut Listener,
    vgpu: Arc<Vgpu>,
    shutdown: &Shutdown,
    poll: std::time::Duration,
    on_connected: impl FnOnce(),
) -> Result<(), WorkerError> {
    let id = vgpu.config().vgpu_id;
    let mem = GuestMemoryAtomic::new(GuestMemoryMmap::new());
    let backend = Arc::new(VgpuVhostBackend::new(vgpu.clone(), mem.clone()).with_poll(poll));
    let mut daemon = VhostUserDaemon::new(format!("vgpu-{id}"), backend, mem)
        .map_err(|e| WorkerError::Daemon(e.to_string()))?;
    daemon
        .start(listener)
        .map_err(|e| WorkerError::Daemon(e.to_string()))?;
    *shutdown.lock().unwrap_or_else(PoisonError::into_inner) = daemon.shutdown_handle();
    tracing::info!(vgpu = id, "frontend connected");
    on_connected();
    let result = daemon.wait();
    for handler in daemon.get_epoll_handlers() {
        handler.send_exit_event();
    }
    let s = vgpu.stats();
    tracing::info!(
        vgpu = id,
        requests = s.requests,
        errors = s.errors,
        bytes_htod = s.bytes_htod,
        bytes_dtoh = s.bytes_dtoh,
        kernels = s.kernels,
        busy_ms = s.busy_ns / 1_000_000,
        "vGPU stats"
    );
    match result {
        Ok(()) => Ok(()),
        Err(vhost_user_backend::Error::HandleRequest(VhostUserError::Disconnected))
        | Err(vhost_user_backend::Error::HandleRequest(VhostUserError::PartialMessage)) => Ok(()),
        Err(e) => Err(WorkerError::Daemon(e.to_string())),
    }
}

/// Shares and priority as last set (the scheduler issue will act on them; the guest's
/// config space keeps the values the vGPU started with).
#[derive(Clone, Copy, Debug)]
struct Shares {
    compute: u32,
    copy: u32,
    priority: i32,
}

/// What the control thread reports and acts on.
struct ControlState {
    vgpu: Arc<Vgpu>,
    started: Instant,
    shares: Mutex<Shares>,
    connected: AtomicBool,
    shutdown: Shutdown,
    socket: PathBuf,
    pager: Option<Arc<Pager>>,
    asker: Option<Arc<Asker>>,
    migratable: Arc<Migratable>,
    gate: Option<Arc<vgpu_grant::SwitchGate>>,
    /// The vGPU's memory share (a cuda target is sized by it).
    memory: u64,
    /// Storage namespaces the target GPU's backend must serve too.
    storage: Option<Arc<vgpu_backend::storage::StorageSet>>,
}

impl ControlState {
    /// Builds the target GPU's backend for a migration.
    fn target_backend(&self, t: &TargetGpu) -> Result<Arc<dyn Backend>, String> {
        let b: Arc<dyn Backend> = match t.cuda_ordinal {
            None => {
                let sim = SimGpu::new(SimConfig {
                    memory: t.sim_memory,
                    copy_bandwidth: t.sim_copy_bw,
                    speed: t.sim_speed,
                    threads: t.sim_threads,
                    ..SimConfig::default()
                })
                .map_err(|e| e.to_string())?;
                Arc::new(match &self.storage {
                    Some(set) => sim.with_storage(set.clone()),
                    None => sim,
                })
            }
            Some(ordinal) => {
                let gpu = CudaGpu::new(CudaConfig {
                    ordinal,
                    memory: self.memory,
                    migration_target: true,
                    ..CudaConfig::default()
                })
                .map_err(|e| e.to_string())?;
                Arc::new(match &self.storage {
                    Some(set) => gpu.with_storage(set.clone()),
                    None => gpu,
                })
            }
        };
        Ok(vgpu_backend::faults::target(b))
    }

    /// Runs a migration on its own thread; the reply goes out when it ends.
    fn start_migration(
        self: &Arc<Self>,
        id: u64,
        out: Arc<ControlOut>,
        target: TargetGpu,
        mode: MigrationMode,
        max_downtime_ms: u64,
        grant: Option<(OwnedFd, OwnedFd)>,
    ) {
        let st = self.clone();
        let spawned = std::thread::Builder::new()
            .name("migration".into())
            .spawn(move || {
                let body = match st.migrate(&out, &target, mode, max_downtime_ms, grant) {
                    Ok(report) => ReplyBody::Migrated { report },
                    Err(message) => ReplyBody::Error { message },
                };
                out.send(&WorkerMessage::Reply { id, body });
            });
        if let Err(e) = spawned {
            tracing::error!(error = %e, "cannot start the migration thread");
        }
    }

    fn migrate(
        &self,
        out: &ControlOut,
        target: &TargetGpu,
        mode: MigrationMode,
        max_downtime_ms: u64,
        grant: Option<(OwnedFd, OwnedFd)>,
    ) -> Result<MigrationDone, String> {
        let backend = self.target_backend(target)?;
        let client = match grant {
            Some((page, doorbell)) => {
                Some(vgpu_grant::GrantClient::from_fds(page, doorbell).map_err(|e| e.to_string())?)
            }
            None => None,
        };
        let opts = MigrateOptions {
            mode: match mode {
                MigrationMode::StopCopy => Mode::StopCopy,
                MigrationMode::Precopy => Mode::Precopy,
            },
            max_downtime: std::time::Duration::from_millis(max_downtime_ms),
            ..MigrateOptions::default()
        };
        let mut last = Instant::now();
        let progress = |p: &Progress| {
            // At most ~20 reports a second, and every phase change.
            if last.elapsed().as_millis() >= 50 || p.phase != vgpu_migration::Phase::Precopy {
                last = Instant::now();
                out.send(&WorkerMessage::Migration {
                    progress: MigrationProgress {
                        phase: p.phase.name().into(),
                        rounds: p.rounds,
                        bytes: p.bytes,
                        total: p.total,
                        dirty: p.dirty,
                        elapsed_ms: p.elapsed.as_secs_f64() * 1e3,
                    },
                });
            }
        };
        let gate = self.gate.clone();
        let r = self
            .migratable
            .migrate_with(backend, &opts, progress, move || {
                if let (Some(g), Some(c)) = (gate, client) {
                    g.switch(c);
                }
            })
            .map_err(|e| e.to_string())?;
        let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
        Ok(MigrationDone {
            rounds: r.rounds,
            precopy_bytes: r.precopy_bytes,
            stop_bytes: r.stop_bytes,
            total: r.total,
            downtime_ms: ms(r.downtime),
            drain_ms: ms(r.drain),
            elapsed_ms: ms(r.elapsed),
            timeline: r
                .timeline
                .iter()
                .map(|(p, a, b)| (p.name().to_string(), ms(*a), ms(*b)))
                .collect(),
        })
    }

    fn stats(&self) -> WorkerStats {
        let s = self.vgpu.stats();
        let m = self.vgpu.backend().memory_usage();
        let sh = *self.shares.lock().unwrap_or_else(PoisonError::into_inner);
        WorkerStats {
            uptime_ns: u64::try_from(self.started.elapsed().as_nanos()).unwrap_or(u64::MAX),
            requests: s.requests,
            errors: s.errors,
            bytes_htod: s.bytes_htod,
            bytes_dtoh: s.bytes_dtoh,
            bytes_dtod: s.bytes_dtod,
            kernels: s.kernels,
            kernel_ns: s.kernel_ns,
            busy_ns: s.busy_ns,
            memory_used: m.used,
            allocations: m.allocations,
            compute_share: sh.compute,
            copy_share: sh.copy,
            priority: sh.priority,
            connected: self.connected.load(Ordering::Relaxed),
            memory: self.pager.as_ref().map(|p| p.state().into()),
        }
    }

    fn handle(&self, command: Command) -> (ReplyBody, bool) {
        match command {
            Command::Stats => (
                ReplyBody::Stats {
                    stats: self.stats(),
                },
                false,
            ),
            Command::SetShares {
                compute_share,
                copy_share,
                priority,
            } => {
                let scale = vgpu_proto::SHARE_SCALE;
                if compute_share > scale || copy_share > scale {
                    let message = format!(
                        "shares are per-mille and must be at most {scale}; got compute {compute_share}, copy {copy_share}"
                    );
                    return (ReplyBody::Error { message }, false);
                }
                *self.shares.lock().unwrap_or_else(PoisonError::into_inner) = Shares {
                    compute: compute_share,
                    copy: copy_share,
                    priority,
                };
                tracing::info!(compute_share, copy_share, priority, "shares changed");
                let body = ReplyBody::SharesSet {
                    compute_share,
                    copy_share,
                    priority,
                };
                (body, false)
            }
            Command::Shutdown => (ReplyBody::ShuttingDown, true),
            Command::Evict { bytes, tier } => match &self.pager {
                Some(p) => {
                    let freed = p.evict(bytes, tier.into());
                    let memory = p.state().into();
                    (ReplyBody::Evicted { freed, memory }, false)
                }
                None => (no_pager(), false),
            },
            Command::Spill { bytes } => match &self.pager {
                Some(p) => {
                    let moved = p.spill(bytes);
                    let memory = p.state().into();
                    (ReplyBody::Spilled { moved, memory }, false)
                }
                None => (no_pager(), false),
            },
            Command::Migrate { .. } => (
                ReplyBody::Error {
                    message: "migrations are started before commands are handled".into(),
                },
                false,
            ),
            Command::Answer { .. } => (
                ReplyBody::Error {
                    message: "answers are routed before commands are handled".into(),
                },
                false,
            ),
        }
    }
}

fn no_pager() -> ReplyBody {
    ReplyBody::Error {
        message: "this vGPU does not oversubscribe memory (start the worker with --oversubscribe)"
            .into(),
    }
}

/// Adopts the inherited control socket.
fn control_socket(fd: i32) -> Result<UnixStream, WorkerError> {
    let err = |why: String| WorkerError::Control { fd, why };
    // SAFETY: an all-zero stat is a valid out-buffer for fstat.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat only writes to `st`; a bad fd yields EBADF, which we report.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Err(err(std::io::Error::last_os_error().to_string()));
    }
    if st.st_mode & libc::S_IFMT != libc::S_IFSOCK {
        return Err(err("not a socket".into()));
    }
    // SAFETY: the descriptor was inherited from vgpud for this purpose, is open (fstat
    // succeeded) and nothing else in this process owns it.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    let stream = UnixStream::from(owned);
    Ok(stream)
}

/// Reads commands until vgpud closes its end, answering each.
fn control_loop(
    input: FdReader,
    fds: Arc<FdQueue>,
    out: Arc<ControlOut>,
    state: Arc<ControlState>,
) {
    let mut reader = BufReader::new(input);
    let mut line = Vec::new();
    loop {
        line.clear();
        let limit = u64::try_from(control::MAX_LINE).unwrap_or(u64::MAX) + 1;
        match reader.by_ref().take(limit).read_until(b'\n', &mut line) {
            Ok(0) => break,
            Ok(_) if line.last() != Some(&b'\n') && line.len() > control::MAX_LINE => {
                tracing::warn!(
                    "control message longer than {} bytes; closing",
                    control::MAX_LINE
                );
                break;
            }
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(error = %e, "control channel read failed");
                break;
            }
        }
        let req: Request = match serde_json::from_slice(&line) {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(error = %e, "ignoring a malformed control message");
                continue;
            }
        };
        if let Command::Answer { to, answer } = req.command {
            if let Some(a) = &state.asker {
                a.answer(to, answer);
            }
            continue;
        }
        if let Command::Migrate {
            target,
            mode,
            max_downtime_ms,
            grant_fds,
        } = req.command
        {
            let grant = if grant_fds {
                match (fds.pop(), fds.pop()) {
                    (Some(p), Some(d)) => Some((p, d)),
                    _ => {
                        out.send(&WorkerMessage::Reply {
                            id: req.id,
                            body: ReplyBody::Error {
                                message: "the migration's grant descriptors did not arrive".into(),
                            },
                        });
                        continue;
                    }
                }
            } else {
                None
            };
            state.start_migration(req.id, out.clone(), target, mode, max_downtime_ms, grant);
            continue;
        }
        let (body, exit) = state.handle(req.command);
        out.send(&WorkerMessage::Reply { id: req.id, body });
        if exit {
            stop(
                &state.shutdown,
                &state.socket,
                state.gate.as_deref(),
                "vgpud asked to shut down",
            );
        }
    }
    if let Some(a) = &state.asker {
        a.close();
    }
    stop(
        &state.shutdown,
        &state.socket,
        state.gate.as_deref(),
        "vgpud closed the control channel",
    );
}

/// The vGPU's storage namespaces from `--storage`, or None when there are none.
fn storage_set(
    specs: &[vgpu_backend::storage::NamespaceSpec],
) -> Result<Option<Arc<vgpu_backend::storage::StorageSet>>, WorkerError> {
    if specs.is_empty() {
        return Ok(None);
    }
    let set = vgpu_backend::storage::StorageSet::new(specs.to_vec())?;
    for s in specs {
        tracing::info!(namespace = s.id, path = %s.path.display(), read_only = s.read_only,
            "storage namespace attached (opened on the guest's STORAGE_ATTACH)");
    }
    Ok(Some(Arc::new(set)))
}

fn run(args: Args) -> Result<(), WorkerError> {
    let signals = block_signals()?;
    let control = args.control_fd.map(control_socket).transpose()?;
    let fd = args.control_fd.unwrap_or(-1);
    if (args.oversubscribe || args.shm) && control.is_none() {
        return Err(WorkerError::Control {
            fd,
            why: "--oversubscribe and --shm need vgpud (the control channel)".into(),
        });
    }
    // The control channel's two ends: lines out, and lines (with descriptors) in.
    let fds = Arc::new(FdQueue::default());
    let channel = match control {
        Some(stream) => {
            let input = stream.try_clone().map_err(|e| WorkerError::Control {
                fd,
                why: e.to_string(),
            })?;
            let out = Arc::new(ControlOut::new(stream));
            let asker = Arc::new(Asker::new(out.clone(), fds.clone()));
            Some((FdReader::new(input, fds.clone()), out, asker))
        }
        None => None,
    };
    let asker = channel.as_ref().map(|(_, _, a)| a.clone());
    let storage = storage_set(&args.storage)?;
    let inner: Arc<dyn Backend> = match args.backend {
        BackendKind::Sim => {
            let sim = SimGpu::new(SimConfig {
                memory: args.sim_memory.unwrap_or(args.memory),
                copy_bandwidth: args.sim_copy_bw,
                speed: args.sim_speed,
                threads: args.sim_threads,
                ..SimConfig::default()
            })?;
            Arc::new(match &storage {
                Some(set) => sim.with_storage(set.clone()),
                None => sim,
            })
        }
        BackendKind::Cuda => {
            let gpu = CudaGpu::new(CudaConfig {
                ordinal: args.gpu,
                memory: args.memory,
                ..CudaConfig::default()
            })?;
            Arc::new(match &storage {
                Some(set) => gpu.with_storage(set.clone()),
                None => gpu,
            })
        }
    };
    let migratable = Arc::new(Migratable::new(inner));
    let inner: Arc<dyn Backend> = migratable.clone();
    let pager = match (&asker, args.oversubscribe) {
        (Some(a), true) => Some(Arc::new(Pager::new(
            inner.clone(),
            Arc::new(ControlBroker(a.clone())),
            args.memory,
        ))),
        _ => None,
    };
    let backend: Arc<dyn Backend> = match &pager {
        Some(p) => p.clone(),
        None => inner,
    };
    // Fault injection (tests, soak): only when VGPU_FAULTS_DIR is set.
    let backend = vgpu_backend::faults::from_env(backend, args.vgpu_id);
    let cfg = DeviceConfig {
        vgpu_id: args.vgpu_id,
        num_queues: args.queues,
        queue_size: args.queue_size,
        memory_share: args.memory,
        compute_share: args.compute_share,
        copy_share: args.copy_share,
    };
    let mut vgpu = Vgpu::new(cfg, backend.clone())?;
    if let (Some(a), true) = (&asker, args.shm) {
        vgpu = vgpu.with_shm(Arc::new(WorkerShm::new(a.clone(), backend.clone())));
    }
    if let Some(set) = storage.clone() {
        vgpu = vgpu.with_storage(set);
    }
    let mut gate = None;
    if let Some((page, doorbell)) = args.grant_fds {
        let g = Arc::new(vgpu_grant::SwitchGate::new(grant_gate(page, doorbell)?));
        vgpu = vgpu.with_gate(g.clone());
        gate = Some(g);
        tracing::info!("copies and kernels are scheduled by vgpud (grant path)");
    }
    if args.hw_slots > 0 {
        vgpu = vgpu.with_slots(Arc::new(vgpu_device::HwSlots::new(
            args.hw_slots,
            args.slot_policy,
        )));
    }
    let vgpu = Arc::new(vgpu);
    let mut listener = bind(&args.socket)?;

    let shutdown: Shutdown = Arc::new(Mutex::new(None));
    let (sd, path, g) = (shutdown.clone(), args.socket.clone(), gate.clone());
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            let sig = wait_signal(&signals);
            stop(
                &sd,
                &path,
                g.as_deref(),
                if sig == libc::SIGINT {
                    "SIGINT"
                } else {
                    "SIGTERM"
                },
            );
        })
        .map_err(WorkerError::Signals)?;

    tracing::info!(socket = %args.socket.display(), vgpu = args.vgpu_id, queues = args.queues,
        memory = args.memory, compute_share = args.compute_share, copy_share = args.copy_share,
        "listening");
    let state = Arc::new(ControlState {
        vgpu: vgpu.clone(),
        started: Instant::now(),
        shares: Mutex::new(Shares {
            compute: args.compute_share,
            copy: args.copy_share,
            priority: args.priority,
        }),
        connected: AtomicBool::new(false),
        shutdown: shutdown.clone(),
        socket: args.socket.clone(),
        pager,
        asker,
        migratable,
        gate,
        memory: args.memory,
        storage,
    });
    let out = match channel {
        Some((input, out, _)) => {
            out.send(&WorkerMessage::Ready {
                pid: std::process::id(),
            });
            let (o, st, fq) = (out.clone(), state.clone(), fds.clone());
            std::thread::Builder::new()
                .name("control".into())
                .spawn(move || control_loop(input, fq, o, st))
                .map_err(WorkerError::Signals)?;
            Some(out)
        }
        None => None,
    };
    let poll = std::time::Duration::from_micros(args.poll_us);
    let served = serve(&mut listener, vgpu, &shutdown, poll, || {
        state.connected.store(true, Ordering::Relaxed);
        if let Some(out) = &out {
            out.send(&WorkerMessage::Connected);
        }
    });
    if let Some(out) = &out {
        state.connected.store(false, Ordering::Relaxed);
        out.send(&WorkerMessage::Final {
            stats: state.stats(),
        });
    }
    served?;
    tracing::info!("frontend gone; exiting");
    Ok(())
}

fn main() -> ExitCode {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("vgpu-worker: error: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vgpu_proto::VgpuConfig;
    use vhost::vhost_user::message::{VhostUserConfigFlags, VhostUserProtocolFeatures};
    use vhost::vhost_user::{Frontend, VhostUserFrontend};
    use vhost::VhostBackend;

    fn tmp(name: &str) -> PathBuf {
        std::env::temp_dir().join(format!("vgpu-worker-test-{}-{name}", std::process::id()))
    }

    #[test]
    fn bind_errors_are_clear() {
        let e = bind(Path::new("/nonexistent-dir/x.sock"))
            .err()
            .expect("no such dir");
        assert!(e.to_string().contains("/nonexistent-dir/x.sock"), "{e}");
        let file = tmp("plain-file");
        std::fs::write(&file, b"x").expect("write");
        let e = bind(&file).err().expect("not a socket");
        assert!(e.to_string().contains("not a socket"), "{e}");
        std::fs::remove_file(&file).expect("rm");
        let live = tmp("live.sock");
        let _l = bind(&live).expect("bind");
        let e = bind(&live).err().expect("in use");
        assert!(e.to_string().contains("another process"), "{e}");
    }

    #[test]
    fn a_stale_socket_is_replaced() {
        let p = tmp("stale.sock");
        drop(std::os::unix::net::UnixListener::bind(&p).expect("bind"));
        assert!(p.exists(), "std leaves the socket file behind");
        let l = bind(&p).expect("stale socket replaced");
        drop(l);
        assert!(!p.exists(), "the listener removes its socket");
    }

    #[test]
    fn serves_a_frontend_until_it_disconnects() {
        let path = tmp("serve.sock");
        let mut listener = bind(&path).expect("bind");
        let sim = SimGpu::new(SimConfig {
            memory: 16 << 20,
            va_size: 1 << 30,
            threads: 1,
            ..SimConfig::default()
        })
        .expect("sim");
        let cfg = DeviceConfig {
            vgpu_id: 9,
            num_queues: 3,
            queue_size: 256,
            memory_share: 16 << 20,
            compute_share: 250,
            copy_share: 750,
        };
        let vgpu = Arc::new(Vgpu::new(cfg, Arc::new(sim)).expect("vgpu"));
        let shutdown: Shutdown = Arc::new(Mutex::new(None));
        let sd = shutdown.clone();
        let worker = std::thread::spawn(move || {
            serve(&mut listener, vgpu, &sd, std::time::Duration::ZERO, || {})
        });

        let mut fe = Frontend::connect(&path, 3).expect("connect");
        fe.set_owner().expect("owner");
        let features = fe.get_features().expect("features");
        assert_ne!(features & (1 << 32), 0);
        fe.set_features(features).expect("set features");
        let pf = fe.get_protocol_features().expect("protocol features");
        assert!(pf.contains(VhostUserProtocolFeatures::CONFIG | VhostUserProtocolFeatures::MQ));
        fe.set_protocol_features(pf).expect("set protocol features");
        assert_eq!(fe.get_queue_num().expect("queue num"), 3);
        let buf = [0u8; VgpuConfig::SIZE];
        let (_, cfg) = fe
            .get_config(0, buf.len() as u32, VhostUserConfigFlags::WRITABLE, &buf)
            .expect("config");
        assert_eq!(
            &cfg[4..8],
            &9u32.to_le_bytes(),
            "vgpu id in the config space"
        );
        assert_eq!(
            &cfg[8..12],
            &3u32.to_le_bytes(),
            "queue count in the config space"
        );
        drop(fe);
        worker
            .join()
            .expect("worker thread")
            .expect("clean exit on disconnect");
    }
}
