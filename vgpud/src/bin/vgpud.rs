//! `vgpud`: the host daemon. See `vgpud --help` and docs/api.md.

use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::{CommandFactory, Parser, ValueEnum};
use vgpu_api::control::CudaDevice;
use vgpud::daemon::{self, Config, DaemonError, GpuConfig, Listen, ShmLimits};
use vgpud::units::{parse_bandwidth, parse_size};

/// The vgpu host daemon: owns the physical GPUs, runs one vgpu-worker per vGPU and one
/// vmm per VM, and serves the REST API (docs/api.md) on a unix socket, or on TCP with a
/// bearer token.
#[derive(Parser, Debug)]
#[command(name = "vgpud", version, args_override_self = true)]
struct Args {
    /// JSON file of options: `{"sim-gpus": 4, "payload-dir": "/srv/vgpu/payloads"}`,
    /// keys the long option names without `--`, a flag `true`; the command line and the
    /// options' environment variables override it; an unknown key is an error.
    #[arg(long, env = "VGPUD_CONFIG")]
    config: Option<PathBuf>,
    /// Log format on stderr: text, or json (one object a line, for a log collector).
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    /// Unix socket to serve the API on [default: /run/vgpud/vgpud.sock for root,
    /// $XDG_RUNTIME_DIR/vgpud/vgpud.sock for others]. Its directory must be vgpud's own.
    #[arg(long, env = "VGPUD_SOCKET", conflicts_with = "listen")]
    socket: Option<PathBuf>,
    /// Serve the API on TCP instead (e.g. 127.0.0.1:7070); needs --token-file.
    #[arg(long)]
    listen: Option<SocketAddr>,
    /// File holding the bearer token clients must send (mandatory with --listen).
    #[arg(long)]
    token_file: Option<PathBuf>,
    /// Directory for worker sockets, worker logs, VM consoles and the state file that
    /// keeps vGPU definitions and VM records across restarts [default: the socket's
    /// directory]. Must be owned by vgpud's uid and writable by no one else.
    #[arg(long)]
    state_dir: Option<PathBuf>,
    /// GPU backend.
    #[arg(long, value_enum, default_value_t = BackendKind::Sim)]
    backend: BackendKind,
    /// Number of simulated GPUs.
    #[arg(long, default_value_t = 2)]
    sim_gpus: u32,
    /// Memory of each simulated GPU (binary suffixes: 8G, 512M), at least 64M.
    #[arg(long, default_value = "8G", value_parser = parse_size)]
    sim_memory: u64,
    /// Host-device copy bandwidth of each simulated GPU in bytes/s (decimal: 12G); 0 = unpaced.
    #[arg(long, default_value = "12G", value_parser = parse_bandwidth)]
    sim_copy_bw: u64,
    /// Compute-rate factor of each simulated GPU (1.0 = 1e9 element operations/s).
    #[arg(long, default_value_t = 1.0)]
    sim_speed: f64,
    /// Host threads one simulated kernel may use in a worker (0 = all cores).
    #[arg(long, default_value_t = 1)]
    sim_threads: usize,
    /// Microseconds each worker queue thread keeps polling its ring after a request before
    /// it sleeps (adaptive polling: saves the guest's kick and a wake-up per request, at
    /// the cost of a core spinning that long after each burst). 0 = off [default: 50 on
    /// cuda GPUs when the machine has 4 or more CPUs, else 0].
    #[arg(long, value_parser = clap::value_parser!(u64).range(0..=10_000))]
    queue_poll_us: Option<u64>,
    /// Fraction of each GPU's memory kept as the device-side swap area of oversubscribed
    /// vGPUs ("0.1" or "10%").
    #[arg(long, value_parser = parse_fraction, default_value = "10%")]
    swap_area: f64,
    /// Scheduling policy of every GPU: band (Gdev's BAND), credit or fifo (to compare).
    #[arg(long, default_value = "band")]
    policy: vgpu_scheduler::gpu::PolicyKind,
    /// BAND's hand-over margin, µs: how far a waiting vGPU must be owed before it takes the
    /// GPU from a busy one (each hand-over costs the GPU a context switch). Larger: fewer
    /// switches, longer turns; 0: hand over at the first owed microsecond. This is the
    /// margin of two busy vGPUs; with N it grows by 2(N-1)/N, so turns stay as long
    /// (docs/scheduler.md, point 8). 0 to 15000.
    #[arg(long, default_value_t = vgpu_scheduler::Config::DEFAULT.switch_margin / 1000, value_parser = clap::value_parser!(u64).range(0..=15_000))]
    band_margin_us: u64,
    /// The vgpu-worker binary [default: next to vgpud].
    #[arg(long, env = "VGPUD_WORKER_BIN")]
    worker_bin: Option<PathBuf>,
    /// The vmm binary [default: next to vgpud].
    #[arg(long, env = "VGPUD_VMM_BIN")]
    vmm_bin: Option<PathBuf>,
    /// Directory of the payload ELFs: bare payload names in POST /v1/vms are looked up
    /// there, and every payload must lie under it (GET /v1/payloads lists them). Must exist.
    #[arg(long, env = "VGPU_PAYLOAD_DIR")]
    payload_dir: Option<PathBuf>,
    /// Directory storage namespaces' backing files must lie under [default: anywhere the
    /// daemon can read].
    #[arg(long, env = "VGPUD_STORAGE_ROOT")]
    storage_root: Option<PathBuf>,
    /// How often every worker's counters are sampled, ms.
    #[arg(long, default_value_t = 250)]
    stats_interval_ms: u64,
    /// The window utilizations are computed over, ms.
    #[arg(long, default_value_t = 1000)]
    stats_window_ms: u64,
    /// The rebalancer (docs/rebalance.md): off (measure demand only), balance (live-migrate
    /// vGPUs off GPUs that stay overloaded) or consolidate (balance, and pack light load
    /// onto fewer GPUs).
    #[arg(long, default_value = "off")]
    rebalance: vgpu_scheduler::rebalance::Mode,
    /// How often the rebalancer measures demand and decides, ms.
    #[arg(long, default_value_t = 250)]
    rebalance_interval_ms: u64,
    /// How long one request (a kernel, a copy) of a vGPU may hold the GPU before the
    /// scheduler takes the GPU back, gives it to the neighbours and charges the overrun to
    /// that vGPU (docs/scheduler.md). 10 to 60000.
    #[arg(long, default_value_t = 2000, value_parser = clap::value_parser!(u64).range(10..=60_000))]
    kernel_deadline_ms: u64,
    /// How long an overload (or light load) must last before the rebalancer acts, ms;
    /// its cool-downs scale with it.
    #[arg(long, default_value_t = 2000)]
    rebalance_window_ms: u64,
    /// Start even if the state file (vgpud-state.json in the state directory) is damaged
    /// or from a newer vgpud: it is set aside as vgpud-state.json.discarded-<time> and
    /// this vgpud starts without the vGPUs and VM records it held.
    #[arg(long)]
    discard_state: bool,
    /// Shared memory objects one vGPU may have created and not yet freed.
    #[arg(long, default_value_t = ShmLimits::default().objects_per_vgpu)]
    shm_objects_per_vgpu: usize,
    /// Shared memory objects one share group may hold on one GPU.
    #[arg(long, default_value_t = ShmLimits::default().objects_per_group)]
    shm_objects_per_group: usize,
    /// Shared memory attachments one vGPU may hold at once.
    #[arg(long, default_value_t = ShmLimits::default().attachments_per_vgpu)]
    shm_attachments_per_vgpu: u64,
    /// Seconds a released vGPU stays in `GET /v1/vgpus` and in the metrics before it is
    /// forgotten (0: at once).
    #[arg(long, default_value_t = 300)]
    released_retention_s: u64,
    /// Seconds a client may take to send a request's headers before vgpud closes the
    /// connection (a client stalled half-way through cannot hold it). 1 to 3600.
    #[arg(long, env = "VGPUD_HEADER_READ_TIMEOUT_S", default_value_t = 10,
        value_parser = clap::value_parser!(u64).range(1..=3600))]
    header_read_timeout_s: u64,
    /// Seconds an API connection may sit without a request before vgpud closes it (idle
    /// clients cannot pile up descriptors). 1 to 86400.
    #[arg(long, env = "VGPUD_API_IDLE_TIMEOUT_S", default_value_t = 60,
        value_parser = clap::value_parser!(u64).range(1..=86400))]
    api_idle_timeout_s: u64,
    /// Most API connections (unix socket and TCP together) open at once; one more is
    /// closed on arrival [default: a quarter of the open-file limit, at most 1024].
    #[arg(long, env = "VGPUD_MAX_API_CONNECTIONS",
        value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    max_api_connections: Option<u64>,
    /// Seconds an admitted incoming VM waits for its source to connect its stream before
    /// the move is cancelled and its vGPU's shares released. 1 to 3600.
    #[arg(long, env = "VGPUD_MIGRATION_CONNECT_TIMEOUT_S", default_value_t = 30,
        value_parser = clap::value_parser!(u64).range(1..=3600))]
    migration_connect_timeout_s: u64,
    /// Time constant of the rebalancer's demand smoothing (EWMA), ms; default a quarter of
    /// the window. With fast migrations (a short window) the interval's own average is
    /// smoothing enough (docs/rebalance.md).
    #[arg(long)]
    rebalance_smoothing_ms: Option<u64>,
    /// Print the OpenAPI document (docs/openapi.json) and exit.
    #[arg(long)]
    print_openapi: bool,
    #[command(flatten)]
    sandbox: SandboxArgs,
}

