//! Placement of a new vGPU among the GPUs it fits on.

use super::{GpuIndex, Mode, RebalanceConfig};

/// A candidate GPU for a new vGPU.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PlaceCandidate {
    pub gpu: GpuIndex,
    /// Its expected load now (measured, or the shares where nothing is measured yet).
    pub load: f64,
    /// What the new vGPU is expected to add (its share).
    pub add: f64,
    /// Fraction of its memory still free after the new vGPU.
    pub free_memory_after: f64,
    /// It holds vGPUs already.
    pub occupied: bool,
}

/// Picks a GPU for a new vGPU among those it fits on: the lowest expected load after
/// placing plus memory pressure (1 - free memory share after), so both measured load and
/// free memory count, not the number of vGPUs. In `consolidate` mode, the fullest
/// occupied GPU that stays at most `pack_max` (best fit), else as above.
pub fn place(cfg: &RebalanceConfig, candidates: &[PlaceCandidate]) -> Option<GpuIndex> {
    if cfg.mode == Mode::Consolidate {
        let packed = candidates
            .iter()
            .filter(|c| c.occupied && c.load + c.add <= cfg.pack_max)
            .max_by(|a, b| (a.load + a.add).total_cmp(&(b.load + b.add)));
        if let Some(c) = packed {
            return Some(c.gpu);
        }
    }
    let cost = |c: &PlaceCandidate| c.load + c.add + 0.5 * (1.0 - c.free_memory_after);
    candidates
        .iter()
        .min_by(|a, b| cost(a).total_cmp(&cost(b)).then(a.gpu.cmp(&b.gpu)))
        .map(|c| c.gpu)
}
