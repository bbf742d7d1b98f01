//! What the driver needs from its environment: register access and DMA memory. Payloads
//! implement it over identity-mapped MMIO and heap; the Linux userspace transport (feature
//! `std`, later) over /dev/mem or UIO and hugepages.

use core::ptr::NonNull;

use crate::error::Result;

/// Memory the device can reach: a CPU pointer and the address to give the device.
#[derive(Debug)]
pub struct DmaRegion {
    virt: NonNull<u8>,
    phys: u64,
    len: usize,
}

impl DmaRegion {
    /// # Safety
    /// `virt` must be valid for reads and writes of `len` bytes for as long as the region
    /// (or whatever it is handed to) lives, not aliased by other Rust references, and the
    /// device must see the same bytes at `phys..phys + len`.
    pub unsafe fn new(virt: NonNull<u8>, phys: u64, len: usize) -> Self {
        DmaRegion { virt, phys, len }
    }

    pub fn virt(&self) -> NonNull<u8> {
        self.virt
    }

    pub fn phys(&self) -> u64 {
        self.phys
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The region as a byte slice (for filling request buffers).
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: DmaRegion::new's contract: virt is valid and unaliased for len bytes, and
        // &mut self keeps this the only live view.
        unsafe { core::slice::from_raw_parts_mut(self.virt.as_ptr(), self.len) }
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: as for as_mut_slice; &self forbids concurrent mutation through us.
        unsafe { core::slice::from_raw_parts(self.virt.as_ptr(), self.len) }
    }
}

/// Register and DMA access for one virtio-mmio device. Offsets are from the device's
/// register base; accesses must use the width of the register (virtio 1.x, 4.2.2.2).
pub trait Transport {
    fn read8(&self, offset: usize) -> u8;
    fn read16(&self, offset: usize) -> u16;
    fn read32(&self, offset: usize) -> u32;
    fn write8(&self, offset: usize, value: u8);
    fn write16(&self, offset: usize, value: u16);
    fn write32(&self, offset: usize, value: u32);

    /// Zeroed memory the device can reach, `align` a power of two.
    fn dma_alloc(&self, len: usize, align: usize) -> Result<DmaRegion>;

    /// Returns memory from [`Transport::dma_alloc`].
    ///
    /// # Safety
    /// The device must no longer use the region (its queue reset or never activated).
    unsafe fn dma_free(&self, region: DmaRegion);

    /// The device address of a buffer the caller owns (identity in payloads).
    fn virt_to_phys(&self, ptr: *const u8) -> Result<u64>;
}
