//! The rebalancer: measured demand, settings, decisions.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// One GPU's demand as the rebalancer measured it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct GpuDemand {
    pub gpu: u32,
    /// Smoothed demand (busy + queue wait of its vGPUs) over capacity, compute engine.
    pub compute_demand: f64,
    /// The same for the copy engine.
    pub copy_demand: f64,
    /// max(compute, copy): above 1 the GPU's vGPUs want more than it has.
    pub load: f64,
    /// Overloaded (load above the threshold for a whole window) now.
    pub overloaded: bool,
    /// Holds no vGPU (can be powered down or lent out).
    pub idle: bool,
    /// vGPUs on it.
    pub vgpus: u32,
    /// Time its load was above the overload threshold, ms since vgpud started.
    pub overload_ms: u64,
    /// Time it held no vGPU, ms since vgpud started.
    pub idle_ms: u64,
}

/// One vGPU's measured demand.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct VgpuDemand {
    pub vgpu: u32,
    pub gpu: u32,
    /// Compute busy time over the last interval, fraction.
    pub compute_busy: f64,
    /// Time with compute requests waiting for a grant, fraction.
    pub compute_wait: f64,
    pub copy_busy: f64,
    pub copy_wait: f64,
    /// Smoothed demand on its GPU (busy + wait, at most 1 each).
    pub compute_demand: f64,
    pub copy_demand: f64,
    /// Device memory resident now (what a move copies).
    pub memory_resident_bytes: u64,
    /// Device memory it has allocated.
    pub memory_allocated_bytes: u64,
    /// Its memory share.
    pub memory_share_bytes: u64,
}

/// The rebalancer: its settings and what it measures now.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RebalancerStatus {
    /// `off` (measure only), `balance` or `consolidate`.
    pub mode: String,
    pub interval_ms: u64,
    /// How long an overload (or light load) must last before it is acted on.
    pub window_ms: u64,
    /// Overload threshold on a GPU's load.
    pub overload: f64,
    /// Migrations the rebalancer started.
    pub migrations: u64,
    /// GPUs that hold no vGPU now.
    pub idle_gpus: Vec<u32>,
    pub gpus: Vec<GpuDemand>,
    pub vgpus: Vec<VgpuDemand>,
}

/// Something the rebalancer decided or noticed, with its reason.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RebalanceEvent {
    pub id: u64,
    /// Since vgpud started, ms.
    pub at_ms: u64,
    /// `balance` or `consolidate` (a migration), `overloaded`, `cleared`, `idle`,
    /// `busy`, `stuck` (overloaded, no move helps), or `failed` (a migration it started
    /// failed).
    pub kind: String,
    /// The GPU it is about (the source of a move).
    pub gpu: Option<u32>,
    pub vgpu: Option<u32>,
    pub target_gpu: Option<u32>,
    /// GPU load(s) before, and after as predicted for a move.
    pub load: Option<f64>,
    pub load_after: Option<f64>,
    /// Bytes a move copies.
    pub bytes: Option<u64>,
    /// The migration started (follow it at /v1/migrations/{id}).
    pub migration: Option<u32>,
    /// In words.
    pub reason: String,
}
