//! Owned memory mappings: a window of a file (`/dev/mem`, a UIO device, or a fake) and
//! anonymous hugepage memory.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::ptr::NonNull;

use super::LinuxError;

/// One `mmap`, unmapped on drop.
#[derive(Debug)]
pub struct Mapping {
    base: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain shared memory owned by this value; access goes through raw
// pointers whose users (register accessors, DMA regions) synchronise themselves.
unsafe impl Send for Mapping {}
// SAFETY: as above; &Mapping only hands out the base pointer.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps `len` bytes of `path` from `offset` (a multiple of the page size), shared and
    /// read/write.
    pub fn file(path: &Path, offset: u64, len: usize) -> Result<Self, LinuxError> {
        Self::file_near(path, offset, len, 0)
    }

    /// [`Mapping::file`] at `hint` when that range is free (the kernel picks another place
    /// otherwise; 0: wherever the kernel likes).
    pub fn file_near(path: &Path, offset: u64, len: usize, hint: u64) -> Result<Self, LinuxError> {
        let file = File::options()
            .read(true)
            .write(true)
            .open(path)
            .map_err(|source| LinuxError::Open {
                path: path.into(),
                source,
            })?;
        let off = libc::off_t::try_from(offset).map_err(|_| LinuxError::BadOffset(offset))?;
        if len == 0 || offset % page_size() != 0 {
            return Err(LinuxError::BadOffset(offset));
        }
        // SAFETY: a fresh mapping chosen by the kernel (a hint without MAP_FIXED never
        // replaces anything); fd is open for the call.
        let p = unsafe {
            libc::mmap(
                hint as usize as *mut libc::c_void,
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                off,
            )
        };
        Self::from_mmap(p, len).map_err(|source| LinuxError::Map {
            path: path.into(),
            offset,
            source,
        })
    }

    /// `len` bytes of anonymous memory backed by hugepages, populated and locked so their
    /// physical addresses stay put.
    pub fn hugepages(len: usize) -> Result<Self, LinuxError> {
        // SAFETY: a fresh anonymous mapping chosen by the kernel.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE
                    | libc::MAP_ANONYMOUS
                    | libc::MAP_HUGETLB
                    | libc::MAP_POPULATE
                    | libc::MAP_LOCKED,
                -1,
                0,
            )
        };
        Self::from_mmap(p, len).map_err(LinuxError::Hugepages)
    }

    fn from_mmap(p: *mut libc::c_void, len: usize) -> std::io::Result<Self> {
        if p == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        let base = NonNull::new(p.cast::<u8>())
            .ok_or_else(|| std::io::Error::other("mmap returned NULL"))?;
        Ok(Mapping { base, len })
    }

    pub fn base(&self) -> NonNull<u8> {
        self.base
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether `ptr..ptr + len` lies inside the mapping; its offset if so.
    pub fn offset_of(&self, ptr: *const u8, len: usize) -> Option<usize> {
        let off = (ptr as usize).checked_sub(self.base.as_ptr() as usize)?;
        (off.checked_add(len)? <= self.len).then_some(off)
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: base/len describe a mapping this value created and nobody else unmaps.
        unsafe {
            libc::munmap(self.base.as_ptr().cast(), self.len);
        }
    }
}

/// The system page size.
pub fn page_size() -> u64 {
    // SAFETY: sysconf has no memory-safety preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(p).ok().filter(|&p| p > 0).unwrap_or(4096)
}
