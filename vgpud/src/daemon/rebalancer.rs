//! The rebalancer's state as the daemon owns it: the policy, the demand baselines, the
//! events it reports, and the placement of a new vGPU by measured load. The monitoring and the rounds that use it are in `rebalancing.rs`.

use std::collections::{BTreeMap, VecDeque};
use std::time::Instant;

use super::config::Config;
use super::gpu_memory::Memory;
use super::state::{Inner, VgpuAsk};
use crate::api;
use crate::units::permille_to_fraction;
use vgpu_grant::VgpuUsage;
use vgpu_scheduler::rebalance::{place, Demand, GpuView, PlaceCandidate, Rebalancer};

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

    /// The events from id `since` on (`GET /v1/rebalancer/events`).
    pub(super) fn events_since(&self, since: u64) -> Vec<api::RebalanceEvent> {
        self.events
            .iter()
            .filter(|e| e.id >= since)
            .cloned()
            .collect()
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

    /// Picks a GPU for a new vGPU among `fits` (those it fits on) by measured load and
    /// free memory share. Caller holds the state lock.
    pub(super) fn place(
        &self,
        cfg: &Config,
        inner: &Inner,
        memory: &Memory,
        ask: &VgpuAsk,
        fits: &[u32],
    ) -> Option<u32> {
        let views = gpu_views(cfg, inner, memory);
        let cands: Vec<PlaceCandidate> = fits
            .iter()
            .filter_map(|&g| {
                let view = views.iter().find(|v| v.index == g)?;
                let g_cfg = cfg.gpus.get(g as usize)?;
                let (mut compute, mut copy, mut n) = (0.0, 0.0, 0);
                for v in inner.vgpus.values().filter(|v| {
                    v.holds_resources() && (v.gpu() == g || v.migrating_to() == Some(g))
                }) {
                    n += 1;
                    let d = self.policy.demand_on(v.id(), view).unwrap_or(Demand {
                        compute: permille_to_fraction(v.compute()),
                        copy: permille_to_fraction(v.copy()),
                    });
                    compute += d.compute;
                    copy += d.copy;
                }
                let committed = inner.committed(g, None).memory;
                let mine = if ask.oversubscribe { 0 } else { ask.memory };
                let free = g_cfg.memory.saturating_sub(committed).saturating_sub(mine);
                Some(PlaceCandidate {
                    gpu: g,
                    load: f64::max(compute, copy),
                    add: permille_to_fraction(ask.compute.max(ask.copy)),
                    free_memory_after: free as f64 / g_cfg.memory.max(1) as f64,
                    occupied: n > 0,
                })
            })
            .collect();
        place(self.policy.config(), &cands)
    }
}

/// Every GPU as the policy sees it. Caller holds the state lock.
pub(super) fn gpu_views(cfg: &Config, inner: &Inner, memory: &Memory) -> Vec<GpuView> {
    let max_bw = cfg.gpus.iter().map(|g| g.copy_bandwidth).max().unwrap_or(0);
    cfg.gpus
        .iter()
        .enumerate()
        .map(|(i, g)| {
            let index = u32::try_from(i).unwrap_or(u32::MAX);
            let c = inner.committed(index, None);
            let pool = memory.figures(index);
            GpuView {
                index,
                speed: g.speed,
                copy_rate: if max_bw == 0 || g.copy_bandwidth == 0 {
                    1.0
                } else {
                    g.copy_bandwidth as f64 / max_bw as f64
                },
                memory: g.memory,
                committed_memory: c.memory,
                committed_compute: c.compute,
                committed_copy: c.copy,
                pool_free: pool.0.saturating_sub(pool.1),
            }
        })
        .collect()
}
