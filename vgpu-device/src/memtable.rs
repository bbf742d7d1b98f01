//! What the worker accepts as guest memory (vhost-user `SET_MEM_TABLE`; memory slots,
//! `ADD_MEM_REG`, are never offered and refused before they get here: `front.rs`).
//!
//! Every region must be a file sealed against shrinking (`F_SEAL_SHRINK`, read back with
//! `fcntl(F_GET_SEALS)`: in practice a memfd, hugetlb memfds included) that covers the
//! whole region. The worker touches guest pages from its queue threads and its copy
//! engine: a file that could shrink under the mapping would crash it with SIGBUS, and a file
//! whose page faults block (FUSE, a file another process serves through userfaultfd) could
//! hang it. Neither can be sealed, so both are refused along with unsealed memfds.

use std::io;
use std::os::fd::AsRawFd;

use vm_memory::{GuestMemoryBackend, GuestMemoryRegion};

use crate::chain::GuestMem;

/// Why a frontend's memory table was refused.
#[derive(Debug, thiserror::Error)]
pub enum MemTableError {
    /// The region is anonymous memory (no file to check).
    #[error("guest memory region at {gpa:#x} has no file behind it; offer a memfd sealed with F_SEAL_SHRINK")]
    NoFile {
        /// Guest-physical start of the region.
        gpa: u64,
    },
    /// The file cannot carry seals (not a memfd: a regular file, FUSE, a device, ...).
    #[error("guest memory region at {gpa:#x} is not a sealable memfd (F_GET_SEALS: {source}); offer a memfd sealed with F_SEAL_SHRINK")]
    NotMemfd {
        /// Guest-physical start of the region.
        gpa: u64,
        /// What fcntl said.
        source: io::Error,
    },
    /// A memfd without `F_SEAL_SHRINK`.
    #[error("guest memory region at {gpa:#x} is a memfd that may still shrink (seals {seals:#x}); add F_SEAL_SHRINK with fcntl(F_ADD_SEALS) before offering it")]
    NotSealed {
        /// Guest-physical start of the region.
        gpa: u64,
        /// The seals it has.
        seals: i32,
    },
    /// The region maps bytes past the end of its file.
    #[error("guest memory region at {gpa:#x} maps file bytes {offset:#x}..{end:#x}, but the file holds {size:#x}")]
    BeyondFile {
        /// Guest-physical start of the region.
        gpa: u64,
        /// File offset of the region.
        offset: u64,
        /// File offset of its end.
        end: u64,
        /// File size.
        size: u64,
    },
    /// The file's size could not be read.
    #[error("guest memory region at {gpa:#x}: cannot read its file's size: {source}")]
    Stat {
        /// Guest-physical start of the region.
        gpa: u64,
        /// What fstat said.
        source: io::Error,
    },
}

/// Checks every region of `mem` (see the module comment).
pub fn check_memory_table(mem: &GuestMem) -> Result<(), MemTableError> {
    for region in GuestMemoryBackend::iter(mem) {
        let gpa = region.start_addr().0;
        let fo = region.file_offset().ok_or(MemTableError::NoFile { gpa })?;
        let file = fo.file();
        // SAFETY: F_GET_SEALS on a descriptor the region holds open; no memory is passed.
        let seals = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GET_SEALS) };
        if seals < 0 {
            return Err(MemTableError::NotMemfd {
                gpa,
                source: io::Error::last_os_error(),
            });
        }
        if seals & libc::F_SEAL_SHRINK == 0 {
            return Err(MemTableError::NotSealed { gpa, seals });
        }
        let size = file
            .metadata()
            .map_err(|source| MemTableError::Stat { gpa, source })?
            .len();
        let offset = fo.start();
        let end = offset.saturating_add(region.len());
        if end > size {
            return Err(MemTableError::BeyondFile {
                gpa,
                offset,
                end,
                size,
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::fs::File;
    use std::os::fd::FromRawFd;

    use vm_memory::{FileOffset, GuestAddress};

    use super::*;

    /// A memfd of `len` bytes with `seals` added.
    pub(crate) fn memfd(len: u64, seals: i32) -> File {
        // SAFETY: a valid NUL-terminated name and valid flags.
        let fd = unsafe {
            libc::memfd_create(
                c"memtable-test".as_ptr(),
                libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
            )
        };
        assert!(fd >= 0, "memfd_create");
        // SAFETY: a fresh descriptor nothing else owns.
        let file = unsafe { File::from_raw_fd(fd) };
        file.set_len(len).expect("size");
        if seals != 0 {
            // SAFETY: F_ADD_SEALS on our own memfd with valid bits.
            assert_eq!(unsafe { libc::fcntl(fd, libc::F_ADD_SEALS, seals) }, 0);
        }
        file
    }

    fn table(file: File, len: usize) -> GuestMem {
        GuestMem::from_ranges_with_files([(GuestAddress(0), len, Some(FileOffset::new(file, 0)))])
            .expect("map")
    }

    #[test]
    fn a_sealed_memfd_is_accepted() {
        let mem = table(memfd(1 << 20, libc::F_SEAL_SHRINK), 1 << 20);
        check_memory_table(&mem).expect("accepted");
    }

    #[test]
    fn unsealed_memfds_plain_files_and_anonymous_memory_are_refused() {
        let mem = table(memfd(1 << 20, 0), 1 << 20);
        let e = check_memory_table(&mem).unwrap_err();
        assert!(matches!(e, MemTableError::NotSealed { .. }), "{e}");
        assert!(e.to_string().contains("F_SEAL_SHRINK"), "{e}");

        let grow_only = table(memfd(1 << 20, libc::F_SEAL_GROW), 1 << 20);
        assert!(matches!(
            check_memory_table(&grow_only),
            Err(MemTableError::NotSealed { .. })
        ));

        let path = std::env::temp_dir().join(format!("vgpu-memtable-{}", std::process::id()));
        let plain = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .expect("plain file");
        std::fs::remove_file(&path).ok();
        plain.set_len(1 << 20).expect("size");
        let e = check_memory_table(&table(plain, 1 << 20)).unwrap_err();
        assert!(matches!(e, MemTableError::NotMemfd { .. }), "{e}");

        let anon = GuestMem::from_ranges(&[(GuestAddress(0), 1 << 20)]).expect("ram");
        assert!(matches!(
            check_memory_table(&anon),
            Err(MemTableError::NoFile { .. })
        ));
    }
}