/// Worker sandbox and restart options (docs/hostile.md, "A compromised worker").
#[derive(clap::Args, Debug)]
struct SandboxArgs {
    /// When vgpud runs as root, vGPU N's worker runs as uid and gid BASE+N (no other
    /// group), and worker pool slot S's as BASE-1-S; 0 = as vgpud's own user. Pick a
    /// range no account uses.
    #[arg(long, default_value_t = daemon::DEFAULT_WORKER_UID_BASE)]
    worker_uid_base: u32,
    /// What a system call outside a worker's seccomp filter does: kill (SIGSYS; vgpud
    /// reports "worker violated its seccomp filter"), log (the kernel logs it and lets it
    /// through: for debugging) or off.
    #[arg(long, value_enum, default_value_t = SeccompArg::Kill)]
    worker_seccomp: SeccompArg,
    /// Seconds a worker keeps serving its guest after vgpud went away (stopped, restarted,
    /// upgraded, killed), waiting for vgpud to come back, before it stops.
    #[arg(long, default_value_t = 60)]
    control_reconnect_s: u64,
    /// Idle workers kept started per GPU, their GPU backend built (a cuda worker's
    /// context and built-in kernels), so a new vGPU starts in milliseconds; each costs a
    /// GPU context and its memory while idle [default: 2 per cuda GPU, 0 per sim GPU].
    #[arg(long, value_parser = clap::value_parser!(u64).range(0..=64))]
    worker_pool: Option<u64>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum SeccompArg {
    Off,
    Log,
    Kill,
}

impl SandboxArgs {
    fn config(&self) -> daemon::WorkerSandbox {
        daemon::WorkerSandbox {
            uid_base: (self.worker_uid_base != 0).then_some(self.worker_uid_base),
            seccomp: match self.worker_seccomp {
                SeccompArg::Off => daemon::SeccompMode::Off,
                SeccompArg::Log => daemon::SeccompMode::Log,
                SeccompArg::Kill => daemon::SeccompMode::Kill,
            },
            control_reconnect: Duration::from_secs(self.control_reconnect_s),
            pool: self
                .worker_pool
                .map(|n| usize::try_from(n).unwrap_or(usize::MAX)),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object a line.
    Json,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum BackendKind {
    /// Simulated GPUs (host memory, kernels on CPU threads).
    Sim,
    /// NVIDIA GPUs through CUDA.
    Cuda,
    /// CUDA when available, else sim.
    Auto,
}

/// The machine's NVIDIA GPUs, as the worker program sees them (`vgpu-worker
/// --list-cuda-gpus`): vgpud itself never loads the GPU driver.
fn cuda_devices(worker_bin: &std::path::Path) -> Result<Vec<CudaDevice>, String> {
    let out = std::process::Command::new(worker_bin)
        .arg("--list-cuda-gpus")
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| {
            format!(
                "cannot run {} --list-cuda-gpus: {e} (set --worker-bin)",
                worker_bin.display()
            )
        })?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        return Err(err.trim().trim_start_matches("vgpu-worker: ").to_string());
    }
    serde_json::from_slice(&out.stdout).map_err(|e| {
        format!("{} --list-cuda-gpus printed something that is not a GPU list ({e}); is it the vgpu-worker of this vgpud?", worker_bin.display())
    })
}

fn config(args: Args) -> Result<Config, DaemonError> {
    let worker_bin = args
        .worker_bin
        .clone()
        .unwrap_or_else(|| daemon::sibling_binary("vgpu-worker"));
    let cuda = match args.backend {
        BackendKind::Sim => None,
        BackendKind::Cuda => Some(
            cuda_devices(&worker_bin)
                .and_then(|d| if d.is_empty() { Err("the NVIDIA driver sees no GPU".into()) } else { Ok(d) })
                .map_err(|why| DaemonError::Option(format!("--backend cuda: {why}; use --backend sim on a machine without an NVIDIA GPU")))?,
        ),
        BackendKind::Auto => match cuda_devices(&worker_bin) {
            Ok(d) if !d.is_empty() => Some(d),
            Ok(_) | Err(_) => {
                tracing::info!("--backend auto: no usable NVIDIA GPU; using the sim backend");
                None
            }
        },
    };
    if args.sim_gpus == 0 || args.sim_gpus > 64 {
        return Err(DaemonError::Option(format!(
            "--sim-gpus {}: give 1 to 64",
            args.sim_gpus
        )));
    }
    if !(args.sim_speed.is_finite() && args.sim_speed > 0.0) {
        return Err(DaemonError::Option(format!(
            "--sim-speed {}: give a positive factor (1.0 = nominal)",
            args.sim_speed
        )));
    }
    if args.sim_memory < MIN_SIM_MEMORY {
        return Err(DaemonError::Option(format!(
            "--sim-memory {}: give at least 64M (binary suffixes: 512M, 8G); a bare number is bytes",
            args.sim_memory
        )));
    }
    for (flag, dir) in [
        ("--payload-dir", &args.payload_dir),
        ("--storage-root", &args.storage_root),
    ] {
        if let Some(d) = dir {
            if !d.is_dir() {
                return Err(DaemonError::Option(format!(
                    "{flag} {}: no such directory; create it or give another",
                    d.display()
                )));
            }
        }
    }
    if args.stats_interval_ms == 0 || args.stats_window_ms < args.stats_interval_ms {
        return Err(DaemonError::Option(
            "--stats-interval-ms must be > 0 and at most --stats-window-ms".into(),
        ));
    }
    if args.rebalance_interval_ms == 0 || args.rebalance_window_ms < args.rebalance_interval_ms {
        return Err(DaemonError::Option(
            "--rebalance-interval-ms must be > 0 and at most --rebalance-window-ms".into(),
        ));
    }
    let token = match &args.token_file {
        Some(path) => {
            check_private(path)?;
            let t = std::fs::read_to_string(path).map_err(|e| DaemonError::Token {
                path: path.clone(),
                why: e.to_string(),
            })?;
            let t = t.trim().to_owned();
            if t.is_empty() || t.chars().any(|c| c.is_whitespace() || c.is_control()) {
                return Err(DaemonError::Token {
                    path: path.clone(),
                    why: "the token must be one non-empty word (no spaces)".into(),
                });
            }
            if t.len() < 16 {
                tracing::warn!("the token is shorter than 16 characters; use a longer random one");
            }
            Some(t)
        }
        None => None,
    };
    let listen = match args.listen {
        Some(addr) => {
            if token.is_none() {
                return Err(DaemonError::TokenRequired {
                    addr: addr.to_string(),
                });
            }
            if !addr.ip().is_loopback() {
                tracing::warn!(%addr, "listening beyond loopback; every request needs the bearer token");
            }
            Listen::Tcp(addr)
        }
        None => Listen::Unix(match args.socket.clone() {
            Some(p) => p,
            None => daemon::default_socket()?,
        }),
    };
    let state_dir = match (&args.state_dir, &listen) {
        (Some(d), _) => d.clone(),
        (None, Listen::Unix(p)) => match p.parent().filter(|d| !d.as_os_str().is_empty()) {
            Some(d) => d.to_owned(),
            None => daemon::default_state_dir()?,
        },
        (None, Listen::Tcp(_)) => daemon::default_state_dir()?,
    };
    let cuda_gpus = cuda.is_some();
    let gpus = match cuda {
        Some(devices) => devices
            .into_iter()
            .map(|d| GpuConfig {
                name: d.name,
                cuda_ordinal: Some(d.ordinal),
                memory: d.memory,
                copy_bandwidth: 0,
                speed: 1.0,
            })
            .collect(),
        None => (0..args.sim_gpus)
            .map(|i| GpuConfig {
                name: format!("vgpu-sim-{i}"),
                cuda_ordinal: None,
                memory: args.sim_memory,
                copy_bandwidth: args.sim_copy_bw,
                speed: args.sim_speed,
            })
            .collect(),
    };
    Ok(Config {
        listen,
        token,
        state_dir,
        gpus,
        worker_bin,
        vmm_bin: args
            .vmm_bin
            .unwrap_or_else(|| daemon::sibling_binary("vmm")),
        sim_threads: args.sim_threads,
        queue_poll_us: args
            .queue_poll_us
            .unwrap_or_else(|| default_queue_poll_us(cuda_gpus)),
        payload_dir: args.payload_dir,
        storage_root: args.storage_root,
        stats_interval: Duration::from_millis(args.stats_interval_ms),
        stats_window: Duration::from_millis(args.stats_window_ms),
        policy: args.policy,
        band_margin: Duration::from_micros(args.band_margin_us),
        swap_area: args.swap_area,
        rebalance: {
            let mut r = vgpu_scheduler::rebalance::RebalanceConfig::with_window(
                args.rebalance,
                args.rebalance_window_ms.saturating_mul(1_000_000),
            );
            if let Some(ms) = args.rebalance_smoothing_ms {
                r.smoothing = ms.saturating_mul(1_000_000);
            }
            r
        },
        rebalance_interval: Duration::from_millis(args.rebalance_interval_ms),
        kernel_deadline: Duration::from_millis(args.kernel_deadline_ms),
        discard_state: args.discard_state,
        shm_limits: ShmLimits {
            objects_per_vgpu: args.shm_objects_per_vgpu,
            objects_per_group: args.shm_objects_per_group,
            attachments_per_vgpu: args.shm_attachments_per_vgpu,
            ..ShmLimits::default()
        },
        workers: args.sandbox.config(),
        released_retention: Duration::from_secs(args.released_retention_s),
        header_read_timeout: Duration::from_secs(args.header_read_timeout_s),
        api_idle_timeout: Duration::from_secs(args.api_idle_timeout_s),
        max_api_connections: args
            .max_api_connections
            .map(|n| usize::try_from(n).unwrap_or(usize::MAX)),
        migration_connect_timeout: Duration::from_secs(args.migration_connect_timeout_s),
    })
}

/// Smallest simulated GPU: below it not even one vGPU with a payload's buffers fits.
const MIN_SIM_MEMORY: u64 = 64 << 20;

/// The token file may not be readable or writable by group or others.
fn check_private(path: &Path) -> Result<(), DaemonError> {
    let meta = std::fs::metadata(path).map_err(|e| DaemonError::Token {
        path: path.to_owned(),
        why: e.to_string(),
    })?;
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o066 != 0 {
        return Err(DaemonError::Token {
            path: path.to_owned(),
            why: format!(
                "group or others can read or write it (mode {mode:04o}); run `chmod 600 {}`",
                path.display()
            ),
        });
    }
    Ok(())
}

/// The options of `--config FILE` as command-line words, to go before the real ones (so
/// those override them); options whose environment variable is set are left out.
fn config_words(path: &Path) -> Result<Vec<String>, DaemonError> {
    let bad = |why: String| DaemonError::Option(format!("--config {}: {why}", path.display()));
    let text = std::fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
    let map: serde_json::Map<String, serde_json::Value> = serde_json::from_str(&text)
        .map_err(|e| bad(format!("not a JSON object of options: {e}")))?;
    let cmd = Args::command();
    let mut words = Vec::new();
    for (key, value) in map {
        let arg = cmd
            .get_arguments()
            .find(|a| a.get_long() == Some(key.as_str()))
            .filter(|_| {
                !matches!(
                    key.as_str(),
                    "config" | "print-openapi" | "help" | "version"
                )
            });
        let Some(arg) = arg else {
            return Err(bad(format!(
                "unknown key {key:?}; keys are vgpud's long options without -- (vgpud --help)"
            )));
        };
        if arg
            .get_env()
            .and_then(std::env::var_os)
            .is_some_and(|v| !v.is_empty())
        {
            continue;
        }
        let flag = format!("--{key}");
        match value {
            serde_json::Value::Bool(true) => words.push(flag),
            serde_json::Value::Bool(false) | serde_json::Value::Null => {}
            serde_json::Value::String(v) => words.extend([flag, v]),
            serde_json::Value::Number(n) => words.extend([flag, n.to_string()]),
            other => {
                return Err(bad(format!(
                    "{key:?}: {other} is not a string, number or boolean"
                )))
            }
        }
    }
    Ok(words)
}

/// The command line, with `--config`'s options before it.
fn parse_args() -> Result<Args, DaemonError> {
    let args = Args::parse();
    let Some(path) = args.config.clone() else {
        return Ok(args);
    };
    let mut argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let rest = argv.split_off(1.min(argv.len()));
    argv.extend(config_words(&path)?.into_iter().map(Into::into));
    argv.extend(rest);
    Args::try_parse_from(argv)
        .map_err(|e| DaemonError::Option(format!("with --config {}: {e}", path.display())))
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("vgpud: error: {e}");
            return ExitCode::FAILURE;
        }
    };
    if args.print_openapi {
        print!("{}", vgpud::openapi::openapi_json());
        return ExitCode::SUCCESS;
    }
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    match args.log_format {
        LogFormat::Text => tracing_subscriber::fmt()
            .with_writer(std::io::stderr)
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .with_env_filter(filter)
            .init(),
        LogFormat::Json => tracing_subscriber::fmt()
            .json()
            .with_writer(std::io::stderr)
            .with_env_filter(filter)
            .init(),
    }
    let run = config(args).and_then(|c| daemon::run(c, || {}));
    match run {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("vgpud: error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn parse_fraction(s: &str) -> Result<f64, String> {
    let v = match s.strip_suffix('%') {
        Some(p) => p.trim().parse::<f64>().map(|v| v / 100.0),
        None => s.trim().parse::<f64>(),
    }
    .map_err(|_| format!("{s:?} is not a fraction: give e.g. 0.1 or 10%"))?;
    if (0.0..=0.5).contains(&v) {
        Ok(v)
    } else {
        Err(format!("{s:?}: give a fraction from 0 to 0.5 (50%)"))
    }
}

/// Queue polling unless `--queue-poll-us` says otherwise: on for cuda GPUs where the
/// machine has cores to spare (each poll spins a core for at most 50 µs after a burst, and
/// saves the guest's kick and a wake-up per request), off for sim and on small machines.
fn default_queue_poll_us(cuda: bool) -> u64 {
    let cpus = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
    if cuda && cpus >= 4 {
        50
    } else {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_option_is_in_the_docs() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/api.md");
        let doc = std::fs::read_to_string(path).unwrap_or_default();
        for a in Args::command().get_arguments() {
            if let Some(long) = a.get_long() {
                assert!(
                    doc.contains(&format!("`--{long}")),
                    "--{long} is missing from docs/api.md's options table"
                );
            }
        }
    }

    #[test]
    fn config_files_become_options() {
        let dir = std::env::temp_dir().join(format!("vgpud-config-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let f = dir.join("c.json");
        std::fs::write(
            &f,
            r#"{"sim-gpus": 3, "discard-state": true, "policy": "fifo", "print-openapi": false}"#,
        )
        .expect("write");
        // print-openapi is not a config key.
        let e = config_words(&f).expect_err("print-openapi refused");
        assert!(e.to_string().contains("\"print-openapi\""), "{e}");
        std::fs::write(
            &f,
            r#"{"sim-gpus": 3, "discard-state": true, "policy": "fifo"}"#,
        )
        .expect("write");
        let mut words = config_words(&f).expect("config");
        words.sort();
        assert_eq!(
            words,
            ["--discard-state", "--policy", "--sim-gpus", "3", "fifo"]
        );
        for (text, says) in [
            (r#"{"sim-gpu": 3}"#, "unknown key \"sim-gpu\""),
            (r#"{"sim-gpus": [3]}"#, "not a string, number or boolean"),
            (r#"[1]"#, "not a JSON object"),
        ] {
            std::fs::write(&f, text).expect("write");
            let e = config_words(&f).expect_err(text);
            assert!(e.to_string().contains(says), "{text}: {e}");
        }
        // The command line overrides the file.
        let mut argv: Vec<String> = vec!["vgpud".into()];
        argv.extend(["--sim-gpus".into(), "3".into()]);
        argv.extend(["--sim-gpus".into(), "5".into()]);
        let a = Args::try_parse_from(argv).expect("parse");
        assert_eq!(a.sim_gpus, 5);
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn the_band_margin_is_microseconds_within_half_a_period() {
        let parse = |v: &str| Args::try_parse_from(["vgpud", &format!("--band-margin-us={v}")]);
        assert_eq!(
            Args::try_parse_from(["vgpud"])
                .expect("defaults")
                .band_margin_us,
            4000
        );
        assert_eq!(parse("0").expect("0").band_margin_us, 0);
        for bad in ["15001", "-1", "2ms"] {
            let e = parse(bad).expect_err(bad).to_string();
            assert!(e.contains("--band-margin-us"), "{bad}: {e}");
        }
    }

    #[test]
    fn token_files_must_be_private() {
        let f = std::env::temp_dir().join(format!("vgpud-token-test-{}", std::process::id()));
        std::fs::write(&f, "token-0123456789abcdef").expect("write");
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        let e = check_private(&f).expect_err("world-readable");
        assert!(e.to_string().contains("chmod 600"), "{e}");
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        assert!(check_private(&f).is_ok());
        let _ = std::fs::remove_file(f);
    }
}
