//! Live migration of a vGPU to another GPU of the same host.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::HostMigration;

/// A live migration request.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MigrateRequest {
    /// Target physical GPU; default: the least loaded other GPU with room.
    #[serde(default)]
    pub target_gpu: Option<u32>,
    /// `precopy` (default: copy while the guest runs, pause only for the rest) or
    /// `stop_copy` (pause, copy everything).
    #[serde(default)]
    pub mode: Option<String>,
    /// Pre-copy stops once the rest is expected to copy within this, ms (default 50).
    #[serde(default)]
    pub max_downtime_ms: Option<u64>,
}

/// One phase of a migration on its timeline.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MigrationSpan {
    /// `precopy`, `draining` or `stop_copy`.
    pub phase: String,
    /// Since the migration started, ms.
    pub start_ms: f64,
    pub end_ms: f64,
}

/// A live migration of a vGPU.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Migration {
    pub id: u32,
    pub vgpu: u32,
    pub source_gpu: u32,
    pub target_gpu: u32,
    /// `precopy` or `stop_copy`.
    pub mode: String,
    /// `running`, `completed` or `failed` (then the vGPU still runs on its source).
    pub state: String,
    /// `starting`, `precopy`, `draining`, `stop_copy`, `done`.
    pub phase: String,
    /// Pre-copy rounds so far.
    pub rounds: u32,
    /// Bytes copied so far.
    pub bytes: u64,
    /// Bytes the vGPU holds.
    pub total_bytes: u64,
    /// Bytes still to copy, as last estimated.
    pub dirty_bytes: u64,
    /// The guest's pause, ms (once completed).
    pub downtime_ms: Option<f64>,
    /// Time since the start (total time once finished), ms.
    pub elapsed_ms: f64,
    /// Why it failed.
    pub error: Option<String>,
    pub timeline: Vec<MigrationSpan>,
    /// A whole VM moving to or from another vgpud (then `vgpu`, `source_gpu` and
    /// `target_gpu` are this side's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<HostMigration>,
}
