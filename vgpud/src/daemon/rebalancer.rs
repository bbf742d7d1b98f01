//! The rebalancer's state as the daemon owns it: the policy, the demand baselines, the
//! events it reports. The monitoring and the rounds that use it are in `rebalancing.rs`.

use std::collections::{BTreeMap, VecDeque};
use std::time::Instant;

use super::config::Config;
use crate::api;
use vgpu_grant::VgpuUsage;
use vgpu_scheduler::rebalance::Rebalancer;

/// Events kept for `GET /v1/rebalancer/events`.
pub(super) const EVENTS_KEPT: usize = 1000;

pub(super) struct Baseline {
    pub(super) gpu: u32,
    pub(super) usage: VgpuUsage,
    pub(super) at: Instant,
}

/// One vGPU's raw fractions over the last interval.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Raw {
    pub(super) compute_busy: f64,
    pub(super) compute_wait: f64,
    pub(super) copy_busy: f64,
    pub(super) copy_wait: f64,
}

/// The rebalancer's state in the daemon.
pub(super) struct State {
    pub(super) policy: Rebalancer,
    pub(super) started: Instant,
    pub(super) events: VecDeque<api::RebalanceEvent>,
    pub(super) next_event: u64,
    pub(super) baselines: BTreeMap<u32, Baseline>,
    pub(super) raw: BTreeMap<u32, Raw>,
    pub(super) last_round: Option<Instant>,
    pub(super) overload_ns: Vec<u64>,
    pub(super) idle_ns: Vec<u64>,
    pub(super) migrations: u64,
    /// Migrations it started that have not finished: (migration, event).
    pub(super) following: Vec<(u32, u64)>,
}

impl State {
    pub(super) fn new(cfg: &Config) -> Self {
        Self {
            policy: Rebalancer::new(cfg.rebalance),
            started: Instant::now(),
            events: VecDeque::new(),
            next_event: 1,
            baselines: BTreeMap::new(),
            raw: BTreeMap::new(),
            last_round: None,
            overload_ns: vec![0; cfg.gpus.len()],
            idle_ns: vec![0; cfg.gpus.len()],
            migrations: 0,
            following: Vec::new(),
        }
    }

    pub(super) fn ms(&self, at: Instant) -> u64 {
        u64::try_from(at.duration_since(self.started).as_millis()).unwrap_or(u64::MAX)
    }

    pub(super) fn push(&mut self, mut e: api::RebalanceEvent) -> u64 {
        e.id = self.next_event;
        self.next_event += 1;
        match e.kind.as_str() {
            "balance" | "consolidate" | "failed" | "stuck" => {
                tracing::info!(kind = %e.kind, gpu = e.gpu, vgpu = e.vgpu, target = e.target_gpu, reason = %e.reason, "rebalancer")
            }
            _ => {
                tracing::debug!(kind = %e.kind, gpu = e.gpu, reason = %e.reason, "rebalancer")
            }
        }
        let id = e.id;
        self.events.push_back(e);
        while self.events.len() > EVENTS_KEPT {
            self.events.pop_front();
        }
        id
    }
}
