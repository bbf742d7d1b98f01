//! Whole-VM migration between two vgpud daemons.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

#[cfg(doc)]
use super::MigrateRequest;
use super::VmCreate;

/// Where a whole VM moves: another vgpud, on this host (`socket`: its API socket) or
/// another (`url` `http://HOST:PORT` with that daemon's bearer `token`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MigrationDestination {
    #[serde(default)]
    pub socket: Option<String>,
    #[serde(default)]
    pub url: Option<String>,
    #[serde(default)]
    pub token: Option<String>,
}

/// `POST /v1/vms/{id}/migrate` with a destination: move the whole VM, vGPU included, to
/// another vgpud. Without `destination` the request moves the VM's vGPU to another GPU of
/// this host (see [`MigrateRequest`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct VmMigrateRequest {
    pub destination: MigrationDestination,
    /// The pause the move aims for, ms (default 300).
    #[serde(default)]
    pub downtime_ms: Option<u64>,
    /// `precopy` (default: guest RAM and the vGPU's memory copied while the VM runs, one
    /// short stop for the rest) or `stop_copy` (the VM stops first; everything moves while
    /// it is stopped).
    #[serde(default)]
    pub mode: Option<String>,
}

/// A VM another vgpud wants to move here (`POST /v1/migrations/incoming`): what it is
/// launched as, its vGPU inline. The destination admits it with its own admission rule.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct IncomingVm {
    pub vm: VmCreate,
    /// Who sends it, for the record (the source's VM id and daemon).
    #[serde(default)]
    pub source: String,
}

/// The destination admitted the VM and waits for it: where to send the VM's stream
/// (`vmm`) and its vGPU's (`vgpu`), and the vGPU stream's one-time token.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct IncomingAccepted {
    /// The destination's record of the move (`GET /v1/migrations/{id}` there).
    pub migration: u32,
    /// The VM's id there.
    pub vm: u32,
    /// `unix:PATH` or `tcp:HOST:PORT` (HOST empty: the destination's API host).
    pub vmm_address: String,
    pub vgpu_address: Option<String>,
    pub token: Option<String>,
    /// The VM stream's one-time token.
    #[serde(default)]
    pub vmm_token: Option<String>,
}

/// The source's last word on a finished move (`POST /v1/migrations/{id}/commit`): the
/// VM's console so far, which the destination's console continues.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct IncomingCommit {
    #[serde(default)]
    pub console: String,
    /// The move's figures as the source measured them (the destination's record shows
    /// them too).
    #[serde(default)]
    pub downtime_ms: Option<f64>,
    #[serde(default)]
    pub elapsed_ms: Option<f64>,
    #[serde(default)]
    pub figures: Option<HostMigration>,
    /// How long the VM has run, ms (its uptime continues at the destination).
    #[serde(default)]
    pub uptime_ms: Option<u64>,
}

/// A whole-VM move between two vgpud daemons, as one side sees it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct HostMigration {
    /// `outgoing` or `incoming`.
    pub direction: String,
    /// The VM's id on this side.
    pub vm: u32,
    /// The other daemon.
    pub peer: String,
    /// The VM's id and the move's record on the other side (once known).
    pub remote_vm: Option<u32>,
    pub remote_migration: Option<u32>,
    /// Guest RAM: pre-copy rounds, bytes sent, RAM sent while stopped.
    pub vmm_rounds: u32,
    pub vmm_bytes: u64,
    pub stop_ram_bytes: u64,
    /// The vGPU's state: rounds, bytes, the vGPU's share of the stop.
    pub vgpu_rounds: u32,
    pub vgpu_bytes: u64,
    pub vgpu_downtime_ms: Option<f64>,
}
