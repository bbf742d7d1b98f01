//! One GPU's pool of oversubscribed memory as the daemon owns it: the planner that decides
//! who swaps, and the slot that takes one reservation at a time. The operations on it are
//! in `memory.rs`.

use super::config::Config;
use super::locks::{Guard, Rank, Ranked};
use vgpu_scheduler::memory::Planner;

/// One GPU's oversubscribed memory: the pool's plan, and one reservation at a time.
pub(super) struct GpuMemory {
    planner: Ranked<Planner>,
    /// One reservation at a time (an async mutex: see `locks.rs`).
    pub(super) serial: tokio::sync::Mutex<()>,
}

impl GpuMemory {
    /// Its planner, locked.
    pub(super) fn planner(&self) -> Guard<'_, Planner> {
        self.planner.lock()
    }

    /// One pool per configured GPU: what is left after the swap area.
    pub(super) fn for_config(cfg: &Config) -> Vec<Self> {
        cfg.gpus
            .iter()
            .map(|g| {
                let swap = (g.memory as f64 * cfg.swap_area) as u64;
                Self {
                    planner: Ranked::new(
                        Rank::Planner,
                        Planner::new(g.memory - swap.min(g.memory), swap),
                    ),
                    serial: tokio::sync::Mutex::new(()),
                }
            })
            .collect()
    }
}
