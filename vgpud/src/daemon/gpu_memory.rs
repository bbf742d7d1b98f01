//! The GPUs' pools of oversubscribed memory as the daemon owns them: per GPU, the planner
//! that decides who swaps and the slot that takes one reservation at a time. Membership
//! and the figures are here; reservations, which ask workers to swap, are `memory.rs`.

use super::config::Config;
use super::locks::{Guard, Rank, Ranked};
use super::state::VgpuRec;
use crate::control::MemReport;
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
}

/// Every GPU's pool.
pub(super) struct Memory {
    gpus: Vec<GpuMemory>,
    /// The part of each GPU's memory kept as its swap area (`--swap-area`).
    swap_fraction: f64,
}

/// One pool's figures, for the API: (capacity, resident, swap area, device swap in use).
pub(super) type PoolFigures = (u64, u64, u64, u64);

impl Memory {
    /// One pool per configured GPU: what is left after the swap area.
    pub(super) fn for_config(cfg: &Config) -> Self {
        let gpus = cfg
            .gpus
            .iter()
            .map(|g| {
                let swap = (g.memory as f64 * cfg.swap_area) as u64;
                GpuMemory {
                    planner: Ranked::new(
                        Rank::Planner,
                        Planner::new(g.memory - swap.min(g.memory), swap),
                    ),
                    serial: tokio::sync::Mutex::new(()),
                }
            })
            .collect();
        Self {
            gpus,
            swap_fraction: cfg.swap_area,
        }
    }

    /// GPU `gpu`'s pool.
    pub(super) fn get(&self, gpu: u32) -> Option<&GpuMemory> {
        self.gpus.get(gpu as usize)
    }

    /// Bytes of GPU memory (of `memory` in all) kept as the swap area.
    pub(super) fn swap_area(&self, memory: u64) -> u64 {
        (memory as f64 * self.swap_fraction) as u64
    }

    /// The memory a sim GPU of `memory` bytes gives a worker: an oversubscribed vGPU's
    /// also holds its swap-area buffers.
    pub(super) fn sim_memory(&self, memory: u64, oversubscribe: bool) -> u64 {
        if oversubscribe {
            memory.saturating_add(self.swap_area(memory))
        } else {
            memory
        }
    }

    /// Resizes GPU `gpu` (of `memory` bytes)'s pool to what hard shares (`hard`) and
    /// shared objects (`shm`) leave, less the swap area.
    pub(super) fn resize(&self, gpu: u32, memory: u64, hard: u64, shm: u64) {
        let Some(m) = self.get(gpu) else { return };
        let left = memory.saturating_sub(hard).saturating_sub(shm);
        let swap = self.swap_area(memory).min(left);
        m.planner().resize(left - swap, swap);
    }

    /// Oversubscribed vGPU `id` joins GPU `gpu`'s pool (or changes its priority there).
    pub(super) fn join(&self, gpu: u32, id: u32, priority: i32) {
        self.enter(gpu, id, priority, None);
    }

    /// [`Memory::join`], with the vGPU's latest memory report when there is one.
    fn enter(&self, gpu: u32, id: u32, priority: i32, report: Option<MemReport>) {
        if let Some(m) = self.get(gpu) {
            let mut p = m.planner();
            p.join(id, priority);
            if let Some(r) = report {
                p.update(id, r.into());
            }
        }
    }

    /// vGPU `id` leaves GPU `gpu`'s pool.
    pub(super) fn leave(&self, gpu: u32, id: u32) {
        if let Some(m) = self.get(gpu) {
            m.planner().leave(id);
        }
    }

    /// An oversubscribed vGPU moving to GPU `target` joins the target's pool too, because
    /// the copy puts its resident bytes there. Caller holds the state lock.
    pub(super) fn follow(&self, rec: &VgpuRec, target: u32) {
        if rec.oversubscribe() && target != rec.gpu() {
            self.enter(target, rec.id(), rec.priority(), rec.memory_report());
        }
    }

    /// vGPU `id`'s memory report `m`, to the pools of `gpus` (every pool its memory is in).
    pub(super) fn update(&self, gpus: &[u32], id: u32, m: MemReport) {
        for gpu in gpus {
            if let Some(g) = self.get(*gpu) {
                g.planner().update(id, m.into());
            }
        }
    }

    /// Bytes resident in GPU `gpu`'s pool.
    pub(super) fn resident(&self, gpu: u32) -> u64 {
        self.get(gpu).map_or(0, |m| m.planner().resident())
    }

    /// GPU `gpu`'s pool figures.
    pub(super) fn figures(&self, gpu: u32) -> PoolFigures {
        self.get(gpu).map_or((0, 0, 0, 0), |m| {
            let p = m.planner();
            (p.capacity(), p.resident(), p.swap_area(), p.device_swap())
        })
    }
}
