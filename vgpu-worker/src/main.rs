//! `vgpu-worker`: serves exactly one vGPU's vhost-user socket from a GPU backend.
//!
//! One process per vGPU (GPU contexts in one process are not isolated: docs/architecture.md). The
//! worker binds the socket, waits for the VM's vmm (the vhost-user frontend) to connect,
//! serves the vGPU's queues until the frontend disconnects, then exits with status 0 and
//! removes the socket. After a clean disconnect it accepts no second connection: a vGPU's
//! device memory dies with its VM (invariant 5), so the daemon starts a fresh worker for a
//! fresh VM. A connection that ends on a refused request (docs/hostile.md) is the one
//! exception: the vGPU keeps its state and the next connection is served.
//! SIGTERM or SIGINT end it the same way, at any time.
//!
//! Control channel (`--control-fd N`, see `vgpu_api::control`): newline-delimited JSON on an
//! inherited unix socket. The worker says `ready` once its socket is bound and `connected`
//! when the vmm connected, and answers `stats`, `set_shares` and `shutdown`. When vgpud's
//! end closes, the worker keeps serving its guest and waits `--control-reconnect-s` for
//! vgpud to come back on `--control-listen` (a restart or an upgrade of vgpud), then shuts
//! down as on SIGTERM. Without `--control-fd` it runs alone.
//!
//! Sandbox (`sandbox.rs`, docs/hostile.md): not dumpable, `no_new_privs`, and a seccomp
//! filter (`--seccomp`) once start-up is done; vgpud gives it its own identity and a
//! private directory.

mod backend;
mod control;
mod error;
mod incoming;
mod inherit;
mod memlink;
mod migrate;
mod outgoing;
mod pool;
mod run;
mod sandbox;
mod serve;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use vgpu_api::units::{parse_bandwidth, parse_share, parse_size};
use vgpu_device::{DeviceConfig, DEFAULT_QUEUE_SIZE, MAX_QUEUES};

use crate::backend::{BackendKind, GpuSpec};
use crate::run::Config;

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
    /// Path of the vhost-user socket to listen on (the VM's vmm connects to it); with
    /// --listen-fd, the path vgpud bound it at (the worker binds nothing).
    #[arg(long, required_unless_present_any = ["list_cuda_gpus", "pool"])]
    socket: Option<PathBuf>,
    /// Host-wide id of the vGPU (shown to the guest in the config space).
    #[arg(long, required_unless_present_any = ["list_cuda_gpus", "pool"])]
    vgpu_id: Option<u32>,
    /// Device memory the vGPU may allocate (its memory share).
    #[arg(long, value_parser = parse_size, required_unless_present_any = ["list_cuda_gpus", "pool"])]
    memory: Option<u64>,
    /// Print the machine's NVIDIA GPUs as one JSON array (ordinal, name, memory) and exit;
    /// vgpud asks this way so that it never loads the GPU driver itself.
    #[arg(long, exclusive = true)]
    list_cuda_gpus: bool,
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
    /// Stack (local memory) per GPU thread on a CUDA GPU. The driver reserves it for every
    /// thread the GPU can hold at once (132 SMs x 2048 threads on the H200: 264 MiB at
    /// 1K), and that reserve is charged to --memory; a kernel needing more local memory
    /// per thread is refused.
    #[arg(long, value_parser = parse_size, default_value = "1K")]
    cuda_stack: u64,
    /// Device `malloc` heap of the CUDA context (charged to --memory; the driver takes at
    /// least 4M).
    #[arg(long, value_parser = parse_size, default_value = "8M")]
    cuda_heap: u64,
    /// printf FIFO of the CUDA context (charged to --memory; the driver takes at least
    /// 512K).
    #[arg(long, value_parser = parse_size, default_value = "1M")]
    cuda_printf_fifo: u64,
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
    /// Most guest memory the frontend's memory table may map (and the backend pin in host
    /// memory), in bytes: vgpud passes its VM's memory size (docs/hostile.md).
    #[arg(long, value_parser = parse_size, default_value_t = vgpu_device::front::DEFAULT_MAX_GUEST_MEMORY)]
    max_guest_memory: u64,
    /// Most launches a queue hands the GPU at once when the guest posts them together: one
    /// grant of the GPU's scheduler for all of them, kernels back to back (1 = every launch
    /// alone). A batch also stops at 2 ms of its kernels' usual run times, which bounds how
    /// long the scheduler cannot hand the GPU to another vGPU.
    #[arg(long, default_value_t = vgpu_device::DEFAULT_MAX_BATCH,
        value_parser = clap::value_parser!(u16).range(1..=i64::from(vgpu_device::MAX_BATCH)))]
    max_batch: u16,
    /// Attach a storage namespace for GPU-initiated reads, `ID=PATH[:ro|:rw]`
    /// (read-only unless `:rw`); repeat for more. The guest attaches it with
    /// STORAGE_ATTACH; it is opened (emulated NVMe controller over the file) then.
    #[arg(long, value_parser = vgpu_api::api::StorageAttachment::parse)]
    storage: Vec<vgpu_api::api::StorageAttachment>,
    /// The system call filter installed once start-up is done: `kill` (a call outside it
    /// kills the worker with SIGSYS), `log` (the kernel logs it and lets it through: for
    /// finding what the filter misses) or `off`. vgpud passes its `--worker-seccomp`.
    #[arg(long, value_enum, default_value_t = sandbox::SeccompMode::Off)]
    seccomp: sandbox::SeccompMode,
    /// A unix socket to listen on for vgpud coming back when the control channel closes
    /// (a vgpud restart); needs --secret-file. The worker keeps serving its guest while
    /// it waits.
    #[arg(long, requires = "secret_file")]
    control_listen: Option<PathBuf>,
    /// An inherited listening unix socket to serve the vhost-user frontend on, bound by
    /// vgpud at the path its frontend knows, instead of binding --socket itself.
    #[arg(long)]
    listen_fd: Option<i32>,
    /// An inherited listening unix socket for vgpud coming back (as --control-listen,
    /// bound by vgpud); needs --secret-file.
    #[arg(long, requires = "secret_file", conflicts_with = "control_listen")]
    control_listen_fd: Option<i32>,
    /// The file holding the secret a reconnecting vgpud must present.
    #[arg(long)]
    secret_file: Option<PathBuf>,
    /// Seconds to wait for vgpud on --control-listen before stopping (0 = stop at once).
    #[arg(long, default_value_t = 60)]
    control_reconnect_s: u64,
    /// Receive the vGPU's state from a worker on another host before serving the guest
    /// (whole-VM migration): listen on `unix:PATH` or `tcp:HOST:PORT` for one connection.
    /// Needs --migrate-token-file.
    #[arg(long, requires = "migrate_token_file")]
    migrate_in: Option<String>,
    /// The file holding the one-time token the source worker must present.
    #[arg(long)]
    migrate_token_file: Option<PathBuf>,
    /// Start as a pool worker (vgpud's `--worker-pool`): build the GPU backend (a cuda
    /// GPU is opened with its whole memory as the ceiling; the vGPU's share is enforced
    /// per vGPU), say ready and wait for vgpud to assign a vGPU on the control channel.
    /// Needs --control-fd; --socket defaults to `vgpu.sock`, --vgpu-id and --memory come
    /// with the assignment; a sim GPU needs --sim-memory.
    #[arg(long, conflicts_with_all = ["vgpu_id", "memory", "grant_fds", "oversubscribe", "storage"])]
    pool: bool,
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

