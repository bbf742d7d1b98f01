//! `vgpuctl`: the operator CLI for vgpud. Every REST endpoint is a subcommand; tables for
//! people, `--json` for scripts. See `vgpuctl --help` and docs/api.md.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::{Args, Parser, Subcommand};
use serde::Serialize;
use vgpud::api::{
    MigrateRequest, Vgpu, VgpuCreate, VgpuPatch, VgpuState, VgpuStats, Vm, VmCreate, VmState,
};
use vgpud::client::{Client, ClientError, Endpoint};
use vgpud::units::{human_bytes, parse_share_fraction, parse_size};

/// Operate vgpud: GPUs, vGPUs, VMs, stats.
#[derive(Parser, Debug)]
#[command(name = "vgpuctl", version)]
struct Cli {
    /// vgpud's unix socket [default: $XDG_RUNTIME_DIR/vgpud/vgpud.sock or /tmp/vgpud-$UID/vgpud.sock].
    #[arg(long, global = true, env = "VGPUD_SOCKET", conflicts_with = "url")]
    socket: Option<PathBuf>,
    /// vgpud over TCP, e.g. http://127.0.0.1:7070 (needs --token-file).
    #[arg(long, global = true, env = "VGPUD_URL")]
    url: Option<String>,
    /// File holding the bearer token.
    #[arg(long, global = true, env = "VGPUD_TOKEN_FILE")]
    token_file: Option<PathBuf>,
    /// Print JSON (the API's answers) instead of tables.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// List the physical GPUs and what is committed on them.
    Gpus,
    /// vGPUs.
    #[command(subcommand)]
    Vgpu(VgpuCmd),
    /// VMs.
    #[command(subcommand)]
    Vm(VmCmd),
    /// Live per-vGPU utilization and memory (refreshing; q or Ctrl-C to stop).
    Top {
        /// Refresh period, ms.
        #[arg(long, default_value_t = 1000)]
        interval_ms: u64,
        /// Stop after this many refreshes (0 = until Ctrl-C).
        #[arg(long, default_value_t = 0)]
        count: u64,
    },
    /// Print the Prometheus metrics.
    Metrics,
}

#[derive(Args, Debug, Clone)]
struct VgpuSpecArgs {
    /// Physical GPU index [default: the least loaded that fits].
    #[arg(long)]
    gpu: Option<u32>,
    /// Device memory share, e.g. 1G or 512M.
    #[arg(long, value_parser = parse_size)]
    memory: u64,
    /// Compute share: a fraction (0.3) or percentage (30%).
    #[arg(long, value_parser = parse_share_fraction)]
    compute: f64,
    /// Copy-bandwidth share [default: the compute share].
    #[arg(long, value_parser = parse_share_fraction)]
    copy: Option<f64>,
    /// Priority (larger = more important).
    #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
    priority: i32,
    /// Request queues.
    #[arg(long, default_value_t = 1)]
    queues: u16,
    /// Share group (for shared device memory).
    #[arg(long)]
    share_group: Option<String>,
    /// Allow memory oversubscription (answers 501 until issue 6).
    #[arg(long)]
    oversubscribe: bool,
    /// Attach a storage namespace, `ID=PATH[:ro|:rw]` (read-only unless `:rw`); repeat
    /// for more.
    #[arg(long, value_parser = parse_storage)]
    storage: Vec<vgpud::api::StorageAttachment>,
}

fn parse_storage(s: &str) -> Result<vgpud::api::StorageAttachment, String> {
    let n = vgpu_backend::storage::NamespaceSpec::parse(s)?;
    Ok(vgpud::api::StorageAttachment {
        namespace: n.id,
        path: n.path.display().to_string(),
        read_only: n.read_only,
    })
}

impl VgpuSpecArgs {
    fn spec(&self) -> VgpuCreate {
        VgpuCreate {
            gpu: self.gpu,
            memory_bytes: self.memory,
            compute_share: self.compute,
            copy_share: self.copy,
            priority: self.priority,
            oversubscribe: self.oversubscribe,
            share_group: self.share_group.clone(),
            queues: self.queues,
            storage: self.storage.clone(),
        }
    }
}

