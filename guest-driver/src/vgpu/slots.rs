//! Per-request DMA memory. Each in-flight request owns one fixed slot holding its header
//! descriptor (header + arguments), its response, and room for small data the driver
//! supplies itself (a `DeviceInfo`, a module or function name), so those requests need no
//! caller buffers and no allocator.

use crate::error::{Error, Result};
use crate::transport::DmaRegion;

/// Header + arguments; a `LAUNCH` with 32 kernel arguments and 16 dependencies is 648.
pub const HEADER_MAX: usize = 768;
const HEADER_OFF: usize = 0;
pub const RESPONSE_OFF: usize = 768;
pub const INFO_OFF: usize = 832;
pub const SCRATCH_OFF: usize = 1024;
/// A kernel name (at most `vgpu_proto::MAX_SYMBOL_LEN`, 4 KiB) and the parameter layout
/// and attributes the device answers after it.
pub const SCRATCH_MAX: usize = 5120;
pub const SLOT_SIZE: usize = 6144;

pub(crate) struct Slots {
    mem: DmaRegion,
    count: u16,
}

impl Slots {
    pub(crate) fn new(mem: DmaRegion, count: u16) -> Result<Self> {
        if mem.len() < usize::from(count) * SLOT_SIZE {
            return Err(Error::OutOfDmaMemory);
        }
        Ok(Slots { mem, count })
    }

    pub(crate) fn count(&self) -> u16 {
        self.count
    }

    fn range(&self, slot: u16, off: usize, len: usize) -> Result<core::ops::Range<usize>> {
        if slot >= self.count || off + len > SLOT_SIZE {
            return Err(Error::UnknownTicket);
        }
        let start = usize::from(slot) * SLOT_SIZE + off;
        Ok(start..start + len)
    }

    /// Device address of `off` in `slot`.
    pub(crate) fn phys(&self, slot: u16, off: usize) -> Result<u64> {
        let r = self.range(slot, off, 0)?;
        Ok(self.mem.phys() + r.start as u64)
    }

    /// The header area, for encoding a request into it.
    pub(crate) fn header_mut(&mut self, slot: u16) -> Result<&mut [u8]> {
        let r = self.range(slot, HEADER_OFF, HEADER_MAX)?;
        self.mem
            .as_mut_slice()
            .get_mut(r)
            .ok_or(Error::UnknownTicket)
    }

    /// The scratch area, for data the driver hands the device (names).
    pub(crate) fn scratch_mut(&mut self, slot: u16) -> Result<&mut [u8]> {
        let r = self.range(slot, SCRATCH_OFF, SCRATCH_MAX)?;
        self.mem
            .as_mut_slice()
            .get_mut(r)
            .ok_or(Error::UnknownTicket)
    }

    /// Copies device-written bytes out with volatile reads: the device wrote them behind
    /// the compiler's back (the used-ring Acquire fence orders these reads after it).
    pub(crate) fn read(&self, slot: u16, off: usize, out: &mut [u8]) -> Result<()> {
        let r = self.range(slot, off, out.len())?;
        let base = self.mem.virt().as_ptr();
        for (i, b) in r.zip(out.iter_mut()) {
            // SAFETY: i is inside the region (range() checked it against count * SLOT_SIZE,
            // which Slots::new checked against the region length); the region is valid
            // for reads per DmaRegion's contract.
            *b = unsafe { core::ptr::read_volatile(base.add(i)) };
        }
        Ok(())
    }

    /// Hints the CPU to bring in the line at `off` of `slot` (nothing when out of range).
    pub(crate) fn prefetch(&self, slot: u16, off: usize) {
        if let Ok(r) = self.range(slot, off, 0) {
            crate::prefetch(self.mem.virt().as_ptr().wrapping_add(r.start), false);
        }
    }

    /// Takes for writing the first `lines` cache lines at `off` of `slot`.
    pub(crate) fn prefetch_write(&self, slot: u16, off: usize, lines: usize) {
        if let Ok(r) = self.range(slot, off, 0) {
            let base = self.mem.virt().as_ptr().wrapping_add(r.start);
            for i in 0..lines {
                crate::prefetch(base.wrapping_add(i * 64), true);
            }
        }
    }

    /// Clears an area the device will write, so stale bytes are never taken for an answer.
    pub(crate) fn clear(&mut self, slot: u16, off: usize, len: usize) -> Result<()> {
        let r = self.range(slot, off, len)?;
        self.mem
            .as_mut_slice()
            .get_mut(r)
            .ok_or(Error::UnknownTicket)?
            .fill(0);
        Ok(())
    }
}
