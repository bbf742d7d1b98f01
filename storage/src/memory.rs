//! DMA-able memory supplied by the caller. Queues, identify pages, cache lines and I/O
//! buffers all live in a [`DmaRegion`]: host memory in the sim, pinned host memory mapped
//! to the GPU (and through the IOMMU to the NVMe device) on the CUDA path. The region is
//! only ever touched through raw pointers, volatile or atomic accesses, because a device
//! may write it at any time.

use crate::error::{Error, Result};
use crate::nvme::PAGE_SIZE;
use std::alloc::Layout;
use std::any::Any;
use std::ptr::NonNull;
use std::sync::Arc;

enum Owner {
    Host(Layout),
    External(#[allow(dead_code)] Box<dyn Any + Send + Sync>),
}

/// A contiguous region in both the CPU's and the device's address space.
pub struct DmaRegion {
    ptr: NonNull<u8>,
    len: usize,
    iova: u64,
    owner: Owner,
}

// SAFETY: the region is plain memory accessed only through raw pointers with atomic or
// volatile operations; the owner keeps it alive and is itself Send + Sync.
unsafe impl Send for DmaRegion {}
// SAFETY: as above; no `&`/`&mut` references to the bytes are ever handed out.
unsafe impl Sync for DmaRegion {}

impl DmaRegion {
    /// Page-aligned, zeroed host memory whose device address is its virtual address (how the
    /// emulated controller and the sim address it).
    pub fn host(len: usize) -> Result<Arc<Self>> {
        let len = len.max(1).div_ceil(PAGE_SIZE) * PAGE_SIZE;
        let layout = Layout::from_size_align(len, PAGE_SIZE)
            .map_err(|e| Error::InvalidArgument(format!("DMA region of {len} bytes: {e}")))?;
        // SAFETY: layout has a non-zero size.
        let raw = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).ok_or_else(|| {
            Error::io(
                format!("allocating a {len}-byte DMA region"),
                std::io::Error::from(std::io::ErrorKind::OutOfMemory),
            )
        })?;
        Ok(Arc::new(DmaRegion {
            ptr,
            len,
            iova: raw as u64,
            owner: Owner::Host(layout),
        }))
    }

    /// Wrap memory someone else allocated and mapped (pinned host memory registered with
    /// CUDA, a VFIO DMA mapping).
    ///
    /// # Safety
    /// `ptr..ptr+len` must stay valid for reads and writes while `keep` lives, and the
    /// device must reach it at `iova..iova+len`.
    pub unsafe fn from_raw(
        ptr: NonNull<u8>,
        len: usize,
        iova: u64,
        keep: Box<dyn Any + Send + Sync>,
    ) -> Arc<Self> {
        Arc::new(DmaRegion {
            ptr,
            len,
            iova,
            owner: Owner::External(keep),
        })
    }

    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    pub fn iova(&self) -> u64 {
        self.iova
    }
}

impl Drop for DmaRegion {
    fn drop(&mut self) {
        if let Owner::Host(layout) = self.owner {
            // SAFETY: allocated in `host` with exactly this layout, freed once.
            unsafe { std::alloc::dealloc(self.ptr.as_ptr(), layout) };
        }
    }
}

/// A byte range of a region; keeps the region alive.
#[derive(Clone)]
pub struct DmaSlice {
    region: Arc<DmaRegion>,
    offset: usize,
    len: usize,
}

impl DmaSlice {
    pub fn whole(region: Arc<DmaRegion>) -> Self {
        let len = region.len();
        DmaSlice {
            region,
            offset: 0,
            len,
        }
    }

    pub fn new(region: Arc<DmaRegion>, offset: usize, len: usize) -> Result<Self> {
        match offset.checked_add(len) {
            Some(end) if end <= region.len() => Ok(DmaSlice {
                region,
                offset,
                len,
            }),
            _ => Err(Error::InvalidArgument(format!(
                "slice {offset}+{len} outside a {}-byte DMA region",
                region.len()
            ))),
        }
    }

    /// A sub-range of this slice.
    pub fn slice(&self, offset: usize, len: usize) -> Result<Self> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => {
                Self::new(self.region.clone(), self.offset + offset, len)
            }
            _ => Err(Error::InvalidArgument(format!(
                "sub-slice {offset}+{len} outside a {}-byte slice",
                self.len
            ))),
        }
    }

    pub fn region(&self) -> &Arc<DmaRegion> {
        &self.region
    }
    pub fn as_ptr(&self) -> *mut u8 {
        // SAFETY: offset <= region length, checked at construction.
        unsafe { self.region.as_ptr().add(self.offset) }
    }
    pub fn iova(&self) -> u64 {
        self.region.iova() + self.offset as u64
    }
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Copy the slice's bytes out (for callers that want an owned buffer).
    pub fn read_to(&self, dst: &mut [u8]) {
        let n = dst.len().min(self.len);
        // SAFETY: `n` bytes are inside the slice; a device write racing this copy can only
        // produce stale bytes, the completion protocol orders the ones we rely on.
        unsafe { std::ptr::copy_nonoverlapping(self.as_ptr(), dst.as_mut_ptr(), n) };
    }

    /// Copy bytes in (before a write command).
    pub fn write_from(&self, src: &[u8]) {
        let n = src.len().min(self.len);
        // SAFETY: `n` bytes are inside the slice.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), self.as_ptr(), n) };
    }
}
