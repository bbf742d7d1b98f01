//! `vgpu-demo`: the README's first command (`./ci/demo.sh`).
//!
//! Starts vgpud on the sim backend (2 GPUs), creates two vGPUs with different shares on
//! GPU 0, launches two VMs running the `gpu-load` payload (repeated copies and kernels, each
//! round's result checked by checksum), shows live per-vGPU utilization, ends with a
//! summary table and a PNG plot of utilization over time, and cleans up: no processes,
//! sockets or state left behind.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use clap::Parser;
use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use vgpu_api::api::{MigrateRequest, Vgpu, VgpuCreate, VmCreate, VmState};
use vgpu_api::client::{Client, ClientError, Endpoint};
use vgpu_api::units::human_bytes;

/// Two VMs share one simulated GPU through vGPUs with different shares.
#[derive(Parser, Debug)]
#[command(name = "vgpu-demo", version)]
struct Args {
    /// Rounds of work each VM runs (a round: copy 64 KiB in, saxpy, a spin kernel).
    #[arg(long, default_value_t = 800)]
    rounds: u64,
    /// Length of each round's spin kernel, µs.
    #[arg(long, default_value_t = 10_000)]
    spin_us: u64,
    /// Stop the VMs after this many seconds if they have not finished.
    #[arg(long, default_value_t = 45)]
    max_seconds: u64,
    /// Where the PNG plot goes [default: vgpu-demo/utilization.png in the cargo target
    /// directory, e.g. target/vgpu-demo/utilization.png].
    #[arg(long)]
    plot: Option<PathBuf>,
}

