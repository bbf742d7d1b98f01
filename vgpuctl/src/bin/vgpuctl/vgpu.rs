//! `vgpuctl vgpu ...`: create, list, change, delete, stats and migrate vGPUs.

use std::process::ExitCode;

use clap::{Args, Subcommand};
use vgpu_api::api::{Attach, StorageAttachment, Vgpu, VgpuCreate, VgpuPatch, VgpuState};
use vgpu_api::client::Client;
use vgpu_api::units::{parse_share_fraction, parse_size};

use crate::errors::{Context, Failure};
use crate::migrate::{follow_migration, MigrateArgs};
use crate::output::{emit, pct, stats_rows, vgpu_rows};

#[derive(Args, Debug, Clone)]
pub struct VgpuSpecArgs {
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
    /// Allow memory oversubscription (the share is not reserved; the vGPU is
    /// swapped out when the GPU runs short).
    #[arg(long)]
    oversubscribe: bool,
    /// Attach a storage namespace, `ID=PATH[:ro|:rw]` (read-only unless `:rw`); repeat
    /// for more.
    #[arg(long, value_parser = StorageAttachment::parse)]
    storage: Vec<StorageAttachment>,
    /// A name (a DNS label, unique among live vGPUs).
    #[arg(long)]
    name: Option<String>,
    /// A label, `KEY=VALUE`; repeat for more.
    #[arg(long = "label", value_parser = parse_label)]
    labels: Vec<(String, String)>,
    /// How long one request of the vGPU may hold the GPU before the scheduler gives
    /// it to the neighbours, ms (10 to 60000) [default: vgpud's --kernel-deadline-ms].
    #[arg(long, value_parser = clap::value_parser!(u32).range(10..=60_000))]
    kernel_deadline_ms: Option<u32>,
}

/// The vGPU given as `ID` or `NAME` (a number is an id): a name is looked up in the
/// list, the live vGPU of that name first (a released or failed one gives its name back).
pub fn vgpu_id(c: &Client, given: &str) -> Result<u32, Failure> {
    if let Ok(id) = given.parse() {
        return Ok(id);
    }
    let all = c.vgpus()?;
    let named = || all.iter().filter(|v| v.name.as_deref() == Some(given));
    if let Some(v) = named()
        .find(|v| !matches!(v.state, VgpuState::Released | VgpuState::Failed { .. }))
        .or_else(|| named().max_by_key(|v| v.id))
    {
        return Ok(v.id);
    }
    // A VM's name stands for the VM's vGPU (a VM's own vGPU has no name of its own).
    let vms = c.vms()?;
    let vm = vms
        .iter()
        .filter(|v| v.name.as_deref() == Some(given))
        .max_by_key(|v| (v.state.is_live(), v.id));
    match vm {
        Some(vm) => vm
            .vgpu
            .ok_or_else(|| Failure::usage(format!("VM {given:?} (VM {}) has no vGPU", vm.id))),
        None => Err(Failure::usage(format!(
            "no vGPU or VM is named {given:?} (vgpuctl vgpu list, vgpuctl vm list)"
        ))),
    }
}

/// A label given as `KEY=VALUE`.
pub fn parse_label(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_owned(), v.to_owned())),
        _ => Err(format!("{s:?} is not a label: give KEY=VALUE")),
    }
}

/// `vgpu create`: the vGPU, and who its frontend is.
#[derive(Args, Debug, Clone)]
pub struct VgpuCreateArgs {
    #[command(flatten)]
    spec: VgpuSpecArgs,
    /// Who uses the vGPU: `vm` (a VM launched with `vm launch --vgpu ID`) or `process`
    /// (a host or container process through libcuda.so.1: vgpuctl prints its
    /// `VGPU_SOCKET=...`).
    #[arg(long, default_value = "vm")]
    attach: Attach,
    /// With `--attach process`: the uid that may connect to the socket.
    #[arg(long)]
    owner_uid: Option<u32>,
    /// With `--attach process`: the gid that may connect to the socket.
    #[arg(long)]
    owner_gid: Option<u32>,
}

impl VgpuCreateArgs {
    fn spec(&self) -> VgpuCreate {
        VgpuCreate {
            attach: self.attach,
            owner_uid: self.owner_uid,
            owner_gid: self.owner_gid,
            ..self.spec.spec()
        }
    }
}

/// What `vgpu create` prints: the table, and for a process vGPU the environment its
/// process needs.
fn created_rows(v: &Vgpu) -> String {
    let mut out = vgpu_rows(std::slice::from_ref(v));
    if v.attach == Attach::Process {
        out.push_str(&format!(
            "vGPU {} serves a process (attach process); run it with:\nVGPU_SOCKET={}\n",
            v.id, v.socket
        ));
    }
    out
}

