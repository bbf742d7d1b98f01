//! How vgpud runs: its configuration, read once at start.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use super::shm::Limits as ShmLimits;

/// One simulated physical GPU.
#[derive(Clone, Debug, PartialEq)]
pub struct GpuConfig {
    pub name: String,
    /// `None`: a simulated GPU; `Some(n)`: CUDA device ordinal n.
    pub cuda_ordinal: Option<i32>,
    /// Device memory, bytes.
    pub memory: u64,
    /// Host-device copy bandwidth, bytes/s (0 = unpaced).
    pub copy_bandwidth: u64,
    /// Compute-rate factor (1.0 = nominal).
    pub speed: f64,
}

/// Where the API listens.
#[derive(Clone, Debug, PartialEq)]
pub enum Listen {
    /// A unix socket (the default).
    Unix(PathBuf),
    /// A TCP address (needs a token).
    Tcp(SocketAddr),
}

/// How vgpud runs.
#[derive(Clone, Debug)]
pub struct Config {
    pub listen: Listen,
    /// Bearer token every request must carry (mandatory for TCP).
    pub token: Option<String>,
    /// Worker sockets, worker logs and VM consoles live here; so do the lock file and the
    /// state file (`vgpud-state.json`: what survives a restart).
    pub state_dir: PathBuf,
    pub gpus: Vec<GpuConfig>,
    pub worker_bin: PathBuf,
    pub vmm_bin: PathBuf,
    /// Host threads one sim kernel may use in a worker (0 = all).
    pub sim_threads: usize,
    /// Worker queue threads poll their ring this long after a request (0 = off).
    pub queue_poll_us: u64,
    /// Where bare payload names are looked up; when set, every payload must lie under it
    /// (absolute paths too, symlinks and `..` resolved).
    pub payload_dir: Option<PathBuf>,
    /// When set, storage namespaces' backing files must lie under it.
    pub storage_root: Option<PathBuf>,
    /// How often vgpud samples every worker's counters.
    pub stats_interval: Duration,
    /// The window utilizations are computed over.
    pub stats_window: Duration,
    /// The scheduling policy every GPU runs (BAND by default; Credit and FIFO to compare).
    pub policy: vgpu_scheduler::gpu::PolicyKind,
    /// BAND's hand-over margin (`--band-margin-us`; docs/scheduler.md, point 8).
    pub band_margin: Duration,
    /// Fraction of each GPU's memory kept as the temporal swap area for oversubscribed
    /// vGPUs (Gdev; default 0.10).
    pub swap_area: f64,
    /// The rebalancer's policy: mode (off by default), window, thresholds.
    pub rebalance: vgpu_scheduler::rebalance::RebalanceConfig,
    /// How often it measures demand and decides.
    pub rebalance_interval: Duration,
    /// How long a vGPU may hold the GPU with one request before the scheduler takes it
    /// back and charges the overrun (docs/scheduler.md, kernel deadlines).
    pub kernel_deadline: Duration,
    /// Set an unreadable state file aside and start without it (`--discard-state`)
    /// instead of refusing to start.
    pub discard_state: bool,
    /// Bounds on shared memory objects and attachments (docs/hostile.md).
    pub shm_limits: ShmLimits,
    /// How workers are sandboxed, and how long they wait for vgpud after a restart.
    pub workers: WorkerSandbox,
    /// How long a released vGPU stays listed (and in the metrics) before it is
    /// forgotten (zero: at once).
    pub released_retention: Duration,
    /// How long a client may take to send a request's headers before vgpud closes the
    /// connection (`--header-read-timeout-s`).
    pub header_read_timeout: Duration,
    /// How long an API connection may sit without a request before vgpud closes it
    /// (`--api-idle-timeout-s`).
    pub api_idle_timeout: Duration,
    /// Most API connections (unix and TCP together) open at once (`--max-api-connections`);
    /// `None`: a quarter of the open-file limit, at most 1024.
    pub max_api_connections: Option<usize>,
    /// How long an admitted incoming VM waits for its source to connect before the move
    /// is cancelled and what it reserved freed (`--migration-connect-timeout-s`).
    pub migration_connect_timeout: Duration,
}

/// What a violation of a worker's seccomp filter does (`--worker-seccomp`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SeccompMode {
    /// No filter (not recommended).
    Off,
    /// The kernel logs the call and lets it through (for finding what the filter misses).
    Log,
    /// The worker is killed with SIGSYS; vgpud reports "worker violated its seccomp
    /// filter".
    #[default]
    Kill,
}

impl SeccompMode {
    /// The worker's `--seccomp` value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Off => "off",
            Self::Log => "log",
            Self::Kill => "kill",
        }
    }
}

/// The first uid (and gid) of the range workers run under when vgpud runs as root:
/// vGPU N's worker runs as `base + N` (`--worker-uid-base`).
pub const DEFAULT_WORKER_UID_BASE: u32 = 2_000_000_000;

/// How workers are sandboxed (docs/hostile.md, "A compromised worker").
#[derive(Clone, Debug)]
pub struct WorkerSandbox {
    /// When vgpud runs as root, vGPU N's worker runs as uid and gid `base + N` (no other
    /// group), pool slot S's worker as `base - 1 - S`. `None`: as vgpud's own user (a warning is logged at start).
    pub uid_base: Option<u32>,
    /// The worker's system call filter.
    pub seccomp: SeccompMode,
    /// How long a worker whose control channel closed (vgpud stopped, restarted or was
    /// upgraded) keeps serving its guest while it waits for vgpud to reconnect, before it
    /// stops.
    pub control_reconnect: Duration,
    /// Idle workers kept started per GPU (`--worker-pool`), their GPU backend built, so a
    /// new vGPU takes one instead of starting a worker. `None`: 2 per cuda GPU, 0 per sim
    /// GPU.
    pub pool: Option<usize>,
}

impl Default for WorkerSandbox {
    fn default() -> Self {
        Self {
            uid_base: Some(DEFAULT_WORKER_UID_BASE),
            seccomp: SeccompMode::Kill,
            control_reconnect: Duration::from_secs(60),
            pool: None,
        }
    }
}