#[derive(Args, Debug, Clone)]
struct MigrateArgs {
    /// Target GPU.
    #[arg(long)]
    target_gpu: Option<u32>,
    /// stop_copy or precopy.
    #[arg(long)]
    mode: Option<String>,
    /// Longest acceptable pause, ms.
    #[arg(long)]
    max_downtime_ms: Option<u64>,
    /// Return at once instead of following the migration with a progress bar.
    #[arg(long)]
    no_wait: bool,
}

impl MigrateArgs {
    fn req(&self) -> MigrateRequest {
        MigrateRequest {
            target_gpu: self.target_gpu,
            mode: self.mode.clone(),
            max_downtime_ms: self.max_downtime_ms,
        }
    }
}

#[derive(Subcommand, Debug)]
enum VgpuCmd {
    /// List vGPUs.
    List,
    /// Show one vGPU.
    Show { id: u32 },
    /// Create a vGPU (starts its worker).
    Create(VgpuSpecArgs),
    /// Change shares or priority at run time.
    Set {
        id: u32,
        #[arg(long, value_parser = parse_share_fraction)]
        compute: Option<f64>,
        #[arg(long, value_parser = parse_share_fraction)]
        copy: Option<f64>,
        #[arg(long, allow_negative_numbers = true)]
        priority: Option<i32>,
    },
    /// Delete a vGPU.
    Delete { id: u32 },
    /// Utilization, memory and counters.
    Stats { id: u32 },
    /// Live-migrate to another GPU (the VM keeps running; it sees a pause).
    Migrate {
        id: u32,
        #[command(flatten)]
        args: MigrateArgs,
    },
}

#[derive(Subcommand, Debug)]
enum VmCmd {
    /// List VMs.
    List,
    /// Show one VM.
    Show { id: u32 },
    /// Launch a VM with an existing vGPU (--vgpu ID) or a new one (--memory/--compute ...).
    Launch {
        /// Payload ELF (absolute path) or a payload name in vgpud's --payload-dir.
        #[arg(long)]
        payload: String,
        /// Argument string for the payload.
        #[arg(long = "arg", default_value = "")]
        payload_arg: String,
        /// Guest RAM.
        #[arg(long, default_value = "256M", value_parser = parse_size)]
        ram: u64,
        /// vCPUs.
        #[arg(long, default_value_t = 1)]
        vcpus: u8,
        /// Use this existing vGPU.
        #[arg(long, conflicts_with_all = ["memory", "compute"])]
        vgpu: Option<u32>,
        /// Physical GPU of the new vGPU.
        #[arg(long)]
        gpu: Option<u32>,
        /// Memory share of the new vGPU.
        #[arg(long, value_parser = parse_size)]
        memory: Option<u64>,
        /// Compute share of the new vGPU.
        #[arg(long, value_parser = parse_share_fraction)]
        compute: Option<f64>,
        /// Copy share of the new vGPU.
        #[arg(long, value_parser = parse_share_fraction)]
        copy: Option<f64>,
        /// Priority of the new vGPU.
        #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
        priority: i32,
        /// Queues of the new vGPU.
        #[arg(long, default_value_t = 1)]
        queues: u16,
        /// Wait until the VM ends; exit with its exit code.
        #[arg(long)]
        wait: bool,
    },
    /// Stop and remove a VM.
    Delete { id: u32 },
    /// Print the VM's console.
    Console {
        id: u32,
        /// Keep printing until the VM ends.
        #[arg(long, short)]
        follow: bool,
    },
    /// Wait until a VM ends; exit with its exit code.
    Wait {
        id: u32,
        /// Give up after this many seconds.
        #[arg(long, default_value_t = 3600)]
        timeout_s: u64,
    },
    /// Live-migrate a VM's vGPU to another GPU.
    Migrate {
        id: u32,
        #[command(flatten)]
        args: MigrateArgs,
    },
}

