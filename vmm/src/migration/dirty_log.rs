//! The dirty log the vhost-user backends write while a migration pre-copies RAM
//! (vhost-user `SET_LOG_BASE` with protocol feature `LOG_SHMFD`, feature `LOG_ALL`): one bit
//! per 4 KiB guest page, page `gpa / 4096` at bit `page % 8` of byte `page / 8`, in a
//! shared memfd. A backend marks every page it writes in guest RAM (used rings, responses,
//! device-to-guest copies); KVM's dirty log does not see those writes.
//!
//! The memfd is shared with the worker, which the guest may have taken over: the worker may
//! write any bit anywhere in it. The vmm sizes and seals it (no shrinking, so its mapping
//! never faults), reads only the bits of pages inside its own memory slots, and takes
//! nothing else from it.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};

use vhost::VhostUserDirtyLogRegion;

use super::ram::PAGE;
use crate::memory::MemoryError;
use crate::vm::Slot;

/// Why the dirty log could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum DirtyLogError {
    #[error(transparent)]
    File(#[from] MemoryError),
    #[error("cannot size the dirty log file to {len} bytes: {source}")]
    Size { len: u64, source: std::io::Error },
    #[error("cannot map the dirty log ({len} bytes): {source}")]
    Map { len: u64, source: std::io::Error },
    #[error("the guest memory ends at {0:#x}: too large for a dirty log")]
    TooLarge(u64),
}

/// A dirty log covering guest physical addresses `[0, end)`.
pub struct DirtyLog {
    file: File,
    map: NonNull<AtomicU64>,
    /// 64-bit words mapped.
    words: usize,
}

// SAFETY: the mapping is owned by this value and only reached through atomic operations,
// so it may move to and be shared between threads.
unsafe impl Send for DirtyLog {}
// SAFETY: as above: every access to the mapping is an atomic operation.
unsafe impl Sync for DirtyLog {}

impl std::fmt::Debug for DirtyLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DirtyLog")
            .field("bytes", &self.bytes())
            .finish()
    }
}

impl DirtyLog {
    /// A zeroed log for guest memory that ends below `end`, in a sealed memfd.
    pub fn new(end: u64) -> Result<Self, DirtyLogError> {
        let pages = end.div_ceil(PAGE);
        // Whole pages of the log, so the mapping is exactly the file.
        let len = pages
            .div_ceil(8)
            .checked_next_multiple_of(PAGE)
            .filter(|l| *l > 0 && usize::try_from(*l).is_ok())
            .ok_or(DirtyLogError::TooLarge(end))?;
        let file = crate::memory::memfd("vgpu-dirty-log")?;
        file.set_len(len)
            .map_err(|source| DirtyLogError::Size { len, source })?;
        crate::memory::seal_size(&file)?;
        let n = usize::try_from(len).map_err(|_| DirtyLogError::TooLarge(end))?;
        // SAFETY: a fresh shared mapping of our own memfd of exactly `n` bytes, whose size
        // is sealed (nobody can shrink it under the mapping); no fixed address.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                n,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(DirtyLogError::Map {
                len,
                source: std::io::Error::last_os_error(),
            });
        }
        let map = NonNull::new(p.cast::<AtomicU64>()).ok_or(DirtyLogError::Map {
            len,
            source: std::io::Error::other("mmap returned null"),
        })?;
        Ok(Self {
            file,
            map,
            words: n / 8,
        })
    }

    /// Bytes of the log.
    pub fn bytes(&self) -> u64 {
        self.words as u64 * 8
    }

    /// What `SET_LOG_BASE` sends (the descriptor stays owned by this log).
    pub fn region(&self) -> VhostUserDirtyLogRegion {
        VhostUserDirtyLogRegion {
            mmap_size: self.bytes(),
            mmap_offset: 0,
            mmap_handle: self.file.as_raw_fd(),
        }
    }

    fn words(&self) -> &[AtomicU64] {
        // SAFETY: the mapping holds `words` page-aligned u64 words for the life of `self`;
        // AtomicU64 has the layout of u64, and every access is atomic (the worker writes
        // it concurrently, with atomic operations of its own).
        unsafe { std::slice::from_raw_parts(self.map.as_ptr(), self.words) }
    }

    /// Reads and clears the whole log at once (each word swapped with zero, so a bit a
    /// backend sets meanwhile lands either in this read or in the next) and returns one
    /// bitmap per slot in KVM's layout (bit `i` of word `i / 64`: the slot's page `i`).
    /// Bits outside the slots are dropped.
    pub fn take(&self, slots: &[Slot]) -> Vec<Vec<u64>> {
        let all: Vec<u64> = self
            .words()
            .iter()
            .map(|w| {
                if w.load(Ordering::Relaxed) == 0 {
                    0
                } else {
                    w.swap(0, Ordering::AcqRel)
                }
            })
            .collect();
        slots.iter().map(|s| slot_bits(&all, s)).collect()
    }
}

