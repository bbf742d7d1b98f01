//! `vgpuctl vgpu ...`: create, list, change, delete, stats and migrate vGPUs.

use std::process::ExitCode;

use clap::{Args, Subcommand};
use vgpu_api::api::{StorageAttachment, VgpuCreate, VgpuPatch};
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
            name: None,
            labels: Default::default(),
        }
    }
}

#[derive(Subcommand, Debug)]
pub enum VgpuCmd {
    /// List vGPUs.
    List,
    /// Show one vGPU.
    Show { id: u32 },
    /// Create a vGPU (starts its worker).
    Create(VgpuSpecArgs),
    /// Change shares or priority at run time. Each share changes only when given:
    /// `--compute` alone leaves the copy share where it is (vgpuctl says so).
    Set {
        id: u32,
        /// New compute share: a fraction (0.3) or percentage (30%).
        #[arg(long, value_parser = parse_share_fraction)]
        compute: Option<f64>,
        /// New copy-bandwidth share.
        #[arg(long, value_parser = parse_share_fraction)]
        copy: Option<f64>,
        /// New priority.
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

/// Runs one `vgpu` subcommand.
pub fn run(c: &Client, json: bool, cmd: VgpuCmd) -> Result<ExitCode, Failure> {
    match cmd {
        VgpuCmd::List => emit(json, &c.vgpus()?, |v| vgpu_rows(v)),
        VgpuCmd::Show { id } => emit(json, &c.vgpu(id)?, |v| vgpu_rows(std::slice::from_ref(v))),
        VgpuCmd::Create(a) => emit(
            json,
            &c.create_vgpu(&a.spec())
                .map_err(Failure::within(Context::VgpuCreate))?,
            |v| vgpu_rows(std::slice::from_ref(v)),
        ),
        VgpuCmd::Set {
            id,
            compute,
            copy,
            priority,
        } => {
            if compute.is_none() && copy.is_none() && priority.is_none() {
                return Err(Failure::usage(
                    "nothing to change: give --compute, --copy or --priority",
                ));
            }
            let patch = VgpuPatch {
                compute_share: compute,
                copy_share: copy,
                priority,
                name: None,
                labels: None,
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
            c.delete_vgpu(id)?;
            if !json {
                println!("vGPU {id} deleted");
            }
        }
        VgpuCmd::Stats { id } => emit(json, &c.vgpu_stats(id)?, |s| {
            stats_rows(std::slice::from_ref(s))
        }),
        VgpuCmd::Migrate { id, args } => {
            let m = c
                .migrate_vgpu(id, &args.req())
                .map_err(Failure::within(Context::Migrate))?;
            return follow_migration(c, json, m, args.no_wait, args.max_downtime_ms());
        }
    }
    Ok(ExitCode::SUCCESS)
}