impl Args {
    /// The worker's configuration; `None` without the vGPU's arguments (clap requires them
    /// unless `--list-cuda-gpus` is given).
    fn into_config(self) -> Option<Config> {
        let (socket, vgpu_id, memory) = if self.pool {
            if self.backend == BackendKind::Sim && self.sim_memory.is_none() {
                return None;
            }
            let socket = self.socket.unwrap_or_else(|| PathBuf::from("vgpu.sock"));
            // Placeholders until vgpud assigns a vGPU; a cuda GPU is opened with its whole
            // memory as the ceiling (capped at the GPU's by the backend).
            (socket, 0, u64::MAX)
        } else {
            (self.socket?, self.vgpu_id?, self.memory?)
        };
        Some(Config {
            device: DeviceConfig {
                vgpu_id,
                num_queues: self.queues,
                queue_size: self.queue_size,
                memory_share: memory,
                compute_share: self.compute_share,
                copy_share: self.copy_share,
                batch: vgpu_device::BatchLimits {
                    max_launches: self.max_batch,
                    ..vgpu_device::BatchLimits::default()
                },
            },
            gpu: GpuSpec {
                kind: self.backend,
                ordinal: self.gpu,
                memory,
                cuda_limits: vgpu_backend::cuda::ContextLimits {
                    stack_bytes: self.cuda_stack,
                    heap_bytes: self.cuda_heap,
                    printf_fifo_bytes: self.cuda_printf_fifo,
                },
                sim_memory: self.sim_memory,
                sim_copy_bw: self.sim_copy_bw,
                sim_speed: self.sim_speed,
                sim_threads: self.sim_threads,
            },
            socket,
            priority: self.priority,
            control_fd: self.control_fd,
            grant_fds: self.grant_fds,
            hw_slots: self.hw_slots,
            slot_policy: self.slot_policy,
            oversubscribe: self.oversubscribe,
            shm: self.shm,
            poll: Duration::from_micros(self.poll_us),
            max_guest_memory: self.max_guest_memory,
            storage: self
                .storage
                .into_iter()
                .map(|a| vgpu_backend::storage::NamespaceSpec {
                    id: a.namespace,
                    path: a.path.into(),
                    read_only: a.read_only,
                })
                .collect(),
            seccomp: self.seccomp,
            control_listen: self.control_listen,
            secret_file: self.secret_file,
            listen_fd: self.listen_fd,
            control_listen_fd: self.control_listen_fd,
            reconnect: Duration::from_secs(self.control_reconnect_s),
            migrate_in: self.migrate_in,
            migrate_token_file: self.migrate_token_file,
            pool: self.pool,
        })
    }
}

/// `--list-cuda-gpus`: the GPUs as JSON on stdout.
fn list_cuda_gpus() -> ExitCode {
    let devices = match vgpu_backend::cuda::CudaGpu::devices() {
        Ok(d) => d,
        Err(why) => {
            eprintln!("vgpu-worker: cannot list NVIDIA GPUs: {why}");
            return ExitCode::FAILURE;
        }
    };
    let list: Vec<vgpu_api::control::CudaDevice> = devices
        .into_iter()
        .map(|d| vgpu_api::control::CudaDevice {
            ordinal: d.ordinal,
            name: d.name,
            memory: d.memory,
        })
        .collect();
    match serde_json::to_string(&list) {
        Ok(json) => {
            println!("{json}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("vgpu-worker: cannot encode the GPU list: {e}");
            ExitCode::FAILURE
        }
    }
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
    if args.list_cuda_gpus {
        return list_cuda_gpus();
    }
    let Some(config) = args.into_config() else {
        eprintln!(
            "vgpu-worker: error: give --socket, --vgpu-id and --memory, or --pool (with --sim-memory for a sim GPU) (see --help)"
        );
        return ExitCode::from(2);
    };
    match run::run(config) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("vgpu-worker: error: {e}");
            ExitCode::FAILURE
        }
    }
}
