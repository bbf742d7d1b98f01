//! The controller's register window (BAR0) and doorbells, behind a small trait so the
//! same register programming drives the emulated controller, a real controller through
//! VFIO, and the register model in tests.

use crate::error::Result;
use crate::memory::DmaRegion;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

/// 32/64-bit register access to a controller's BAR0.
pub trait Bar: Send + Sync {
    fn read32(&self, offset: u64) -> u32;
    fn write32(&self, offset: u64, value: u32);

    fn read64(&self, offset: u64) -> u64 {
        self.read32(offset) as u64 | ((self.read32(offset + 4) as u64) << 32)
    }
    fn write64(&self, offset: u64, value: u64) {
        self.write32(offset, value as u32);
        self.write32(offset + 4, (value >> 32) as u32);
    }

    /// A handle that writes the doorbell register at `offset` directly, without going
    /// through the trait, so thousands of submitters can ring it cheaply.
    fn doorbell(&self, offset: u64) -> Result<Doorbell>;
}

/// How the controller reaches host memory: identity for the emulated controller, the
/// IOMMU (VFIO_IOMMU_MAP_DMA) for a real one.
pub trait DmaMapper: Send + Sync {
    /// Make `region` reachable by the device at `region.iova()`.
    fn map(&self, region: &Arc<DmaRegion>) -> Result<()>;

    /// Stop the device reaching `region` (it must have no transfer in flight). The default
    /// keeps the mapping: a real controller's IOMMU mapping then lives until the container
    /// closes.
    fn unmap(&self, _region: &Arc<DmaRegion>) -> Result<()> {
        Ok(())
    }
}

/// Wakes a controller that sleeps between doorbell writes (the emulated one); a real
/// device needs none.
pub trait DoorbellListener: Send + Sync {
    fn rung(&self);
}

/// One doorbell register.
#[derive(Clone)]
pub struct Doorbell {
    reg: *const AtomicU32,
    listener: Option<Arc<dyn DoorbellListener>>,
    _keep: Arc<dyn Send + Sync>,
}

// SAFETY: `reg` points into memory kept alive by `_keep` and is only accessed atomically.
unsafe impl Send for Doorbell {}
// SAFETY: as above.
unsafe impl Sync for Doorbell {}

impl Doorbell {
    /// # Safety
    /// `reg` must be 4-byte aligned and stay valid (MMIO or memory) while `keep` lives.
    pub unsafe fn new(
        reg: *const AtomicU32,
        listener: Option<Arc<dyn DoorbellListener>>,
        keep: Arc<dyn Send + Sync>,
    ) -> Self {
        Doorbell {
            reg,
            listener,
            _keep: keep,
        }
    }

    /// Write the new tail (SQ) or head (CQ). Release orders the queue entries before it.
    pub fn ring(&self, value: u32) {
        // SAFETY: `reg` is valid while `_keep` lives (constructor contract); an aligned
        // 32-bit atomic store is a single MMIO write on x86-64 and aarch64.
        unsafe { (*self.reg).store(value, Ordering::Release) };
        if let Some(l) = &self.listener {
            l.rung();
        }
    }
}
