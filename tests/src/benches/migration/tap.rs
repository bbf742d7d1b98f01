//! A sim GPU that records when bytes arrive (for the timeline's bytes-over-time line).

use std::sync::{Arc, Mutex};
use std::time::Instant;

use vgpu_backend::sync::lock;
use vgpu_backend::{Allocated, Backend, Relocatable, SimConfig, SimGpu};
use vm_memory::VolatileSlice;

use super::{fail, Params, CHUNK};

/// A [`SimGpu`] that logs every incoming copy (in pieces of [`CHUNK`]) and every
/// allocation placed with `alloc_at`.
pub(super) struct Tap {
    gpu: SimGpu,
    log: Mutex<Vec<(Instant, u64)>>,
    placed: Mutex<Vec<(Instant, u64)>>,
}

impl Tap {
    pub(super) fn new(p: Params, memory: u64) -> Arc<Self> {
        let gpu = SimGpu::new(SimConfig {
            name: "migbench".into(),
            memory,
            copy_bandwidth: p.copy_bandwidth,
            speed: p.speed,
            threads: 1,
            ..SimConfig::default()
        })
        .unwrap_or_else(|e| fail(format!("sim GPU: {e}")));
        Arc::new(Self {
            gpu,
            log: Mutex::new(Vec::new()),
            placed: Mutex::new(Vec::new()),
        })
    }

    pub(super) fn log(&self) -> Vec<(Instant, u64)> {
        lock(&self.log).clone()
    }

    pub(super) fn placed(&self) -> Vec<(Instant, u64)> {
        lock(&self.placed).clone()
    }
}

impl Backend for Tap {
    fn copy_htod(&self, dst: u64, src: &VolatileSlice<'_>) -> vgpu_backend::Result<u64> {
        let len = src.len() as u64;
        let mut off = 0;
        while off < len {
            let n = CHUNK.min(len - off);
            let piece = src
                .subslice(off as usize, n as usize)
                .map_err(|e| vgpu_backend::BackendError::Device(format!("slice: {e}")))?;
            self.gpu.copy_htod(dst + off, &piece)?;
            lock(&self.log).push((Instant::now(), n));
            off += n;
        }
        Ok(len)
    }
    fn relocation(&self) -> Option<&dyn Relocatable> {
        Some(self)
    }

    vgpu_backend::forward_backend!(gpu:
        info, memory_usage, alloc, free, check_range, copy_dtoh, copy_dtod, memset, launch,
        synchronize, modules, paging, shared_memory, host_memory, virtual_memory
    );
}

/// The sim's relocation, logging every allocation placed.
impl Relocatable for Tap {
    fn alloc_at(&self, addr: u64, size: u64) -> vgpu_backend::Result<Allocated> {
        let a = self.gpu.alloc_at(addr, size)?;
        lock(&self.placed).push((Instant::now(), size));
        Ok(a)
    }
    fn copy_to_peer(&self, peer: &dyn Backend, addr: u64, len: u64) -> vgpu_backend::Result<u64> {
        self.gpu.copy_to_peer(peer, addr, len)
    }
}