/// The bits of `all` (one per page from address 0) that belong to `slot`, from the slot's
/// first page; words past the end of `all` read as clean.
fn slot_bits(all: &[u64], slot: &Slot) -> Vec<u64> {
    let pages = slot.len / PAGE;
    let first = slot.gpa / PAGE;
    let word = |i: u64| {
        usize::try_from(i)
            .ok()
            .and_then(|i| all.get(i))
            .copied()
            .unwrap_or(0)
    };
    (0..pages.div_ceil(64))
        .map(|k| {
            let lo = first + k * 64;
            let (w, sh) = (lo / 64, lo % 64);
            let mut v = word(w) >> sh;
            if sh != 0 {
                v |= word(w + 1) << (64 - sh);
            }
            let left = pages - k * 64;
            if left < 64 {
                v &= (1u64 << left) - 1;
            }
            v
        })
        .collect()
}

impl Drop for DirtyLog {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, of `words * 8` bytes, unmapped once; no
        // reference into it outlives `self`.
        unsafe { libc::munmap(self.map.as_ptr().cast(), self.words * 8) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slot(gpa: u64, len: u64) -> Slot {
        Slot {
            slot: 0,
            gpa,
            len,
            hva: 0,
        }
    }

    #[test]
    fn bits_map_to_slot_pages_and_reads_clear_them() {
        let log = DirtyLog::new(8 << 20).expect("log");
        assert_eq!(log.bytes(), PAGE);
        // Page 3 and the slot at 1 MiB's pages 0 and 255 (absolute 256 and 511).
        log.words()[0].fetch_or(1 << 3, Ordering::Relaxed);
        log.words()[4].fetch_or(1, Ordering::Relaxed);
        log.words()[7].fetch_or(1 << 63, Ordering::Relaxed);
        // Beyond the slots: never reported.
        log.words()[100].fetch_or(u64::MAX, Ordering::Relaxed);
        let slots = [slot(0, 1 << 20), slot(1 << 20, 1 << 20)];
        let maps = log.take(&slots);
        assert_eq!(maps[0][0], 1 << 3);
        assert_eq!(maps[1][0], 1);
        assert_eq!(maps[1][3], 1 << 63);
        assert_eq!(super::super::ram::count_dirty(&maps), 3);
        assert_eq!(super::super::ram::count_dirty(&log.take(&slots)), 0);
    }

    #[test]
    fn unaligned_slots_and_short_tails() {
        // A slot starting at page 3 with 5 pages: absolute pages 3..8.
        let all = vec![0b1111_1000u64 | 1 << 9, 0];
        assert_eq!(slot_bits(&all, &slot(3 * PAGE, 5 * PAGE)), vec![0b1_1111]);
        // Starting at page 60, 10 pages: the bits straddle two words.
        let all = vec![1 << 60 | 1 << 63, 1 << 5 | 1 << 6];
        assert_eq!(
            slot_bits(&all, &slot(60 * PAGE, 10 * PAGE)),
            vec![1 | 1 << 3 | 1 << 9]
        );
        // A slot past the log's end reads clean.
        assert_eq!(slot_bits(&all, &slot(1 << 30, 64 * PAGE)), vec![0]);
    }
}
