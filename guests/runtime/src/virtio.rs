//! The guest-driver [`Transport`] for payloads: registers of a virtio-mmio device from
//! BootInfo, DMA memory from the heap. Guest RAM is identity mapped, so device addresses
//! are the pointers themselves.

use core::alloc::Layout;
use core::ptr::NonNull;

use guest_driver::{DmaRegion, Error, Result, Transport};

use crate::boot::{BootInfo, IDENTITY_MAP_LIMIT};
use crate::io::{mmio_read32, mmio_read8, mmio_write32, mmio_write8};

#[derive(Clone, Copy, Debug)]
pub struct MmioTransport {
    base: u64,
    size: usize,
}

impl MmioTransport {
    /// The `index`th virtio-mmio device the vmm listed in BootInfo.
    pub fn from_boot(boot: &BootInfo, index: usize) -> Option<Self> {
        let dev = boot.mmio_devices().get(index)?;
        // SAFETY: the vmm's BootInfo is the ABI contract: it lists only its own device
        // windows, inside the identity-mapped MMIO hole.
        Some(unsafe { Self::new(dev.base, dev.size as usize) })
    }

    /// # Safety
    /// `base..base + size` must be a virtio-mmio register window inside the identity map.
    pub unsafe fn new(base: u64, size: usize) -> Self {
        MmioTransport { base, size }
    }

    pub fn base(&self) -> u64 {
        self.base
    }

    /// The register address for an access of `width` bytes at `offset`, if inside the
    /// window and naturally aligned.
    fn reg(&self, offset: usize, width: usize) -> Option<u64> {
        let end = offset.checked_add(width)?;
        (end <= self.size && offset % width == 0).then(|| self.base + offset as u64)
    }
}

impl Transport for MmioTransport {
    fn read8(&self, offset: usize) -> u8 {
        // SAFETY: reg() keeps the access inside the device window (MmioTransport::new).
        self.reg(offset, 1)
            .map_or(u8::MAX, |a| unsafe { mmio_read8(a) })
    }

    fn read16(&self, offset: usize) -> u16 {
        // SAFETY: reg() keeps the access inside the window and 2-byte aligned.
        self.reg(offset, 2).map_or(u16::MAX, |a| unsafe {
            core::ptr::read_volatile(a as *const u16)
        })
    }

    fn read32(&self, offset: usize) -> u32 {
        // SAFETY: reg() keeps the access inside the window and 4-byte aligned.
        self.reg(offset, 4)
            .map_or(u32::MAX, |a| unsafe { mmio_read32(a) })
    }

    fn write8(&self, offset: usize, value: u8) {
        if let Some(a) = self.reg(offset, 1) {
            // SAFETY: inside the device window; the driver intends the register write.
            unsafe { mmio_write8(a, value) }
        }
    }

    fn write16(&self, offset: usize, value: u16) {
        if let Some(a) = self.reg(offset, 2) {
            // SAFETY: inside the device window and aligned; the write is intended.
            unsafe { core::ptr::write_volatile(a as *mut u16, value) }
        }
    }

    fn write32(&self, offset: usize, value: u32) {
        if let Some(a) = self.reg(offset, 4) {
            // SAFETY: inside the device window and aligned; the write is intended.
            unsafe { mmio_write32(a, value) }
        }
    }

    fn dma_alloc(&self, len: usize, align: usize) -> Result<DmaRegion> {
        dma_alloc(len, align)
    }

    unsafe fn dma_free(&self, _region: DmaRegion) {
        // The bump heap never reuses memory, so there is nothing to give back.
    }

    fn virt_to_phys(&self, ptr: *const u8) -> Result<u64> {
        virt_to_phys(ptr)
    }
}

/// Zeroed, identity-mapped memory from the heap, usable by any device.
pub fn dma_alloc(len: usize, align: usize) -> Result<DmaRegion> {
    let layout = Layout::from_size_align(len.max(1), align).map_err(|_| Error::OutOfDmaMemory)?;
    // SAFETY: the layout has a non-zero size.
    let ptr =
        NonNull::new(unsafe { alloc::alloc::alloc_zeroed(layout) }).ok_or(Error::OutOfDmaMemory)?;
    // SAFETY: freshly allocated and never freed (bump heap), len bytes, identity mapped so
    // the device sees it at the same address.
    Ok(unsafe { DmaRegion::new(ptr, ptr.as_ptr() as u64, len) })
}

/// Identity: guest virtual = guest physical below 3 GiB in payloads.
pub fn virt_to_phys(ptr: *const u8) -> Result<u64> {
    let addr = ptr as u64;
    if addr < IDENTITY_MAP_LIMIT {
        Ok(addr)
    } else {
        Err(Error::AddressNotTranslatable)
    }
}
