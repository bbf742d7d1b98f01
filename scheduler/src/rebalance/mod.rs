//! Placement and rebalancing across the GPUs of one host (after DCUDA, seed 003):
//! which GPU a new vGPU goes to, and which running vGPU to live-migrate where when a GPU
//! stays overloaded or, under light load, which GPUs can be emptied.
//!
//! Pure policy, no I/O: the caller hands in what each GPU has committed and what each vGPU
//! demanded over the last interval (compute and copy busy time plus time spent waiting for
//! a grant, as fractions of that interval), with the time; [`Rebalancer::observe`] answers
//! with decisions and the reason for each. vgpud runs it in real time, the tests and the
//! benchmark in virtual time.
//!
//! - **Demand** of a vGPU on a resource = (busy + waiting) / interval, at most 1: what it
//!   would have used had it had the engine to itself. It is kept in GPU-independent units
//!   (times the GPU's speed) and smoothed (EWMA), so a vGPU's demand survives its move.
//! - **Load** of a GPU = max over compute and copy of the sum of its vGPUs' demands over
//!   its capacity. Load above 1 means demand above capacity: someone waits.
//! - **Overloaded**: load above `overload` continuously for `window`, or above `severe`
//!   for `severe_window` (half the window); it ends only below `overload_clear` (a
//!   hysteresis band). Also *recurring*: above `overload` for `recurring_duty` of the
//!   recent past (bursts shorter than the window that repeat); such moves are judged on
//!   the vGPUs' recent peaks.
//! - **Swap**: when no single move is allowed, a light vGPU of another GPU comes in first,
//!   then a busy one goes out; each leg on its own keeps every share guaranteed.
//! - **A move** of vGPU v from s to t must keep every share guaranteed (t's committed
//!   compute, copy and memory stay within t), leave t at most at `target_max`, and lower the
//!   pair's peak load by at least `min_gain`, or end the overload (s at most at capacity
//!   after, however little the peak drops). Among the moves allowed, the one with the
//!   highest benefit per byte moved wins (benefit = how much the pair's peak drops; bytes =
//!   the vGPU's resident memory plus a fixed cost per move).
//! - **No ping-pong**: a vGPU that moved stays for `vgpu_cooldown`, never returns to the
//!   GPU it left within `return_cooldown`, a GPU that gave or took a vGPU is left alone for
//!   `gpu_cooldown` and must be overloaded for a fresh `window` before it gives again, and
//!   consolidation packs only up to `pack_max`, below `overload_clear`.
//! - **Consolidation** (mode `consolidate`, when no GPU is overloaded): a GPU whose load
//!   stayed below `light` for a window is drained onto the fullest occupied GPUs that keep
//!   at most `pack_max` after packing, best fit; only when all its vGPUs fit. GPUs left
//!   with no vGPU are reported idle (they can be powered down or lent out).
//!
//! Whether a vGPU fits a GPU at all is the crate's one admission rule
//! ([`crate::admission`]), the same vgpud applies when it creates or changes a vGPU.
//!
//! The modules, by concern:
//! - `config`: [`Mode`] and [`RebalanceConfig`], the knobs.
//! - `view`: the inputs ([`GpuView`], [`VgpuView`], [`Demand`]) and the outputs
//!   ([`Round`], [`Decision`], [`GpuLoad`], [`Note`]).
//! - `place`: [`place`], the GPU for a new vGPU.
//! - `detect`: demand smoothing, loads, and the overload and light-load windows.
//! - `moves`: candidate balance moves and swaps, and their scores.
//! - `consolidate`: emptying lightly loaded GPUs.
//! - `policy`: the round ([`Rebalancer::observe`]) and the bookkeeping of decisions.

mod config;
mod consolidate;
mod detect;
mod moves;
mod place;
mod policy;
#[cfg(test)]
mod tests;
mod view;

use std::collections::BTreeMap;

use crate::admission::{self, WHOLE};
use crate::clock::{Nanos, MS};
use crate::state::VgpuId;

pub use crate::GpuIndex;
pub use config::{Mode, RebalanceConfig};
pub use place::{place, PlaceCandidate};
pub use view::{Decision, Demand, GpuLoad, GpuView, Kind, Note, Round, VgpuView};

#[derive(Clone, Copy, Debug, Default)]
struct Tracked {
    /// Smoothed demand in nominal units (times speed / copy rate).
    work: Demand,
    /// Recent peak of the measured demand (nominal units), decaying with
    /// `recurring_span`.
    peak: Demand,
    seen: bool,
    moved_at: Option<Nanos>,
    left: Option<(GpuIndex, Nanos)>,
}

#[derive(Clone, Copy, Debug, Default)]
struct GpuTrack {
    over_since: Option<Nanos>,
    severe_since: Option<Nanos>,
    /// Fraction of the recent past with load above `overload` (EWMA).
    duty: f64,
    /// Overloaded only by recurrence (its moves are judged on peaks).
    recurring: bool,
    overloaded: bool,
    light_since: Option<Nanos>,
    touched_at: Option<Nanos>,
    idle: Option<bool>,
    stuck_noted: bool,
}

/// The rebalancer's memory between rounds.
#[derive(Clone, Debug)]
pub struct Rebalancer {
    cfg: RebalanceConfig,
    vgpus: BTreeMap<VgpuId, Tracked>,
    gpus: BTreeMap<GpuIndex, GpuTrack>,
    last: Option<Nanos>,
    loads: Vec<GpuLoad>,
    /// The second leg of a swap, waiting for the first to land.
    pending: Option<Pending>,
}

/// A swap's second leg: once `first` (the light vGPU) is on `second.from`, move
/// `second.vgpu` to `second.to`.
#[derive(Clone, Debug)]
struct Pending {
    first: VgpuId,
    second: Decision,
}

/// Why `v` cannot go to `t` (its shares and memory would not stay guaranteed), or None:
/// the admission rule.
fn misfit(v: &VgpuView, t: &GpuView) -> Option<admission::Misfit> {
    admission::misfit(&v.ask(), &t.room())
}

fn gib(b: u64) -> f64 {
    b as f64 / (1u64 << 30) as f64
}

fn on_gpu(w: Demand, g: &GpuView) -> Demand {
    Demand {
        compute: w.compute / g.speed.max(1e-9),
        copy: w.copy / g.copy_rate.max(1e-9),
    }
}