impl VgpuSpecArgs {
    pub fn spec(&self) -> VgpuCreate {
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
            name: self.name.clone(),
            labels: self.labels.iter().cloned().collect(),
            kernel_deadline_ms: self.kernel_deadline_ms,
            attach: Default::default(),
            owner_uid: None,
            owner_gid: None,
        }
    }
}

#[derive(Subcommand, Debug)]
pub enum VgpuCmd {
    /// List vGPUs.
    List,
    /// Show one vGPU.
    Show {
        /// The vGPU's id or name.
        id: String,
    },
    /// Create a vGPU (starts its worker).
    Create(VgpuCreateArgs),
    /// Change shares, priority, name, labels or kernel deadline at run time. Each share
    /// changes only when given: `--compute` alone leaves the copy share where it is
    /// (vgpuctl says so).
    Set {
        /// The vGPU's id or name.
        id: String,
        /// New compute share: a fraction (0.3) or percentage (30%).
        #[arg(long, value_parser = parse_share_fraction)]
        compute: Option<f64>,
        /// New copy-bandwidth share.
        #[arg(long, value_parser = parse_share_fraction)]
        copy: Option<f64>,
        /// New priority.
        #[arg(long, allow_negative_numbers = true)]
        priority: Option<i32>,
        /// New name ("" removes it).
        #[arg(long)]
        name: Option<String>,
        /// New labels, `KEY=VALUE`, replacing all of them; repeat for more.
        #[arg(long = "label", value_parser = parse_label)]
        labels: Vec<(String, String)>,
        /// Remove every label.
        #[arg(long, conflicts_with = "labels")]
        clear_labels: bool,
        /// New kernel deadline, ms (10 to 60000).
        #[arg(long, value_parser = clap::value_parser!(u32).range(10..=60_000))]
        kernel_deadline_ms: Option<u32>,
    },
    /// Delete a vGPU.
    Delete {
        /// The vGPU's id or name.
        id: String,
    },
    /// Utilization, memory and counters.
    Stats {
        /// The vGPU's id or name.
        id: String,
    },
    /// Live-migrate to another GPU (the VM keeps running; it sees a pause).
    Migrate {
        /// The vGPU's id or name.
        id: String,
        #[command(flatten)]
        args: MigrateArgs,
    },
}

/// Runs one `vgpu` subcommand.
pub fn run(c: &Client, json: bool, cmd: VgpuCmd) -> Result<ExitCode, Failure> {
    match cmd {
        VgpuCmd::List => emit(json, &c.vgpus()?, |v| vgpu_rows(v)),
        VgpuCmd::Show { id } => {
            let id = vgpu_id(c, &id)?;
            emit(json, &c.vgpu(id)?, created_rows)
        }
        VgpuCmd::Create(a) => emit(
            json,
            &c.create_vgpu(&a.spec())
                .map_err(Failure::within(Context::VgpuCreate))?,
            created_rows,
        ),
        VgpuCmd::Set {
            id,
            compute,
            copy,
            priority,
            name,
            labels,
            clear_labels,
            kernel_deadline_ms,
        } => {
            let id = vgpu_id(c, &id)?;
            let labels = (clear_labels || !labels.is_empty()).then(|| {
                labels
                    .into_iter()
                    .collect::<std::collections::BTreeMap<_, _>>()
            });
            if compute.is_none()
                && copy.is_none()
                && priority.is_none()
                && name.is_none()
                && labels.is_none()
                && kernel_deadline_ms.is_none()
            {
                return Err(Failure::usage(
                    "nothing to change: give --compute, --copy, --priority, --name, --label, --clear-labels or --kernel-deadline-ms",
                ));
            }
            let patch = VgpuPatch {
                compute_share: compute,
                copy_share: copy,
                priority,
                name,
                labels,
                kernel_deadline_ms,
            };
            let v = c
                .patch_vgpu(id, &patch)
                .map_err(Failure::within(Context::VgpuSet))?;
            emit(json, &v, |v| vgpu_rows(std::slice::from_ref(v)));
            if compute.is_some() && copy.is_none() && v.copy_share != v.compute_share {
                eprintln!(
                    "vgpuctl: note: vGPU {id}'s copy share stays at {}; change it with --copy",
                    pct(v.copy_share)
                );
            }
        }
        VgpuCmd::Delete { id } => {
            let id = vgpu_id(c, &id)?;
            c.delete_vgpu(id)?;
            if !json {
                println!("vGPU {id} deleted");
            }
        }
        VgpuCmd::Stats { id } => {
            let id = vgpu_id(c, &id)?;
            emit(json, &c.vgpu_stats(id)?, |s| {
                stats_rows(std::slice::from_ref(s))
            })
        }
        VgpuCmd::Migrate { id, args } => {
            let id = vgpu_id(c, &id)?;
            let m = c
                .migrate_vgpu(id, &args.req())
                .map_err(Failure::within(Context::Migrate))?;
            return follow_migration(c, json, m, args.no_wait, args.max_downtime_ms());
        }
    }
    Ok(ExitCode::SUCCESS)
}
