//! Memory layout of a split virtqueue and volatile access to it (virtio 1.x, 2.7).
//!
//! One contiguous region holds, in order: the descriptor table (16-byte entries, 16-byte
//! aligned), the driver ("available") ring with `used_event` at its tail, and the device
//! ("used") ring, 4-byte aligned, with `avail_event` at its tail. Every index is masked
//! with `size - 1` here, so no caller mistake or device-written value can address memory
//! outside the region.

use core::ptr::NonNull;

const DESC_SIZE: usize = 16;
/// flags + idx
const RING_HEADER: usize = 4;
const USED_ELEM_SIZE: usize = 8;

/// Offsets of the three parts for a queue of `size` entries, and the total length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    pub avail: usize,
    pub used: usize,
    pub total: usize,
}

impl Layout {
    pub const fn new(size: u16) -> Self {
        let n = size as usize;
        let avail = DESC_SIZE * n;
        // ring[n] then used_event
        let avail_len = RING_HEADER + 2 * n + 2;
        let used = (avail + avail_len + 3) & !3;
        // ring[n] then avail_event
        let used_len = RING_HEADER + USED_ELEM_SIZE * n + 2;
        Layout {
            avail,
            used,
            total: used + used_len,
        }
    }
}

/// Raw view of the ring memory. Shared with the device, so every access is volatile; the
/// ordering between them is the queue's job (fences in queue.rs).
pub(crate) struct Ring {
    base: NonNull<u8>,
    mask: usize,
    layout: Layout,
}

impl Ring {
    /// # Safety
    /// `base` must be valid for reads and writes of `Layout::new(size).total` bytes,
    /// 16-byte aligned, for the life of the Ring; `size` a non-zero power of two.
    pub(crate) unsafe fn new(base: NonNull<u8>, size: u16) -> Self {
        Ring {
            base,
            mask: usize::from(size) - 1,
            layout: Layout::new(size),
        }
    }

    fn at<T>(&self, offset: usize) -> *mut T {
        // Offsets come from `layout` and masked indices only, so they stay in the region.
        self.base.as_ptr().wrapping_add(offset).cast()
    }

    fn write<T>(&self, offset: usize, value: T) {
        // SAFETY: Ring::new's contract makes the region valid; every offset passed here is
        // a layout field plus a masked index times the element size, inside the region and
        // aligned for T (region 16-aligned, parts aligned as Layout lays them out).
        unsafe { core::ptr::write_volatile(self.at::<T>(offset), value) }
    }

    fn read<T>(&self, offset: usize) -> T {
        // SAFETY: as for write.
        unsafe { core::ptr::read_volatile(self.at::<T>(offset)) }
    }

    pub(crate) fn zero(&self) {
        // SAFETY: the whole region is valid for writes (Ring::new's contract).
        unsafe { core::ptr::write_bytes(self.base.as_ptr(), 0, self.layout.total) }
    }

    pub(crate) fn write_desc(&self, index: u16, addr: u64, len: u32, flags: u16, next: u16) {
        let off = (usize::from(index) & self.mask) * DESC_SIZE;
        self.write(off, addr);
        self.write(off + 8, len);
        self.write(off + 12, flags);
        self.write(off + 14, next);
    }

    pub(crate) fn set_avail_flags(&self, flags: u16) {
        self.write(self.layout.avail, flags);
    }

    pub(crate) fn set_avail_idx(&self, idx: u16) {
        self.write(self.layout.avail + 2, idx);
    }

    /// `idx` is the free-running avail index; the slot is `idx mod size`.
    pub(crate) fn set_avail_entry(&self, idx: u16, head: u16) {
        let slot = usize::from(idx) & self.mask;
        self.write(self.layout.avail + RING_HEADER + 2 * slot, head);
    }

    pub(crate) fn set_used_event(&self, idx: u16) {
        let off = self.layout.avail + RING_HEADER + 2 * (self.mask + 1);
        self.write(off, idx);
    }

    pub(crate) fn used_flags(&self) -> u16 {
        self.read(self.layout.used)
    }

    pub(crate) fn used_idx(&self) -> u16 {
        self.read(self.layout.used + 2)
    }

    /// (id, len) of the used entry for free-running used index `idx`.
    pub(crate) fn used_entry(&self, idx: u16) -> (u32, u32) {
        let off = self.layout.used + RING_HEADER + USED_ELEM_SIZE * (usize::from(idx) & self.mask);
        (self.read(off), self.read(off + 4))
    }

    /// Hints the CPU to bring in the used entry for free-running used index `idx`.
    pub(crate) fn prefetch_used_entry(&self, idx: u16) {
        let off = self.layout.used + RING_HEADER + USED_ELEM_SIZE * (usize::from(idx) & self.mask);
        crate::prefetch(self.at::<u8>(off), false);
    }

    /// Takes for writing the lines of descriptor `index` and of the available entry for
    /// free-running index `idx`: where the next request is likely to go.
    pub(crate) fn prefetch_post(&self, index: u16, idx: u16) {
        crate::prefetch(
            self.at::<u8>((usize::from(index) & self.mask) * DESC_SIZE),
            true,
        );
        let slot = usize::from(idx) & self.mask;
        crate::prefetch(
            self.at::<u8>(self.layout.avail + RING_HEADER + 2 * slot),
            true,
        );
    }

    pub(crate) fn avail_event(&self) -> u16 {
        let off = self.layout.used + RING_HEADER + USED_ELEM_SIZE * (self.mask + 1);
        self.read(off)
    }

    pub(crate) fn layout(&self) -> Layout {
        self.layout
    }
}
