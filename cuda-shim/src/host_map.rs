//! Pinned host memory the GPU reaches at its host address (a process vGPU whose device
//! offers `HOST_MAP`, docs/cuda-api.md): every region of the DMA pool, where
//! `cuMemAllocHost` and `cuMemHostAlloc` allocate, is mapped by the worker at this
//! process's address of it, so a pool pointer is also a device pointer, as pinned host
//! memory is under CUDA's unified addressing. Memory registered with `cuMemHostRegister`
//! is not in the pool and stays host-only.

use crate::driver::Driver;
use crate::transport::AnyTransport;

/// The pool regions the library asked the worker to map, and which of them it did.
#[derive(Debug, Default)]
pub struct HostMapped {
    /// Regions asked for (by their device address), mapped or not.
    asked: Vec<u64>,
    /// Mapped ranges of this process's addresses: (first address, bytes).
    mapped: Vec<(u64, u64)>,
}

impl HostMapped {
    /// Whether `[ptr, ptr + len)` lies inside one mapped region.
    pub fn covers(&self, ptr: u64, len: u64) -> bool {
        let Some(end) = ptr.checked_add(len) else {
            return false;
        };
        self.mapped
            .iter()
            .any(|&(base, size)| ptr >= base && end <= base + size)
    }

    /// Whether any pool memory is mapped (`CAN_MAP_HOST_MEMORY`).
    pub fn any(&self) -> bool {
        !self.mapped.is_empty()
    }
}

impl Driver {
    /// Asks the worker to map each pool region not asked for yet (at open, and after the
    /// pool grew). A region the worker cannot map (its address is taken there, or the
    /// device lacks `HOST_MAP`) stays host-only; nothing fails.
    pub fn map_pool(&mut self) {
        if self.info.features & vgpu_proto::features::HOST_MAP == 0 {
            return;
        }
        let AnyTransport::Process(p) = &self.t else {
            return;
        };
        let regions = p.region_ranges();
        let t = self.t.clone();
        for (gpa, hva, len) in regions {
            if self.host_mapped.asked.contains(&gpa) {
                continue;
            }
            self.host_mapped.asked.push(gpa);
            let answer = match self.queue(0) {
                Ok(mut q) => q.call(&t, |s| s.host_map(gpa, len, hva)),
                Err(e) => Err(e),
            };
            match answer {
                Ok(()) => {
                    tracing::debug!(
                        addr = format_args!("{hva:#x}"),
                        len,
                        "pinned host memory reachable by the GPU"
                    );
                    self.host_mapped.mapped.push((hva, len));
                }
                Err(code) => tracing::info!(
                    addr = format_args!("{hva:#x}"),
                    len,
                    code,
                    "the worker cannot map this pinned host memory for the GPU; it stays host-only"
                ),
            }
        }
    }

    /// Whether `[ptr, ptr + len)` is pinned host memory the GPU reaches at `ptr`.
    pub fn device_mapped(&self, ptr: u64, len: u64) -> bool {
        self.host_mapped.covers(ptr, len)
    }
}