fn client(cli: &Cli) -> Result<Client, ClientError> {
    let token = match &cli.token_file {
        Some(p) => Some(
            std::fs::read_to_string(p)
                .map_err(|e| {
                    ClientError::Usage(format!("cannot read the token file {}: {e}", p.display()))
                })?
                .trim()
                .to_owned(),
        ),
        None => None,
    };
    let endpoint = match (&cli.url, &cli.socket) {
        (Some(u), _) => Endpoint::from_url(u)?,
        (None, Some(s)) => Endpoint::Unix(s.clone()),
        (None, None) => Endpoint::Unix(vgpud::daemon::default_socket()),
    };
    Ok(Client::new(endpoint, token))
}

/// A plain text table.
fn table(headers: &[&str], rows: Vec<Vec<String>>) -> String {
    let mut w: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for r in &rows {
        for (i, c) in r.iter().enumerate() {
            if let Some(x) = w.get_mut(i) {
                *x = (*x).max(c.chars().count());
            }
        }
    }
    let line = |cells: Vec<String>| {
        cells
            .iter()
            .enumerate()
            .map(|(i, c)| format!("{c:<width$}", width = w.get(i).copied().unwrap_or(0)))
            .collect::<Vec<_>>()
            .join("  ")
            .trim_end()
            .to_owned()
    };
    let mut out = line(headers.iter().map(|h| h.to_string()).collect());
    out.push('\n');
    for r in rows {
        out.push_str(&line(r));
        out.push('\n');
    }
    out
}

fn pct(f: f64) -> String {
    format!("{:.1}%", f * 100.0)
}