/// Why the demo failed; each says what to do.
#[derive(Debug, thiserror::Error)]
enum DemoError {
    #[error("/dev/kvm is not usable here ({0}); the demo runs its guests under KVM: run it on a Linux host with KVM enabled (and read/write access to /dev/kvm)")]
    NoKvm(std::io::Error),
    #[error("cannot build the payload guests: {0}")]
    Payload(String),
    #[error("{what}: {why}")]
    Start { what: String, why: String },
    #[error("vgpud: {0}")]
    Api(#[from] ClientError),
    #[error("cannot write the plot {path}: {why}")]
    Plot { path: PathBuf, why: String },
}

/// One sample of one vGPU.
#[derive(Clone, Copy, Debug)]
struct Sample {
    t: f64,
    compute: f64,
    copy: f64,
}

struct Tenant {
    name: &'static str,
    vgpu: Vgpu,
    vm: u32,
    samples: Vec<Sample>,
    bar: ProgressBar,
    round: u64,
}

/// vgpud as a child, stopped and cleaned up on drop.
struct DaemonProc {
    child: Option<Child>,
    dir: PathBuf,
}

impl DaemonProc {
    fn stop(&mut self) -> bool {
        let Some(mut c) = self.child.take() else {
            return true;
        };
        if let Ok(pid) = libc::pid_t::try_from(c.id()) {
            // SAFETY: kill(2) on our own child, not yet reaped.
            unsafe { libc::kill(pid, libc::SIGTERM) };
        }
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(10) {
            if let Ok(Some(_)) = c.try_wait() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = c.kill();
        let _ = c.wait();
        false
    }
}

impl Drop for DaemonProc {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A program beside this one (cargo puts a workspace's binaries in one directory; test
/// binaries one level down, in `deps/`).
fn sibling(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap_or_default();
    let mut dir = exe.parent().map(Path::to_path_buf).unwrap_or_default();
    if dir.ends_with("deps") {
        dir.pop();
    }
    dir.join(name)
}

/// Under `cargo run`, builds the daemon, worker and vmm beside this binary (cargo builds
/// only the binary it runs), so the demo never runs stale ones.
fn build_siblings() -> Result<(), DemoError> {
    let Some(cargo) = std::env::var_os("CARGO") else {
        return Ok(());
    };
    let release = sibling("vgpud")
        .parent()
        .is_some_and(|d| d.ends_with("release"));
    let mut cmd = Command::new(cargo);
    cmd.args(["build", "--quiet", "--bins"]);
    cmd.args(["-p", "vgpud", "-p", "vgpu-worker", "-p", "vmm"]);
    if release {
        cmd.arg("--release");
    }
    let status = cmd.status().map_err(|e| DemoError::Start {
        what: "cannot run cargo to build vgpud, vgpu-worker and vmm".into(),
        why: e.to_string(),
    })?;
    if !status.success() {
        return Err(DemoError::Start {
            what: "building vgpud, vgpu-worker and vmm failed".into(),
            why: format!("cargo {status}; see its output above"),
        });
    }
    Ok(())
}

fn start_daemon(dir: &Path) -> Result<(DaemonProc, Client), DemoError> {
    let socket = dir.join("vgpud.sock");
    let log = std::fs::File::create(dir.join("vgpud.log")).map_err(|e| DemoError::Start {
        what: "vgpud log".into(),
        why: e.to_string(),
    })?;
    let bin = sibling("vgpud");
    let child = Command::new(&bin)
        .arg("--socket")
        .arg(&socket)
        .args([
            "--sim-gpus",
            "2",
            "--sim-memory",
            "8G",
            "--sim-copy-bw",
            "12G",
        ])
        .args(["--stats-interval-ms", "200", "--stats-window-ms", "1000"])
        // The rebalancer runs; its window outlasts the demo's shared phase
        // (the demo migrates vGPU b itself at 5 s), so it only steps in if a GPU stays
        // overloaded after that: GET /v1/rebalancer/events says what it saw.
        .args(["--rebalance", "balance", "--rebalance-window-ms", "8000"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(log))
        .spawn()
        .map_err(|e| DemoError::Start {
            what: format!("cannot start {}", bin.display()),
            why: format!(
                "{e}; build it with `cargo build --release -p vgpud -p vgpu-worker -p vmm`"
            ),
        })?;
    let mut d = DaemonProc {
        child: Some(child),
        dir: dir.to_owned(),
    };
    let client = Client::new(Endpoint::Unix(socket), None);
    let start = Instant::now();
    while client.gpus().is_err() {
        let exited = d.child.as_mut().and_then(|c| c.try_wait().ok().flatten());
        if exited.is_some() || start.elapsed() > Duration::from_secs(15) {
            let log = std::fs::read_to_string(dir.join("vgpud.log")).unwrap_or_default();
            return Err(DemoError::Start {
                what: "vgpud did not come up".into(),
                why: log.lines().last().unwrap_or("no log").to_owned(),
            });
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok((d, client))
}

/// Live migration mid-run: moves the vGPU to `target_gpu` with pre-copy while its guest
/// keeps computing, and says how long the guest was paused.
fn migrate_mid_run(c: &Client, vgpu: u32, target_gpu: u32) -> String {
    let req = MigrateRequest {
        target_gpu: Some(target_gpu),
        mode: Some("precopy".into()),
        max_downtime_ms: Some(50),
    };
    let done = c
        .migrate_vgpu(vgpu, &req)
        .and_then(|m| c.wait_migration(m.id, Duration::from_secs(60), |_| {}));
    match done {
        Ok(m) if m.state == "completed" => format!(
            "vGPU {vgpu} live-migrated GPU {} -> GPU {} in {:.0} ms ({} rounds, {} MiB), guest paused {:.2} ms",
            m.source_gpu,
            m.target_gpu,
            m.elapsed_ms,
            m.rounds,
            m.bytes >> 20,
            m.downtime_ms.unwrap_or(0.0)
        ),
        Ok(m) => format!(
            "migration of vGPU {vgpu} failed, it stays on GPU {}: {}",
            m.source_gpu,
            m.error.unwrap_or_default()
        ),
        Err(e) => format!("migration request failed: {e}"),
    }
}

fn vm_state(s: &VmState) -> String {
    match s {
        VmState::Starting => "starting".into(),
        VmState::Running => "running".into(),
        VmState::Exited { code } => format!("exited ({code})"),
        VmState::Failed { reason } => format!("failed: {reason}"),
    }
}

/// The last `round r/R` the guest printed.
fn last_round(console: &str) -> Option<u64> {
    console
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix("gpu-load: round "))
        .and_then(|r| r.split('/').next())
        .and_then(|n| n.parse().ok())
}

fn run(args: Args) -> Result<(), DemoError> {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
        .map_err(DemoError::NoKvm)?;
    let t_all = Instant::now();
    println!("vgpu demo: two VMs share one simulated GPU through vGPUs with different shares\n");
    println!("building vgpud, vgpu-worker, vmm and the payload guests (once)...");
    build_siblings()?;
    for name in ["vgpud", "vgpu-worker", "vmm"] {
        if !sibling(name).is_file() {
            return Err(DemoError::Start {
                what: format!("{} is missing", sibling(name).display()),
                why: "build it with `cargo build --release -p vgpud -p vgpu-worker -p vmm`".into(),
            });
        }
    }
    let payload =
        payload_build::payload("gpu-load").map_err(|e| DemoError::Payload(e.to_string()))?;

    let dir = std::env::temp_dir().join(format!("vgpu-demo-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| DemoError::Start {
        what: format!("cannot create {}", dir.display()),
        why: e.to_string(),
    })?;
    let (mut daemon, c) = start_daemon(&dir)?;
    println!("vgpud running (sim backend) on {}", c.endpoint());
    for g in c.gpus()? {
        println!(
            "  GPU {}: {} {} memory, {:.0} GB/s copy",
            g.index,
            g.name,
            human_bytes(g.memory_bytes),
            g.copy_bandwidth as f64 / 1e9
        );
    }

    let mut tenants = Vec::new();
    for (name, share, mem, prio) in [("A", 0.7, 2u64 << 30, 1), ("B", 0.3, 1u64 << 30, 0)] {
        let v = c.create_vgpu(&VgpuCreate {
            gpu: Some(0),
            memory_bytes: mem,
            compute_share: share,
            copy_share: Some(share),
            priority: prio,
            oversubscribe: false,
            share_group: None,
            queues: 1,
            storage: Vec::new(),
            name: None,
            labels: Default::default(),
            kernel_deadline_ms: None,
            attach: Default::default(),
            owner_uid: None,
            owner_gid: None,
        })?;
        println!(
            "created vGPU {} ({name}) on GPU 0: {} memory, compute/copy share {:.0}%",
            v.id,
            human_bytes(v.memory_bytes),
            share * 100.0
        );
        tenants.push((name, v));
    }
    let mut live = Vec::new();
    let multi = MultiProgress::new();
    let tty = std::io::IsTerminal::is_terminal(&std::io::stderr());
    if !tty {
        multi.set_draw_target(ProgressDrawTarget::hidden());
    }
    let style = ProgressStyle::with_template("{prefix:>22} [{bar:40.cyan/blue}] {pos:>3}% {msg}")
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("#>-");
    for (name, v) in tenants {
        let vm = c.create_vm(&VmCreate {
            payload: Some(payload.display().to_string()),
            payload_arg: format!("rounds={} spin_us={} check=50", args.rounds, args.spin_us),
            kernel: None,
            initrd: None,
            cmdline: None,
            memory_bytes: 128 << 20,
            vcpus: 1,
            vgpu_id: Some(v.id),
            vgpu: None,
            name: None,
            labels: Default::default(),
        })?;
        println!(
            "launched VM {} on vGPU {} ({name}): gpu-load, {} rounds",
            vm.id, v.id, args.rounds
        );
        let bar = multi.add(ProgressBar::new(100));
        bar.set_style(style.clone());
        bar.set_prefix(format!(
            "vGPU {} ({name}, {:.0}%)",
            v.id,
            v.compute_share * 100.0
        ));
        live.push(Tenant {
            name,
            vgpu: v,
            vm: vm.id,
            samples: Vec::new(),
            bar,
            round: 0,
        });
    }
    println!("\nlive compute utilization per vGPU (kernel time / wall time over the last second):");

    let t0 = Instant::now();
    let mut migrated = None;
    let mut last_print = Instant::now();
    loop {
        let t = t0.elapsed().as_secs_f64();
        let mut running = 0;
        for tn in &mut live {
            let s = c.vgpu_stats(tn.vgpu.id)?;
            let vm = c.vm(tn.vm)?;
            if vm.state.is_live() {
                running += 1;
            }
            let console = String::from_utf8_lossy(&c.console(tn.vm, 0)?).into_owned();
            tn.round = last_round(&console).unwrap_or(tn.round);
            if s.live && s.window_ms > 0 {
                tn.samples.push(Sample {
                    t,
                    compute: s.compute_utilization,
                    copy: s.copy_utilization.unwrap_or(0.0),
                });
            }
            let pct = (s.compute_utilization * 100.0).round().clamp(0.0, 100.0) as u64;
            tn.bar.set_position(pct);
            tn.bar.set_message(format!(
                "copy {:>5.1}%  mem {:>9}  kernels {:>5}  round {}/{}  {}",
                s.copy_utilization.unwrap_or(0.0) * 100.0,
                human_bytes(s.memory_used_bytes),
                s.kernels,
                tn.round,
                args.rounds,
                vm_state(&vm.state)
            ));
            if !tty && last_print.elapsed() >= Duration::from_secs(2) {
                println!(
                    "  t={t:>5.1}s vGPU {} ({}): compute {:>5.1}%  copy {:>5.1}%  round {}/{}",
                    tn.vgpu.id,
                    tn.name,
                    s.compute_utilization * 100.0,
                    s.copy_utilization.unwrap_or(0.0) * 100.0,
                    tn.round,
                    args.rounds
                );
            }
        }
        if !tty && last_print.elapsed() >= Duration::from_secs(2) {
            last_print = Instant::now();
        }
        if migrated.is_none() && t > 5.0 {
            if let Some(b) = live.get(1) {
                let msg = migrate_mid_run(&c, b.vgpu.id, 1);
                multi.suspend(|| println!("  {msg}"));
                migrated = Some(msg);
            }
        }
        if running == 0 {
            break;
        }
        if t > args.max_seconds as f64 {
            multi.suspend(|| println!("  stopping the VMs after {} s", args.max_seconds));
            break;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    for tn in &live {
        tn.bar.abandon();
    }

    // Summary.
    println!("\nsummary:");
    println!(
        "{:<6} {:<4} {:<4} {:>6} {:>9} {:>9} {:>8} {:>9} {:>7}  VM result",
        "vGPU", "VM", "GPU", "share", "mean util", "peak util", "kernels", "HtoD", "errors"
    );
    let mut all_ok = true;
    for tn in &live {
        let s = c.vgpu_stats(tn.vgpu.id)?;
        let vm = c.vm(tn.vm)?;
        let console = String::from_utf8_lossy(&c.console(tn.vm, 0)?).into_owned();
        let verdict = console
            .lines()
            .find(|l| l.starts_with("GPU-LOAD OK"))
            .map(str::to_owned)
            .unwrap_or_else(|| vm_state(&vm.state));
        all_ok &= matches!(vm.state, VmState::Exited { code: 0 });
        let busy: Vec<f64> = tn.samples.iter().map(|s| s.compute).collect();
        let mean = if busy.is_empty() {
            0.0
        } else {
            busy.iter().sum::<f64>() / busy.len() as f64
        };
        let peak = busy.iter().copied().fold(0.0, f64::max);
        println!(
            "{:<6} {:<4} {:<4} {:>5.0}% {:>8.1}% {:>8.1}% {:>8} {:>9} {:>7}  {}",
            format!("{} ({})", tn.vgpu.id, tn.name),
            tn.vm,
            tn.vgpu.gpu,
            tn.vgpu.compute_share * 100.0,
            mean * 100.0,
            peak * 100.0,
            s.kernels,
            human_bytes(s.bytes_htod),
            s.errors,
            verdict
        );
    }
    println!(
        "\nboth vGPUs' copies and kernels pass vgpud's BAND scheduler on GPU 0: while the two VMs\n\
         compete, the 30% vGPU is held near its share and the 70% vGPU gets the rest it asks for;\n\
         alone, a vGPU may use the whole GPU (see the plot)."
    );
    if let Some(m) = &migrated {
        println!("{m}");
    }

    // Beside the build: target/vgpu-demo/ (this binary runs from target/<profile>/).
    let plot = args.plot.clone().unwrap_or_else(|| {
        sibling("vgpud")
            .parent()
            .and_then(Path::parent)
            .map_or_else(|| PathBuf::from("."), Path::to_path_buf)
            .join("vgpu-demo")
            .join("utilization.png")
    });
    draw_plot(&plot, &live)?;
    println!("plot of utilization over time: {}", plot.display());

    // Clean up: VMs, vGPUs, the daemon, its directory.
    let pids: Vec<u32> = c
        .vgpus()?
        .iter()
        .filter_map(|v| v.worker_pid)
        .chain(c.vms()?.iter().filter_map(|v| v.pid))
        .collect();
    for tn in &live {
        c.delete_vm(tn.vm)?;
        c.delete_vgpu(tn.vgpu.id)?;
    }
    let clean = daemon.stop();
    let left: Vec<u32> = pids
        .into_iter()
        .filter(|p| Path::new(&format!("/proc/{p}")).exists())
        .collect();
    drop(daemon);
    println!(
        "cleaned up: vgpud {}, {} left-over processes, state directory {}",
        if clean { "stopped" } else { "killed" },
        left.len(),
        if dir.exists() {
            "NOT removed"
        } else {
            "removed"
        }
    );
    println!("done in {:.1} s", t_all.elapsed().as_secs_f64());
    if !all_ok {
        return Err(DemoError::Start {
            what: "a VM did not finish cleanly".into(),
            why: "see the summary above".into(),
        });
    }
    Ok(())
}

/// The demo's plot: per vGPU, compute (thick), copy (thin) and its share (dashed).
fn draw_plot(path: &Path, tenants: &[Tenant]) -> Result<(), DemoError> {
    let mut lines = Vec::new();
    for (i, tn) in tenants.iter().enumerate() {
        lines.push(vgpuctl::plot::Line {
            label: Some(format!(
                "vGPU {} ({}), share {:.0}%",
                tn.vgpu.id,
                tn.name,
                tn.vgpu.compute_share * 100.0
            )),
            points: tn.samples.iter().map(|s| (s.t, s.compute)).collect(),
            color: i,
            style: vgpuctl::plot::Style::Thick,
        });
        lines.push(vgpuctl::plot::Line {
            label: None,
            points: tn.samples.iter().map(|s| (s.t, s.copy)).collect(),
            color: i,
            style: vgpuctl::plot::Style::Thin,
        });
        lines.push(vgpuctl::plot::Line::level(tn.vgpu.compute_share, i));
    }
    vgpuctl::plot::utilization_png(
        path,
        "vGPU compute utilization over time (sim GPU 0)",
        "thick: compute, thin: copy, dashed: the vGPU's share",
        &lines,
    )
    .map_err(|why| DemoError::Plot {
        path: path.to_owned(),
        why,
    })
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("vgpu-demo: error: {e}");
            ExitCode::FAILURE
        }
    }
}
