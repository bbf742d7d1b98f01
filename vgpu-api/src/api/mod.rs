//! The REST API's request and response types (schemas of docs/openapi.json).
//!
//! Units: sizes in bytes; shares as **fractions of one physical GPU** in `0.0..=1.0`
//! (0.3 = 30 %), with a resolution of 0.001 (the device's per-mille); bandwidths in
//! bytes per second; utilizations as fractions (1.0 = the whole GPU).
//! Requests reject unknown fields.
//!
//! One module per resource, every type re-exported here:
//! [`vgpus`] (vGPUs, their stats and shared objects), [`vms`], [`migration`] (a vGPU
//! between GPUs of one host), [`rebalance`] (the rebalancer), [`host_migration`] (a whole
//! VM between two vgpud daemons).

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

pub mod host_migration;
pub mod migration;
pub mod rebalance;
pub mod vgpus;
pub mod vms;

pub use host_migration::*;
pub use migration::*;
pub use rebalance::*;
pub use vgpus::*;
pub use vms::*;

/// Every error answer: what went wrong and which request field it is about.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ErrorBody {
    /// What went wrong and what to do about it.
    pub error: String,
    /// The request field (dotted path) or path parameter at fault, when there is one.
    pub field: Option<String>,
}

/// One physical GPU and what is committed on it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Gpu {
    /// Index used by `gpu` fields (0-based).
    pub index: u32,
    /// Device name.
    pub name: String,
    /// Backend serving it: `sim` (or `cuda` once that backend lands).
    pub backend: String,
    /// Device memory.
    pub memory_bytes: u64,
    /// Memory promised to live vGPUs.
    pub memory_committed_bytes: u64,
    /// Memory still free for new vGPUs with hard shares.
    pub memory_free_bytes: u64,
    /// Memory held by shared objects.
    pub memory_shared_bytes: u64,
    /// Memory oversubscribed vGPUs share (what hard shares and shared objects leave, less
    /// the swap area).
    pub oversubscribed_pool_bytes: u64,
    /// Bytes of that pool resident now.
    pub oversubscribed_resident_bytes: u64,
    /// Size of the device-side temporal swap area.
    pub swap_area_bytes: u64,
    /// Bytes in it now.
    pub swap_area_used_bytes: u64,
    /// Host-device copy bandwidth in bytes/s (0 = unpaced).
    pub copy_bandwidth: u64,
    /// Sim compute-rate factor (1.0 = nominal).
    pub speed: f64,
    /// Sum of the compute shares of live vGPUs (at most 1.0).
    pub compute_committed: f64,
    /// Sum of the copy shares of live vGPUs (at most 1.0).
    pub copy_committed: f64,
    /// Ids of the vGPUs placed on it that still hold resources.
    pub vgpus: Vec<u32>,
    /// Times its compute engine went from one vGPU to another since vgpud started: on a
    /// real GPU each is a switch between two workers' CUDA contexts, which the next kernel
    /// pays for (BAND keeps them rare).
    #[serde(default)]
    pub compute_handovers: u64,
    /// The same for its copy engine (with one queue for both: the compute count).
    #[serde(default)]
    pub copy_handovers: u64,
}