fn vgpu_state(s: &VgpuState) -> String {
    match s {
        VgpuState::Starting => "starting".into(),
        VgpuState::Ready => "ready".into(),
        VgpuState::Attached => "attached".into(),
        VgpuState::Released => "released".into(),
        VgpuState::Failed { reason } => format!("failed: {reason}"),
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

fn vgpu_rows(v: &[Vgpu]) -> String {
    table(
        &[
            "ID", "GPU", "MEMORY", "COMPUTE", "COPY", "PRIO", "QUEUES", "VM", "STATE",
        ],
        v.iter()
            .map(|v| {
                vec![
                    v.id.to_string(),
                    v.gpu.to_string(),
                    human_bytes(v.memory_bytes),
                    pct(v.compute_share),
                    pct(v.copy_share),
                    v.priority.to_string(),
                    v.queues.to_string(),
                    v.vm.map_or("-".into(), |x| x.to_string()),
                    vgpu_state(&v.state),
                ]
            })
            .collect(),
    )
}

fn vm_rows(v: &[Vm]) -> String {
    table(
        &["ID", "VGPU", "VCPUS", "RAM", "UPTIME", "PAYLOAD", "STATE"],
        v.iter()
            .map(|v| {
                vec![
                    v.id.to_string(),
                    v.vgpu.map_or("-".into(), |x| x.to_string()),
                    v.vcpus.to_string(),
                    human_bytes(v.memory_bytes),
                    format!("{:.1}s", v.uptime_ms as f64 / 1000.0),
                    std::path::Path::new(&v.payload)
                        .file_name()
                        .map_or(v.payload.clone(), |f| f.to_string_lossy().into_owned()),
                    vm_state(&v.state),
                ]
            })
            .collect(),
    )
}

fn stats_rows(s: &[VgpuStats]) -> String {
    table(
        &[
            "VGPU",
            "GPU",
            "COMPUTE",
            "SHARE",
            "COPY",
            "MEM USED",
            "MEM SHARE",
            "KERNELS",
            "REQUESTS",
            "ERRORS",
        ],
        s.iter()
            .map(|s| {
                vec![
                    s.vgpu.to_string(),
                    s.gpu.to_string(),
                    pct(s.compute_utilization),
                    pct(s.compute_share),
                    s.copy_utilization.map_or("-".into(), pct),
                    human_bytes(s.memory_used_bytes),
                    human_bytes(s.memory_share_bytes),
                    s.kernels.to_string(),
                    s.requests.to_string(),
                    s.errors.to_string(),
                ]
            })
            .collect(),
    )
}

/// Follows a migration with a progress bar until it ends; exit 0 when it completed.
fn follow_migration(
    c: &Client,
    json: bool,
    m: vgpud::api::Migration,
    no_wait: bool,
) -> Result<ExitCode, ClientError> {
    if no_wait {
        emit(json, &m, migration_line);
        return Ok(ExitCode::SUCCESS);
    }
    let bar = if json || !std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        indicatif::ProgressBar::hidden()
    } else {
        indicatif::ProgressBar::new(1)
    };
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{spinner} vGPU {prefix} {msg:24} [{bar:30}] {bytes}/{total_bytes}",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    bar.set_prefix(format!(
        "{}: GPU {} -> {}",
        m.vgpu, m.source_gpu, m.target_gpu
    ));
    let done = c.wait_migration(m.id, Duration::from_secs(600), |m| {
        bar.set_length(m.total_bytes.max(1));
        bar.set_position(m.bytes.min(m.total_bytes));
        bar.set_message(format!("{} (round {})", m.phase, m.rounds));
    })?;
    bar.finish_and_clear();
    emit(json, &done, migration_line);
    Ok(if done.state == "completed" {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn migration_line(m: &vgpud::api::Migration) -> String {
    match m.state.as_str() {
        "completed" => format!(
            "migration {}: vGPU {} moved from GPU {} to GPU {} in {:.1} ms ({}, {} rounds, {} copied of {}), downtime {:.2} ms\n",
            m.id,
            m.vgpu,
            m.source_gpu,
            m.target_gpu,
            m.elapsed_ms,
            m.mode,
            m.rounds,
            human_bytes(m.bytes),
            human_bytes(m.total_bytes),
            m.downtime_ms.unwrap_or(0.0)
        ),
        "failed" => format!(
            "migration {}: vGPU {} stays on GPU {}: {}\n",
            m.id,
            m.vgpu,
            m.source_gpu,
            m.error.as_deref().unwrap_or("failed")
        ),
        _ => format!(
            "migration {}: vGPU {} GPU {} -> {}: {} ({} of {})\n",
            m.id,
            m.vgpu,
            m.source_gpu,
            m.target_gpu,
            m.phase,
            human_bytes(m.bytes),
            human_bytes(m.total_bytes)
        ),
    }
}

fn emit<T: Serialize>(json: bool, v: &T, human: impl FnOnce(&T) -> String) {
    if json {
        println!("{}", serde_json::to_string_pretty(v).unwrap_or_default());
    } else {
        print!("{}", human(v));
    }
}

/// Exit code of a finished VM for `--wait`.
fn vm_exit(vm: &Vm) -> ExitCode {
    match vm.state {
        VmState::Exited { code } => ExitCode::from(u8::try_from(code.clamp(0, 255)).unwrap_or(1)),
        VmState::Failed { .. } => ExitCode::from(125),
        _ => ExitCode::from(124),
    }
}

fn top(c: &Client, interval: Duration, count: u64) -> Result<(), ClientError> {
    let tty = std::io::IsTerminal::is_terminal(&std::io::stdout());
    let mut n = 0;
    loop {
        let start = Instant::now();
        let vgpus = c.vgpus()?;
        let gpus = c.gpus()?;
        let mut stats = Vec::new();
        for v in vgpus.iter().filter(|v| v.worker_pid.is_some()) {
            match c.vgpu_stats(v.id) {
                Ok(s) => stats.push(s),
                Err(ClientError::Api { status: 404, .. }) => {}
                Err(e) => return Err(e),
            }
        }
        let mut out = String::new();
        if tty {
            out.push_str("\x1b[H\x1b[2J");
        }
        out.push_str(&format!(
            "vgpuctl top — {}  ({} GPUs, {} live vGPUs; every {} ms)\n\n",
            c.endpoint(),
            gpus.len(),
            stats.len(),
            interval.as_millis()
        ));
        for g in &gpus {
            out.push_str(&format!(
                "GPU {} {}: memory {} / {} committed, compute {} copy {} committed\n",
                g.index,
                g.name,
                human_bytes(g.memory_committed_bytes),
                human_bytes(g.memory_bytes),
                pct(g.compute_committed),
                pct(g.copy_committed)
            ));
        }
        out.push('\n');
        out.push_str(&table(
            &[
                "VGPU", "GPU", "UTIL", "", "SHARE", "COPY", "MEM USED", "KERNELS",
            ],
            stats
                .iter()
                .map(|s| {
                    let filled = ((s.compute_utilization.clamp(0.0, 1.0)) * 20.0).round() as usize;
                    vec![
                        s.vgpu.to_string(),
                        s.gpu.to_string(),
                        pct(s.compute_utilization),
                        format!("[{}{}]", "#".repeat(filled), ".".repeat(20 - filled)),
                        pct(s.compute_share),
                        s.copy_utilization.map_or("-".into(), pct),
                        human_bytes(s.memory_used_bytes),
                        s.kernels.to_string(),
                    ]
                })
                .collect(),
        ));
        print!("{out}");
        let _ = std::io::stdout().flush();
        n += 1;
        if count != 0 && n >= count {
            return Ok(());
        }
        std::thread::sleep(interval.saturating_sub(start.elapsed()));
    }
}

fn run(cli: Cli) -> Result<ExitCode, ClientError> {
    let c = client(&cli)?;
    let json = cli.json;
    match cli.cmd {
        Cmd::Gpus => {
            let gpus = c.gpus()?;
            emit(json, &gpus, |g| {
                table(
                    &[
                        "GPU",
                        "NAME",
                        "BACKEND",
                        "MEMORY",
                        "COMMITTED",
                        "FREE",
                        "COMPUTE",
                        "COPY",
                        "COPY BW",
                        "VGPUS",
                    ],
                    g.iter()
                        .map(|g| {
                            vec![
                                g.index.to_string(),
                                g.name.clone(),
                                g.backend.clone(),
                                human_bytes(g.memory_bytes),
                                human_bytes(g.memory_committed_bytes),
                                human_bytes(g.memory_free_bytes),
                                pct(g.compute_committed),
                                pct(g.copy_committed),
                                if g.copy_bandwidth == 0 {
                                    "unpaced".into()
                                } else {
                                    format!("{:.1} GB/s", g.copy_bandwidth as f64 / 1e9)
                                },
                                g.vgpus
                                    .iter()
                                    .map(u32::to_string)
                                    .collect::<Vec<_>>()
                                    .join(","),
                            ]
                        })
                        .collect(),
                )
            });
        }
        Cmd::Vgpu(cmd) => match cmd {
            VgpuCmd::List => emit(json, &c.vgpus()?, |v| vgpu_rows(v)),
            VgpuCmd::Show { id } => {
                emit(json, &c.vgpu(id)?, |v| vgpu_rows(std::slice::from_ref(v)))
            }
            VgpuCmd::Create(a) => emit(json, &c.create_vgpu(&a.spec())?, |v| {
                vgpu_rows(std::slice::from_ref(v))
            }),
            VgpuCmd::Set {
                id,
                compute,
                copy,
                priority,
            } => {
                if compute.is_none() && copy.is_none() && priority.is_none() {
                    return Err(ClientError::Usage(
                        "nothing to change: give --compute, --copy or --priority".into(),
                    ));
                }
                let patch = VgpuPatch {
                    compute_share: compute,
                    copy_share: copy,
                    priority,
                };
                emit(json, &c.patch_vgpu(id, &patch)?, |v| {
                    vgpu_rows(std::slice::from_ref(v))
                });
            }
            VgpuCmd::Delete { id } => {
                c.delete_vgpu(id)?;
                if !json {
                    println!("vGPU {id} deleted");
                }
            }
            VgpuCmd::Stats { id } => emit(json, &c.vgpu_stats(id)?, |s| {
                stats_rows(std::slice::from_ref(s))
            }),
            VgpuCmd::Migrate { id, args } => {
                let m = c.migrate_vgpu(id, &args.req())?;
                return follow_migration(&c, json, m, args.no_wait);
            }
        },
        Cmd::Vm(cmd) => match cmd {
            VmCmd::List => emit(json, &c.vms()?, |v| vm_rows(v)),
            VmCmd::Show { id } => emit(json, &c.vm(id)?, |v| vm_rows(std::slice::from_ref(v))),
            VmCmd::Launch {
                payload,
                payload_arg,
                ram,
                vcpus,
                vgpu,
                gpu,
                memory,
                compute,
                copy,
                priority,
                queues,
                wait,
            } => {
                let spec = match (memory, compute) {
                    (Some(memory), Some(compute)) => Some(VgpuCreate {
                        gpu,
                        memory_bytes: memory,
                        compute_share: compute,
                        copy_share: copy,
                        priority,
                        oversubscribe: false,
                        share_group: None,
                        queues,
                        storage: Vec::new(),
                    }),
                    (None, None) => None,
                    _ => {
                        return Err(ClientError::Usage(
                            "a new vGPU needs both --memory and --compute (or use --vgpu ID)"
                                .into(),
                        ))
                    }
                };
                let payload = match std::path::Path::new(&payload) {
                    p if p.is_relative() && payload.contains('/') => std::env::current_dir()
                        .map(|d| d.join(p).display().to_string())
                        .unwrap_or(payload),
                    _ => payload,
                };
                let vm = c.create_vm(&VmCreate {
                    payload: Some(payload),
                    payload_arg,
                    kernel: None,
                    initrd: None,
                    cmdline: None,
                    memory_bytes: ram,
                    vcpus,
                    vgpu_id: vgpu,
                    vgpu: spec,
                })?;
                if wait {
                    let vm = c.wait_vm(vm.id, Duration::from_secs(u64::MAX / 4))?;
                    emit(json, &vm, |v| vm_rows(std::slice::from_ref(v)));
                    return Ok(vm_exit(&vm));
                }
                emit(json, &vm, |v| vm_rows(std::slice::from_ref(v)));
            }
            VmCmd::Delete { id } => {
                c.delete_vm(id)?;
                if !json {
                    println!("VM {id} deleted");
                }
            }
            VmCmd::Console { id, follow } => {
                let mut offset = 0u64;
                let mut out = std::io::stdout();
                loop {
                    let data = c.console(id, offset)?;
                    offset += data.len() as u64;
                    let _ = out.write_all(&data);
                    let _ = out.flush();
                    if !follow || !c.vm(id)?.state.is_live() {
                        if follow {
                            let data = c.console(id, offset)?;
                            let _ = out.write_all(&data);
                        }
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(200));
                }
            }
            VmCmd::Wait { id, timeout_s } => {
                let vm = c.wait_vm(id, Duration::from_secs(timeout_s))?;
                emit(json, &vm, |v| vm_rows(std::slice::from_ref(v)));
                return Ok(vm_exit(&vm));
            }
            VmCmd::Migrate { id, args } => {
                let m = c.migrate_vm(id, &args.req())?;
                return follow_migration(&c, json, m, args.no_wait);
            }
        },
        Cmd::Top { interval_ms, count } => {
            top(&c, Duration::from_millis(interval_ms.max(100)), count)?
        }
        Cmd::Metrics => print!("{}", c.metrics()?),
    }
    Ok(ExitCode::SUCCESS)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let json = cli.json;
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            if json {
                if let Some(b) = e.body() {
                    eprintln!("{}", serde_json::to_string(b).unwrap_or_default());
                }
            }
            eprintln!("vgpuctl: {e}");
            ExitCode::from(if matches!(e, ClientError::NotRunning { .. }) {
                3
            } else {
                1
            })
        }
    }
}
