//! What the caller hands in each round (the GPUs and vGPUs as the policy sees them, with
//! the measured demand) and what a round hands back (decisions, loads, notes).

use crate::admission::{Ask, Room};
use crate::clock::Nanos;
use crate::state::VgpuId;
use crate::GpuIndex;

/// Demand on one GPU's engines, fractions of an interval (busy + waiting), each ≤ 1.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Demand {
    pub compute: f64,
    pub copy: f64,
}

impl Demand {
    /// Each fraction within 0..=1 (anything not finite counts as 0).
    pub(super) fn clamp(self) -> Self {
        let c = |v: f64| {
            if v.is_finite() {
                v.clamp(0.0, 1.0)
            } else {
                0.0
            }
        };
        Self {
            compute: c(self.compute),
            copy: c(self.copy),
        }
    }
}

/// One GPU as the policy sees it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GpuView {
    pub index: GpuIndex,
    /// Compute rate relative to nominal (a vGPU's compute demand scales by speed ratios).
    pub speed: f64,
    /// Copy rate relative to nominal.
    pub copy_rate: f64,
    /// Device memory for hard shares.
    pub memory: u64,
    pub committed_memory: u64,
    /// Per-mille committed.
    pub committed_compute: u32,
    pub committed_copy: u32,
    /// Room left in the pool oversubscribed vGPUs share.
    pub pool_free: u64,
}

/// One vGPU as the policy sees it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct VgpuView {
    pub id: VgpuId,
    pub gpu: GpuIndex,
    /// Its memory share (reserved on its GPU unless oversubscribed).
    pub memory: u64,
    /// Shares, per-mille.
    pub compute: u32,
    pub copy: u32,
    pub oversubscribe: bool,
    /// Bytes a move copies (resident device memory).
    pub resident: u64,
    /// Demand over the last interval on its GPU; None = not measured this time.
    pub demand: Option<Demand>,
    /// False while it cannot move (migrating, starting, no worker).
    pub movable: bool,
}

impl GpuView {
    /// What the admission rule needs to know of it.
    pub fn room(&self) -> Room {
        Room {
            gpu: self.index,
            memory: self.memory,
            committed_memory: self.committed_memory,
            committed_compute: self.committed_compute,
            committed_copy: self.committed_copy,
            pool_free: self.pool_free,
        }
    }
}

impl VgpuView {
    /// What it asks of a GPU it moves to (an oversubscribed vGPU brings its resident bytes
    /// into the target's pool).
    pub fn ask(&self) -> Ask {
        Ask {
            memory: self.memory,
            compute: self.compute,
            copy: self.copy,
            oversubscribe: self.oversubscribe,
            resident: self.resident,
        }
    }
}

/// Why a vGPU moves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Its GPU stayed overloaded.
    Balance,
    /// Its GPU is lightly loaded and is being emptied.
    Consolidate,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Balance => "balance",
            Kind::Consolidate => "consolidate",
        }
    }
}

/// One decision: move `vgpu` from `from` to `to`.
#[derive(Clone, Debug, PartialEq)]
pub struct Decision {
    pub at: Nanos,
    pub kind: Kind,
    pub vgpu: VgpuId,
    pub from: GpuIndex,
    pub to: GpuIndex,
    /// Loads before and after the move (as predicted).
    pub from_load: f64,
    pub to_load: f64,
    pub from_load_after: f64,
    pub to_load_after: f64,
    /// The vGPU's smoothed demand (max of compute and copy, on its source).
    pub demand: f64,
    /// Bytes the move copies.
    pub bytes: u64,
    /// How much the pair's peak load drops.
    pub benefit: f64,
    /// Benefit per GiB moved (with the fixed cost).
    pub score: f64,
    /// In words.
    pub reason: String,
}

/// One GPU's state after a round.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct GpuLoad {
    pub index: GpuIndex,
    /// Smoothed demand over capacity, per engine.
    pub compute: f64,
    pub copy: f64,
    /// max(compute, copy).
    pub load: f64,
    /// Overloaded for a whole window now.
    pub overloaded: bool,
    /// Above `overload` since (even if not yet for a window).
    pub over_since: Option<Nanos>,
    /// Holds no vGPU.
    pub idle: bool,
    /// vGPUs on it.
    pub vgpus: u32,
}

/// Something the caller should log beside the decisions.
#[derive(Clone, Debug, PartialEq)]
pub enum Note {
    /// A GPU has been overloaded for a window.
    Overloaded { gpu: GpuIndex, load: f64 },
    /// It no longer is.
    Cleared { gpu: GpuIndex, load: f64 },
    /// A GPU became idle (no vGPU) or busy again.
    Idle { gpu: GpuIndex, idle: bool },
    /// An overloaded GPU had no move that helps (why, in words).
    Stuck { gpu: GpuIndex, why: String },
}

/// What one round decided.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Round {
    pub decisions: Vec<Decision>,
    pub loads: Vec<GpuLoad>,
    pub notes: Vec<Note>,
}
