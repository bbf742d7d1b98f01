//! The daemon: what it owns (configuration, one grant server per GPU, the state, memory
//! pools, the shm registry, the rebalancer, the state file, the host-migration registry,
//! the idle pool workers), built in one place, and the accessors every operation shares (a
//! GPU's configuration, the two ranked locks, whether it is stopping). The
//! operations are functions of their areas' modules (`admission`, `vgpus`, `workers/`,
//! `vms`, `memory`, `migration`, `host_migration/`, `adopt`, `stats`, `restore`,
//! `rebalancing`, `startup`), dispatched from `command.rs`. Lock order: see `locks`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use super::config::{Config, GpuConfig};
use super::error::ApiError;
use super::gpu_memory::Memory;
use super::grants::Grants;
use super::host_registry;
use super::locks::{Guard, Rank, Ranked};
use super::rebalancer;
use super::saver::Persistence;
use super::shm;
use super::spares::Spares;
use super::state::State;
use super::statefile;

/// How long a worker or vmm may take to stop after SIGTERM before SIGKILL.
pub(super) const STOP_GRACE: Duration = Duration::from_millis(500);
/// How long a worker may take to bind its socket. A cuda worker creates its GPU context
/// first, and the driver creates the contexts of one GPU one after another: a burst of 16
/// launches on an H200 took more than 5 s.
pub(super) const WORKER_START: Duration = Duration::from_secs(30);
/// How long a control-channel command may take.
pub(super) const CONTROL_TIMEOUT: Duration = Duration::from_secs(1);

/// The daemon.
pub struct Daemon {
    pub(super) cfg: Config,
    /// One scheduler thread per GPU: every copy and kernel of every vGPU on it passes
    /// through its grant path (BAND by default).
    pub(super) grants: Grants,
    /// The records and the state lock.
    pub(super) state: State,
    pub(super) shutting_down: AtomicBool,
    /// Per GPU: the memory pool oversubscribed vGPUs share.
    pub(super) memory: Memory,
    /// Shared device memory objects.
    pub(super) shm: Ranked<shm::Registry>,
    /// Demand monitoring and the rebalancer.
    pub(super) rebalance: Ranked<rebalancer::State>,
    /// The state file and its writer.
    pub(super) persist: Persistence,
    /// Whole-VM moves to and from other vgpud daemons.
    pub(super) host: host_registry::Registry,
    /// Idle pool workers per GPU (`workers/pool.rs`). A leaf lock.
    pub(super) spares: Spares,
}

impl Daemon {
    pub(super) fn new(cfg: Config) -> Result<Self, vgpu_grant::GrantError> {
        let grants = Grants::start(&cfg)?;
        let memory = Memory::for_config(&cfg);
        let rebalance = Ranked::new(Rank::Rebalance, rebalancer::State::new(&cfg));
        let shm = Ranked::new(Rank::Shm, shm::Registry::new(cfg.shm_limits));
        let persist = Persistence::new(statefile::path_in(&cfg.state_dir));
        Ok(Self {
            persist,
            cfg,
            grants,
            state: State::new(),
            shutting_down: AtomicBool::new(false),
            memory,
            shm,
            rebalance,
            host: Default::default(),
            spares: Spares::default(),
        })
    }

    pub(super) fn check_running(&self) -> Result<(), ApiError> {
        if self.shutting_down.load(Ordering::SeqCst) {
            Err(ApiError::shutting_down())
        } else {
            Ok(())
        }
    }

    pub(super) fn is_shutting_down(&self) -> bool {
        self.shutting_down.load(Ordering::SeqCst)
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    pub(super) fn gpu(&self, index: u32) -> Option<&GpuConfig> {
        self.cfg.gpus.get(usize::try_from(index).ok()?)
    }

    /// The error for a GPU index this host does not have.
    pub(super) fn no_gpu(&self, field: &str, g: u32) -> ApiError {
        ApiError::bad(
            field,
            format!(
                "there is no GPU {g}: this host has GPUs 0..{} (GET /v1/gpus)",
                self.cfg.gpus.len().saturating_sub(1)
            ),
        )
    }

    /// Every GPU index of this host.
    pub(super) fn gpu_indices(&self) -> impl Iterator<Item = u32> {
        (0..self.cfg.gpus.len()).map(|i| u32::try_from(i).unwrap_or(u32::MAX))
    }

    pub(super) fn shm_lock(&self) -> Guard<'_, shm::Registry> {
        self.shm.lock()
    }

    pub(super) fn rb(&self) -> Guard<'_, rebalancer::State> {
        self.rebalance.lock()
    }
}

pub(super) fn no_vgpu(id: u32) -> ApiError {
    ApiError::not_found(
        "id",
        format!("there is no vGPU {id} (GET /v1/vgpus lists them)"),
    )
}

pub(super) fn no_vm(id: u32) -> ApiError {
    ApiError::not_found(
        "id",
        format!("there is no VM {id} (GET /v1/vms lists them)"),
    )
}

#[cfg(test)]
pub(super) mod testing {
    //! A daemon on simulated GPUs that never starts a process, for unit tests.

    use std::time::Duration;

    use super::super::{Config, GpuConfig, Listen, ShmLimits};
    use super::Daemon;
    use crate::api::VgpuCreate;

    pub(in crate::daemon) fn daemon(gpus: u32) -> Daemon {
        Daemon::new(Config {
            listen: Listen::Unix("/nonexistent/vgpud.sock".into()),
            token: None,
            state_dir: "/nonexistent".into(),
            gpus: (0..gpus)
                .map(|i| GpuConfig {
                    name: format!("g{i}"),
                    cuda_ordinal: None,
                    memory: 4 << 30,
                    copy_bandwidth: 0,
                    speed: 1.0,
                })
                .collect(),
            worker_bin: "/nonexistent/vgpu-worker".into(),
            vmm_bin: "/nonexistent/vmm".into(),
            sim_threads: 1,
            queue_poll_us: 0,
            payload_dir: None,
            stats_interval: Duration::from_millis(250),
            stats_window: Duration::from_secs(1),
            swap_area: 0.1,
            policy: vgpu_scheduler::gpu::PolicyKind::Band,
            band_margin: Duration::from_nanos(vgpu_scheduler::Config::DEFAULT.switch_margin),
            rebalance: Default::default(),
            rebalance_interval: Duration::from_millis(250),
            kernel_deadline: Duration::from_secs(2),
            discard_state: false,
            released_retention: Duration::from_secs(300),
            header_read_timeout: Duration::from_secs(10),
            api_idle_timeout: Duration::from_secs(60),
            max_api_connections: None,
            migration_connect_timeout: Duration::from_secs(30),
            storage_root: None,
            shm_limits: ShmLimits::default(),
            workers: Default::default(),
        })
        .expect("scheduler threads")
    }

    pub(in crate::daemon) fn spec(gpu: Option<u32>, memory: u64, compute: f64) -> VgpuCreate {
        VgpuCreate {
            gpu,
            memory_bytes: memory,
            compute_share: compute,
            copy_share: None,
            priority: 0,
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
        }
    }
}
