//! Guest RAM: one memfd, mapped as one or two regions around the MMIO hole, so a vhost-user
//! backend can map exactly the same pages. The memfd is sealed against shrinking and
//! growing (the vGPU worker maps only sealed memfds: a file that could shrink under its
//! mapping would crash it with SIGBUS).

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
    /// F_ADD_SEALS failed.
    #[error("cannot seal the guest memory file against resizing (F_ADD_SEALS): {0}")]
    Seal(std::io::Error),
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
    seal_size(&file)?;
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

pub(crate) fn memfd(name: &str) -> Result<File, MemoryError> {
    let cname = CString::new(name).map_err(|e| MemoryError::Memfd(std::io::Error::other(e)))?;
    // SAFETY: cname is a valid NUL-terminated string; the flags are valid for memfd_create.
    let fd =
        unsafe { libc::memfd_create(cname.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
    if fd < 0 {
        return Err(MemoryError::Memfd(std::io::Error::last_os_error()));
    }
    // SAFETY: fd was just returned by memfd_create and is owned by nobody else.
    Ok(unsafe { File::from_raw_fd(fd) })
}

/// Seals the memfd's size: it can neither shrink nor grow from now on.
pub(crate) fn seal_size(file: &File) -> Result<(), MemoryError> {
    use std::os::fd::AsRawFd;
    let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW;
    // SAFETY: F_ADD_SEALS on our own open memfd with valid seal bits; no memory is passed.
    if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_ADD_SEALS, seals) } != 0 {
        return Err(MemoryError::Seal(std::io::Error::last_os_error()));
    }
    Ok(())
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
        let file = region.file_offset().unwrap().file();
        // SAFETY: F_GET_SEALS on an open descriptor; no memory is passed.
        let seals =
            unsafe { libc::fcntl(std::os::fd::AsRawFd::as_raw_fd(file), libc::F_GET_SEALS) };
        let want = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW;
        assert_eq!(seals & want, want, "guest RAM memfd seals {seals:#x}");
        mem.write_obj(0xdead_beef_u32, GuestAddress(0x1000))
            .unwrap();
        assert_eq!(
            mem.read_obj::<u32>(GuestAddress(0x1000)).unwrap(),
            0xdead_beef
        );
    }
}
