//! Virtual to physical addresses through `/proc/self/pagemap`: one little-endian u64 per
//! virtual page, at offset `vaddr / page_size * 8`; bit 63 = present, bits 0..=54 = the
//! page frame number (zero when the reader lacks CAP_SYS_ADMIN).

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

use super::LinuxError;

const PRESENT: u64 = 1 << 63;
const SWAPPED: u64 = 1 << 62;
const PFN_MASK: u64 = (1 << 55) - 1;

/// An open pagemap file (the real one or a fake laid out the same way).
#[derive(Debug)]
pub struct Pagemap {
    file: File,
    page_size: u64,
}

impl Pagemap {
    /// Opens `path` for pages of `page_size` bytes (a power of two).
    pub fn open(path: &Path, page_size: u64) -> Result<Self, LinuxError> {
        if !page_size.is_power_of_two() {
            return Err(LinuxError::BadPageSize(page_size));
        }
        let file = File::open(path).map_err(|source| LinuxError::Open {
            path: path.into(),
            source,
        })?;
        Ok(Pagemap { file, page_size })
    }

    /// The raw entry of the page holding `vaddr`.
    pub fn entry(&self, vaddr: u64) -> Result<u64, LinuxError> {
        let offset = (vaddr / self.page_size)
            .checked_mul(8)
            .ok_or(LinuxError::NotMapped(vaddr))?;
        let mut buf = [0u8; 8];
        self.file
            .read_exact_at(&mut buf, offset)
            .map_err(|source| LinuxError::PagemapRead { vaddr, source })?;
        Ok(u64::from_le_bytes(buf))
    }

    /// The physical address of `vaddr`.
    pub fn translate(&self, vaddr: u64) -> Result<u64, LinuxError> {
        let entry = self.entry(vaddr)?;
        decode(entry, vaddr, self.page_size)
    }
}

/// Decodes one pagemap entry for `vaddr`.
pub fn decode(entry: u64, vaddr: u64, page_size: u64) -> Result<u64, LinuxError> {
    if entry & PRESENT == 0 {
        return Err(if entry & SWAPPED != 0 {
            LinuxError::Swapped(vaddr)
        } else {
            LinuxError::NotPresent(vaddr)
        });
    }
    let pfn = entry & PFN_MASK;
    if pfn == 0 {
        return Err(LinuxError::NoPfn);
    }
    // One entry per base page, hugepage or not.
    pfn.checked_mul(page_size)
        .and_then(|base| base.checked_add(vaddr & (page_size - 1)))
        .ok_or(LinuxError::NotMapped(vaddr))
}
