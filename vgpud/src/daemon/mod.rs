//! vgpud: owns the physical GPUs, spawns one `vgpu-worker` per vGPU and one `vmm` per VM,
//! keeps a control channel to every worker, tears a VM's vGPU down when either process
//! exits (however it exits), and serves the REST API. Its VMs and workers outlive it: the
//! next vgpud adopts them (`adopt.rs`); workers run sandboxed (`workers/`).
//!
//! Accounting: a vGPU holds its memory and shares on its GPU while it is `starting`,
//! `ready` or `attached`; once its worker is gone (`released`, `failed`) they are free.
//! A vGPU serves one VM: its device memory dies with the VM (invariant 5), so a new VM
//! needs a new vGPU.

mod admission;
mod adopt;
mod attach;
mod command;
mod config;
mod core;
mod error;
mod gpu_memory;
mod grants;
mod host_migration;
mod host_registry;
pub mod http;
mod link;
mod locks;
mod memory;
mod metrics;
mod migration;
mod private;
mod procs;
mod rebalancer;
mod rebalancing;
mod restore;
mod saver;
mod shm;
mod spares;
mod startup;
mod state;
pub mod statefile;
mod stats;
mod storage;
mod vgpus;
mod vms;
mod worker_files;
mod workers;

use std::path::{Path, PathBuf};

pub use self::core::Daemon;
pub use command::{Command, Reply};
pub use error::{ApiError, DaemonError};
pub use migration::MigrateCommand;
pub use shm::Limits as ShmLimits;

pub use config::{Config, GpuConfig, Listen, SeccompMode, WorkerSandbox, DEFAULT_WORKER_UID_BASE};

pub use private::default_state_dir;

/// The default API socket: `<default state dir>/vgpud.sock`.
pub fn default_socket() -> Result<PathBuf, DaemonError> {
    Ok(default_state_dir()?.join("vgpud.sock"))
}

/// A sibling binary of the running executable (same target directory).
pub fn sibling_binary(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap_or_default();
    let mut dir = exe.parent().map(Path::to_path_buf).unwrap_or_default();
    if dir.ends_with("deps") {
        dir.pop();
    }
    dir.join(name)
}

/// Runs vgpud until SIGTERM or SIGINT, then saves its state and removes its API socket;
/// the VMs and workers it started keep running for the next vgpud to adopt.
/// `on_listening` runs once the API accepts connections.
pub fn run(
    config: Config,
    on_listening: impl FnOnce() + Send + 'static,
) -> Result<(), DaemonError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(DaemonError::Runtime)?;
    rt.block_on(startup::serve(config, on_listening))
}
