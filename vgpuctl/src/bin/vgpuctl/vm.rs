//! `vgpuctl vm ...`: launch, list, watch, wait for, delete and migrate VMs.

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use clap::Subcommand;
use vgpu_api::api::{VgpuCreate, Vm, VmCreate, VmState};
use vgpu_api::client::{Client, ClientError};
use vgpu_api::units::{parse_share_fraction, parse_size};

use crate::migrate::{follow_migration, MigrateArgs};
use crate::output::{emit, vm_rows};

#[derive(Subcommand, Debug)]
pub enum VmCmd {
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

/// Exit code of a finished VM for `--wait`.
fn vm_exit(vm: &Vm) -> ExitCode {
    match vm.state {
        VmState::Exited { code } => ExitCode::from(u8::try_from(code.clamp(0, 255)).unwrap_or(1)),
        VmState::Failed { .. } => ExitCode::from(125),
        _ => ExitCode::from(124),
    }
}

/// Runs one `vm` subcommand.
pub fn run(c: &Client, json: bool, cmd: VmCmd) -> Result<ExitCode, ClientError> {
    match cmd {
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
                    name: None,
                    labels: Default::default(),
                }),
                (None, None) => None,
                _ => {
                    return Err(ClientError::Usage(
                        "a new vGPU needs both --memory and --compute (or use --vgpu ID)".into(),
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
                name: None,
                labels: Default::default(),
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
            return follow_migration(c, json, m, args.no_wait);
        }
    }
    Ok(ExitCode::SUCCESS)
}
