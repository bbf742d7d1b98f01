//! The GPUs' schedulers as the daemon owns them: one grant server per GPU (every copy and
//! kernel of every vGPU on it passes through its grant path, BAND by default), and a
//! vGPU's shares and kernel deadline joining or leaving one.

use std::time::Duration;

use axum::http::StatusCode;

use super::config::Config;
use super::error::ApiError;
use super::state::VgpuRec;
use crate::units::permille_to_fraction;
use vgpu_grant::{GrantError, GrantServer, ServerConfig, WorkerFds};
use vgpu_scheduler::Share;

/// One grant server per GPU, each a scheduler thread.
pub(super) struct Grants {
    servers: Vec<GrantServer>,
    /// The kernel deadline of a vGPU that sets none (`--kernel-deadline-ms`).
    kernel_deadline: Duration,
}

impl Grants {
    /// Starts one scheduler thread per configured GPU.
    pub(super) fn start(cfg: &Config) -> Result<Self, GrantError> {
        let defaults = ServerConfig::default();
        let sched = ServerConfig {
            policy: cfg.policy,
            sched: vgpu_scheduler::Config {
                switch_margin: u64::try_from(cfg.band_margin.as_nanos()).unwrap_or(u64::MAX),
                ..defaults.sched
            },
            ..defaults
        };
        let servers = (0..cfg.gpus.len())
            .map(|i| GrantServer::start(sched, &format!("gpu{i}")))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            servers,
            kernel_deadline: cfg.kernel_deadline,
        })
    }

    /// GPU `gpu`'s grant server.
    pub(super) fn get(&self, gpu: u32) -> Option<&GrantServer> {
        self.servers.get(gpu as usize)
    }

    /// vGPU `rec`'s shares joined GPU `gpu`'s scheduler (its own, or a migration's
    /// target): the descriptors its worker needs.
    pub(super) fn attach(&self, rec: &VgpuRec, gpu: u32) -> Result<WorkerFds, ApiError> {
        let (id, priority) = (rec.id(), rec.priority());
        let server = self
            .get(gpu)
            .ok_or_else(|| ApiError::internal(format!("vGPU {id} is on an unknown GPU")))?;
        let share = |permille: u32| Share {
            fraction: permille_to_fraction(permille),
            priority,
        };
        let fds = server
            .attach(id, share(rec.compute()), share(rec.copy()))
            .map_err(|e| match e {
                GrantError::Stopped(_) => ApiError::status(
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!("cannot schedule vGPU {id} on GPU {gpu}: {e}"),
                ),
                e => ApiError::internal(format!("cannot schedule vGPU {id}: {e}")),
            })?;
        server
            .set_kernel_deadline(id, self.kernel_deadline_of(rec))
            .map_err(|e| {
                ApiError::internal(format!("cannot set vGPU {id}'s kernel deadline: {e}"))
            })?;
        Ok(fds)
    }

    /// The kernel deadline vGPU `rec`'s requests run under: its own, or the daemon's.
    pub(super) fn kernel_deadline_of(&self, rec: &VgpuRec) -> Duration {
        rec.kernel_deadline_ms().map_or(self.kernel_deadline, |ms| {
            Duration::from_millis(u64::from(ms))
        })
    }

    /// Applies vGPU `id`'s kernel deadline to the schedulers of `gpus` it is attached to
    /// now (one it is not attached to takes it when it attaches).
    pub(super) fn apply_kernel_deadline(&self, id: u32, deadline: Duration, gpus: &[u32]) {
        for gpu in gpus {
            let Some(server) = self.get(*gpu) else {
                continue;
            };
            match server.set_kernel_deadline(id, deadline) {
                Ok(()) => tracing::info!(
                    vgpu = id,
                    gpu,
                    deadline_ms = deadline.as_millis() as u64,
                    "kernel deadline set"
                ),
                Err(e) => {
                    tracing::debug!(vgpu = id, gpu, error = %e, "kernel deadline kept for the next attach")
                }
            }
        }
    }

    /// vGPU `id` leaves GPU `gpu`'s scheduler (its worker is gone): whatever it held
    /// passes on.
    pub(super) fn detach(&self, id: u32, gpu: u32) {
        if let Some(server) = self.get(gpu) {
            server.detach(id);
        }
    }

    /// Why vGPU `id`'s worker was detached from GPU `gpu`'s grant path, if it was.
    pub(super) fn expelled(&self, id: u32, gpu: u32) -> Option<String> {
        self.get(gpu)
            .and_then(|g| g.expelled(id))
            .map(|why| format!("its worker was detached from GPU {gpu}'s scheduler: {why}"))
    }
}
