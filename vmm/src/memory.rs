//! Guest RAM: one memfd, mapped as one or two regions around the MMIO hole, so a vhost-user
//! backend can map exactly the same pages.

use std::ffi::CString;
use std::fs::File;
use std::os::fd::FromRawFd;

use vm_memory::{FileOffset, GuestAddress, GuestMemoryMmap};

use crate::layout;

/// Why guest RAM could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum MemoryError {
    /// Guest memory is smaller than the minimum the boot layout needs.
    #[error("guest memory of {0} bytes is too small: give --memory at least 4M")]
    TooSmall(u64),
    /// Guest memory larger than the host has.
    #[error("guest memory of {requested} bytes exceeds this host's {host} bytes of RAM: give a smaller --memory")]
    BeyondHost { requested: u64, host: u64 },
    /// memfd_create failed.
    #[error("cannot create the guest memory file (memfd_create): {0}")]
    Memfd(std::io::Error),
    /// ftruncate failed.
    #[error("cannot size the guest memory file to {size} bytes: {source}")]
    Truncate { size: u64, source: std::io::Error },
    /// mmap of the regions failed.
    #[error("cannot map guest memory: {0}")]
    Map(vm_memory::mmap::FromRangesError),
}

/// Host RAM in bytes, from sysconf.
pub fn host_memory() -> u64 {
    // SAFETY: sysconf has no memory-safety preconditions.
    let pages = unsafe { libc::sysconf(libc::_SC_PHYS_PAGES) };
    // SAFETY: as above.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    (pages.max(0) as u64).saturating_mul(page.max(0) as u64)
}

/// Creates `size` bytes of memfd-backed guest RAM laid out per `layout::ram_regions`.
pub fn create_guest_memory(size: u64) -> Result<GuestMemoryMmap, MemoryError> {
    if size < layout::MIN_MEMORY {
        return Err(MemoryError::TooSmall(size));
    }
    let host = host_memory();
    if size > host {
        return Err(MemoryError::BeyondHost {
            requested: size,
            host,
        });
    }
    let file = memfd("vgpu-guest-ram")?;
    file.set_len(size)
        .map_err(|source| MemoryError::Truncate { size, source })?;
    let mut offset = 0u64;
    let mut ranges = Vec::new();
    for (base, len) in layout::ram_regions(size) {
        let fd = file.try_clone().map_err(MemoryError::Memfd)?;
        ranges.push((
            GuestAddress(base),
            len as usize,
            Some(FileOffset::new(fd, offset)),
        ));
        offset += len;
    }
    GuestMemoryMmap::from_ranges_with_files(ranges).map_err(MemoryError::Map)
}

fn memfd(name: &str) -> Result<File, MemoryError> {
    let cname = CString::new(name).map_err(|e| MemoryError::Memfd(std::io::Error::other(e)))?;
    // SAFETY: cname is a valid NUL-terminated string; the flags are valid for memfd_create.
    let fd = unsafe { libc::memfd_create(cname.as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(MemoryError::Memfd(std::io::Error::last_os_error()));
    }
    // SAFETY: fd was just returned by memfd_create and is owned by nobody else.
    Ok(unsafe { File::from_raw_fd(fd) })
}

#[cfg(test)]
mod tests {
    use vm_memory::{Bytes, GuestMemoryBackend, GuestMemoryRegion};

    use super::*;

    #[test]
    fn rejects_tiny_and_huge() {
        assert!(matches!(
            create_guest_memory(0),
            Err(MemoryError::TooSmall(0))
        ));
        assert!(matches!(
            create_guest_memory(u64::MAX / 2),
            Err(MemoryError::BeyondHost { .. })
        ));
    }

    #[test]
    fn regions_are_file_backed_and_writable() {
        let mem = create_guest_memory(16 << 20).unwrap();
        assert_eq!(mem.num_regions(), 1);
        let region = mem.iter().next().unwrap();
        assert!(region.file_offset().is_some());
        mem.write_obj(0xdead_beef_u32, GuestAddress(0x1000))
            .unwrap();
        assert_eq!(
            mem.read_obj::<u32>(GuestAddress(0x1000)).unwrap(),
            0xdead_beef
        );
    }
}
