//! `vgpuctl vm ...`: launch, list, watch, wait for, delete and migrate VMs.

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use clap::Subcommand;
use vgpu_api::api::{StorageAttachment, VgpuCreate, Vm, VmCreate, VmState};
use vgpu_api::client::{Client, ClientError};
use vgpu_api::units::{parse_share_fraction, parse_size};

use crate::errors::{code, Context, Failure};
use crate::migrate::{follow_migration, MigrateArgs};
use crate::output::{emit, stats_rows, vm_rows};

#[derive(Subcommand, Debug)]
pub enum VmCmd {
    /// List VMs.
    List,
    /// Show one VM.
    Show {
        /// The VM's id or name.
        id: String,
    },
    /// Launch a VM with an existing vGPU (--vgpu ID) or a new one (--memory/--compute ...).
    Launch {
        /// Payload ELF: a name in vgpud's --payload-dir (`vgpuctl payload list`) or a path.
        #[arg(long)]
        payload: String,
        /// Argument string for the payload, e.g. "rounds=10 n=4096" (`vgpuctl payload show NAME`).
        #[arg(long = "arg", default_value = "")]
        payload_arg: String,
        /// Guest RAM.
        #[arg(long, default_value = "256M", value_parser = parse_size)]
        ram: u64,
        /// vCPUs.
        #[arg(long, default_value_t = 1)]
        vcpus: u8,
        /// Use this existing vGPU (its id or name).
        #[arg(long, conflicts_with_all = ["memory", "compute", "copy", "gpu", "share_group", "oversubscribe", "storage", "kernel_deadline_ms"])]
        vgpu: Option<String>,
        /// Physical GPU of the new vGPU.
        #[arg(long)]
        gpu: Option<u32>,
        /// Memory share of the new vGPU.
        #[arg(long, value_parser = parse_size)]
        memory: Option<u64>,
        /// Compute share of the new vGPU.
        #[arg(long, value_parser = parse_share_fraction)]
        compute: Option<f64>,
        /// Copy-bandwidth share of the new vGPU [default: the compute share].
        #[arg(long, value_parser = parse_share_fraction)]
        copy: Option<f64>,
        /// Priority of the new vGPU.
        #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
        priority: i32,
        /// Queues of the new vGPU.
        #[arg(long, default_value_t = 1)]
        queues: u16,
        /// Share group of the new vGPU (for shared device memory).
        #[arg(long)]
        share_group: Option<String>,
        /// Let the new vGPU oversubscribe memory (swapped out when the GPU runs short).
        #[arg(long)]
        oversubscribe: bool,
        /// Attach a storage namespace to the new vGPU, `ID=PATH[:ro|:rw]`; repeat for more.
        #[arg(long, value_parser = StorageAttachment::parse)]
        storage: Vec<StorageAttachment>,
        /// Kernel deadline of the new vGPU, ms (10 to 60000) [default: vgpud's].
        #[arg(long, value_parser = clap::value_parser!(u32).range(10..=60_000))]
        kernel_deadline_ms: Option<u32>,
        /// The VM's name (a DNS label, unique among live VMs).
        #[arg(long)]
        name: Option<String>,
        /// A label of the VM, `KEY=VALUE`; repeat for more.
        #[arg(long = "label", value_parser = crate::vgpu::parse_label)]
        labels: Vec<(String, String)>,
        /// Wait until the VM ends; exit with its exit code.
        #[arg(long)]
        wait: bool,
    },
    /// Utilization and memory of a VM's vGPU (as `vgpu stats`).
    Stats {
        /// The VM's id or name.
        id: String,
    },
    /// Stop and remove a VM.
    Delete {
        /// The VM's id or name.
        id: String,
    },
    /// Print the VM's console.
    Console {
        /// The VM's id or name.
        id: String,
        /// Keep printing until the VM ends.
        #[arg(long, short)]
        follow: bool,
    },
    /// Wait until a VM ends; exit with its exit code (123: its vmm was gone when vgpud restarted,
    /// 124: still running at the timeout, 125: failed).
    Wait {
        /// The VM's id or name.
        id: String,
        /// Give up after this many seconds.
        #[arg(long, default_value_t = 3600)]
        timeout_s: u64,
    },
    /// Live-migrate a VM's vGPU to another GPU, or with --to the whole VM, vGPU included,
    /// to another vgpud (on this host: unix:/path/of/its/socket; on another:
    /// http://HOST:PORT with --to-token-file).
    Migrate {
        /// The VM's id or name.
        id: String,
        /// Move the whole VM to the vgpud at unix:PATH or http://HOST:PORT.
        #[arg(long, conflicts_with_all = ["target_gpu"])]
        to: Option<String>,
        /// The destination vgpud's bearer token (a file holding it), for http://
        /// (`--token-file` is this vgpud's own).
        #[arg(long, requires = "to")]
        to_token_file: Option<std::path::PathBuf>,
        /// With --to: the pause the move aims for, ms [default: 300].
        #[arg(long, requires = "to")]
        downtime_ms: Option<u64>,
        #[command(flatten)]
        args: MigrateArgs,
    },
}

/// Exit code of a finished VM for `wait` and `launch --wait`, with a line on stderr when
/// it did not exit by itself.
fn vm_exit(vm: &Vm) -> ExitCode {
    match &vm.state {
        VmState::Exited { code } => {
            ExitCode::from(u8::try_from((*code).clamp(0, 255)).unwrap_or(1))
        }
        VmState::Failed { reason } if reason.starts_with(vgpu_api::api::VM_LOST_IN_RESTART) => {
            eprintln!(
                "vgpuctl: VM {} was stopped: its vmm was gone when vgpud restarted (it did not crash); launch it again (exit code {})",
                vm.id,
                code::STOPPED_BY_RESTART
            );
            ExitCode::from(code::STOPPED_BY_RESTART)
        }
        VmState::Failed { reason } => {
            eprintln!("vgpuctl: VM {} failed: {reason}", vm.id);
            ExitCode::from(code::VM_FAILED)
        }
        _ => {
            eprintln!("vgpuctl: VM {} still runs", vm.id);
            ExitCode::from(code::STILL_RUNNING)
        }
    }
}

/// Lines of the console `wait` shows for a VM that did not exit 0.
const TAIL_LINES: usize = 10;

/// For a VM that ended other than with exit code 0: the end of its console on stderr,
/// where the guest says why.
fn console_tail(c: &Client, vm: &Vm) {
    let ended_badly = match &vm.state {
        VmState::Exited { code } => *code != 0,
        VmState::Failed { .. } => true,
        _ => false,
    };
    if !ended_badly {
        return;
    }
    let Ok(bytes) = c.console(vm.id, 0) else {
        return;
    };
    let text = String::from_utf8_lossy(&bytes);
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    if lines.is_empty() {
        return;
    }
    let from = lines.len().saturating_sub(TAIL_LINES);
    let what = match &vm.state {
        VmState::Exited { code } => format!("exited with code {code}"),
        _ => "failed".into(),
    };
    eprintln!(
        "vgpuctl: VM {} {what}; the end of its console (all of it: vgpuctl vm console {}):",
        vm.id, vm.id
    );
    for l in &lines[from..] {
        eprintln!("  | {l}");
    }
}

/// Polls VM `id` until it ends or `timeout` passes. A vgpud that restarts meanwhile is
/// waited for (up to 30 s), so the VM's record after the restart decides the exit code.
fn wait_vm(c: &Client, id: u32, timeout: Duration) -> Result<Vm, ClientError> {
    let start = std::time::Instant::now();
    let mut away_since: Option<std::time::Instant> = None;
    loop {
        match c.vm(id) {
            Ok(vm) => {
                away_since = None;
                if !vm.state.is_live() || start.elapsed() >= timeout {
                    return Ok(vm);
                }
            }
            Err(e @ ClientError::NotRunning { .. }) => {
                let since = *away_since.get_or_insert_with(std::time::Instant::now);
                if since.elapsed() > Duration::from_secs(30) {
                    return Err(e);
                }
            }
            Err(e) => return Err(e),
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The VM given as `ID` or `NAME` (a number is an id): a name is looked up in the list,
/// the live VM of that name first.
fn vm_id(c: &Client, given: &str) -> Result<u32, Failure> {
    if let Ok(id) = given.parse() {
        return Ok(id);
    }
    let all = c.vms()?;
    let named = || all.iter().filter(|v| v.name.as_deref() == Some(given));
    named()
        .find(|v| v.state.is_live())
        .or_else(|| named().max_by_key(|v| v.id))
        .map(|v| v.id)
        .ok_or_else(|| Failure::usage(format!("no VM is named {given:?} (vgpuctl vm list)")))
}

/// Runs one `vm` subcommand.
pub fn run(c: &Client, json: bool, cmd: VmCmd) -> Result<ExitCode, Failure> {
    match cmd {
        VmCmd::List => emit(json, &c.vms()?, |v| vm_rows(v)),
        VmCmd::Show { id } => {
            let id = vm_id(c, &id)?;
            emit(json, &c.vm(id)?, |v| vm_rows(std::slice::from_ref(v)))
        }
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
            share_group,
            oversubscribe,
            storage,
            kernel_deadline_ms,
            name,
            labels,
            wait,
        } => {
            let spec = match (memory, compute) {
                (Some(memory), Some(compute)) => Some(VgpuCreate {
                    gpu,
                    memory_bytes: memory,
                    compute_share: compute,
                    copy_share: copy,
                    priority,
                    oversubscribe,
                    share_group,
                    queues,
                    storage,
                    name: None,
                    labels: Default::default(),
                    kernel_deadline_ms,
                    attach: Default::default(),
                    owner_uid: None,
                    owner_gid: None,
                }),
                (None, None) => {
                    let given = [
                        ("--gpu", gpu.is_some()),
                        ("--copy", copy.is_some()),
                        ("--share-group", share_group.is_some()),
                        ("--oversubscribe", oversubscribe),
                        ("--storage", !storage.is_empty()),
                        ("--kernel-deadline-ms", kernel_deadline_ms.is_some()),
                    ];
                    if let Some((flag, _)) = given.iter().find(|(_, g)| *g) {
                        return Err(Failure::usage(format!(
                            "{flag} describes a new vGPU: give --memory and --compute too (or drop it)"
                        )));
                    }
                    None
                }
                _ => {
                    return Err(Failure::usage(
                        "a new vGPU needs both --memory and --compute (or use --vgpu ID)",
                    ))
                }
            };
            let vgpu = vgpu.map(|v| crate::vgpu::vgpu_id(c, &v)).transpose()?;
            let payload = match std::path::Path::new(&payload) {
                p if p.is_relative() && payload.contains('/') => std::env::current_dir()
                    .map(|d| d.join(p).display().to_string())
                    .unwrap_or(payload),
                _ => payload,
            };
            let vm = c
                .create_vm(&VmCreate {
                    payload: Some(payload),
                    payload_arg,
                    kernel: None,
                    initrd: None,
                    cmdline: None,
                    memory_bytes: ram,
                    vcpus,
                    vgpu_id: vgpu,
                    vgpu: spec,
                    name,
                    labels: labels.into_iter().collect(),
                })
                .map_err(Failure::within(Context::VmLaunch))?;
            if wait {
                let vm = wait_vm(c, vm.id, Duration::from_secs(u64::MAX / 4))?;
                emit(json, &vm, |v| vm_rows(std::slice::from_ref(v)));
                console_tail(c, &vm);
                return Ok(vm_exit(&vm));
            }
            emit(json, &vm, |v| vm_rows(std::slice::from_ref(v)));
        }
        VmCmd::Stats { id } => {
            let id = vm_id(c, &id)?;
            let vm = c.vm(id)?;
            let vgpu = vm
                .vgpu
                .ok_or_else(|| Failure::usage(format!("VM {id} has no vGPU")))?;
            emit(json, &c.vgpu_stats(vgpu)?, |s| {
                stats_rows(std::slice::from_ref(s))
            })
        }
        VmCmd::Delete { id } => {
            let id = vm_id(c, &id)?;
            c.delete_vm(id)?;
            if !json {
                println!("VM {id} deleted");
            }
        }
        VmCmd::Console { id, follow } => {
            let id = vm_id(c, &id)?;
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
            let id = vm_id(c, &id)?;
            let vm = wait_vm(c, id, Duration::from_secs(timeout_s))?;
            emit(json, &vm, |v| vm_rows(std::slice::from_ref(v)));
            console_tail(c, &vm);
            return Ok(vm_exit(&vm));
        }
        VmCmd::Migrate {
            id,
            to,
            to_token_file,
            downtime_ms,
            args,
        } => {
            let id = vm_id(c, &id)?;
            let m = match to {
                Some(to) => {
                    let mut req = host_request(&to, to_token_file.as_deref(), downtime_ms)?;
                    req.mode = args.mode();
                    c.migrate_vm_to(id, &req)
                }
                None => c.migrate_vm(id, &args.req()),
            }
            .map_err(Failure::within(Context::Migrate))?;
            return follow_migration(c, json, m, args.no_wait, args.max_downtime_ms());
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `vm migrate --to`: the destination as the API takes it.
fn host_request(
    to: &str,
    token_file: Option<&std::path::Path>,
    downtime_ms: Option<u64>,
) -> Result<vgpu_api::api::VmMigrateRequest, Failure> {
    let token = match token_file {
        Some(f) => Some(
            std::fs::read_to_string(f)
                .map_err(|e| {
                    Failure::from(vgpu_api::client::ClientError::Usage(format!(
                        "cannot read the token file {}: {e}",
                        f.display()
                    )))
                })?
                .trim()
                .to_owned(),
        ),
        None => None,
    };
    let (socket, url) = if let Some(p) = to.strip_prefix("unix:") {
        (Some(p.to_owned()), None)
    } else if to.starts_with("http://") {
        if token.is_none() {
            return Err(Failure::usage(format!(
                "--to {to}: a vgpud over TCP takes requests only with its token: pass --to-token-file FILE with the destination vgpud's token (--token-file is this vgpud's own)"
            )));
        }
        (None, Some(to.to_owned()))
    } else {
        return Err(Failure::from(vgpu_api::client::ClientError::Usage(
            format!("--to {to:?}: give unix:/path/of/the/vgpud.sock or http://HOST:PORT"),
        )));
    };
    Ok(vgpu_api::api::VmMigrateRequest {
        destination: vgpu_api::api::MigrationDestination { socket, url, token },
        downtime_ms,
        mode: None,
    })
}
