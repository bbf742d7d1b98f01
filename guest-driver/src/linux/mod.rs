//! The Linux userspace transport (feature `std`): a vGPU driven from a Linux process, no
//! kernel driver needed.
//!
//! - Registers: the device's virtio-mmio window mapped from `/dev/mem` at its physical
//!   address (the kernel must not have bound its own virtio_mmio driver to it), or map 0 of
//!   a UIO device.
//! - DMA memory: 2 MiB hugepages (anonymous, `MAP_HUGETLB | MAP_LOCKED`) whose physical
//!   addresses come from `/proc/self/pagemap` (root needed: without CAP_SYS_ADMIN the
//!   kernel reports frame 0), or one region kept from the kernel with `memmap=SIZE$ADDR`
//!   and mapped through `/dev/mem`.
//!
//! Every path is injectable ([`Paths`]), so tests run against a regular file laid out
//! like `/dev/mem` (offset = physical address) and one laid out like a pagemap.
//!
//! Only memory from [`Transport::dma_alloc`] is physically contiguous, so
//! `virt_to_phys` answers for it alone: copy through a `DmaRegion`, not an arbitrary slice.

mod dma;
mod mapping;
pub mod pagemap;
pub mod selftest;

#[cfg(test)]
mod tests;

use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, MutexGuard};

pub use dma::{Chunk, Pool};
pub use mapping::{page_size, Mapping};
pub use pagemap::Pagemap;

use crate::error::{Error, Result};
use crate::spec::MMIO_WINDOW;
use crate::transport::{DmaRegion, Transport};

/// One hugepage: the unit of hugepage DMA memory.
pub const HUGEPAGE_SIZE: usize = 2 << 20;

/// Why the Linux transport could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum LinuxError {
    /// A file cannot be opened.
    #[error(
        "cannot open {path}: {source} (root is needed for /dev/mem and pagemap frame numbers)"
    )]
    Open {
        path: PathBuf,
        source: std::io::Error,
    },
    /// An offset or length that is not page aligned, zero, or out of range.
    #[error("offset {0:#x} is not a page-aligned, representable file offset")]
    BadOffset(u64),
    /// mmap of a file failed.
    #[error("cannot map {path} at {offset:#x}: {source}")]
    Map {
        path: PathBuf,
        offset: u64,
        source: std::io::Error,
    },
    /// No hugepages could be mapped.
    #[error("cannot map a 2 MiB hugepage: {0}; reserve some with `echo 8 > /proc/sys/vm/nr_hugepages`, or use a memmap= region")]
    Hugepages(std::io::Error),
    /// A page size that is not a power of two.
    #[error("page size {0} is not a power of two")]
    BadPageSize(u64),
    /// An address the pagemap cannot describe.
    #[error("virtual address {0:#x} has no pagemap entry")]
    NotMapped(u64),
    /// Reading the pagemap failed (short file, I/O error).
    #[error("cannot read the pagemap entry of {vaddr:#x}: {source}")]
    PagemapRead { vaddr: u64, source: std::io::Error },
    /// The page is not in memory.
    #[error("virtual address {0:#x} is not present in memory")]
    NotPresent(u64),
    /// The page is swapped out.
    #[error("virtual address {0:#x} is swapped out")]
    Swapped(u64),
    /// The kernel hid the frame number.
    #[error(
        "the pagemap shows frame 0: reading physical addresses needs CAP_SYS_ADMIN (run as root)"
    )]
    NoPfn,
    /// A hugepage that is not physically contiguous (cannot happen with real hugepages).
    #[error("the hugepage at {0:#x} is not physically contiguous")]
    NotContiguous(u64),
    /// The kernel command line announces no virtio-mmio device.
    #[error("no virtio_mmio.device= on the kernel command line: give the register address")]
    NoDevice,
    /// A malformed `virtio_mmio.device=` value.
    #[error("cannot parse virtio_mmio.device={0:?} (want SIZE@ADDR:IRQ)")]
    BadDeviceSpec(String),
}

/// Where the transport finds its files.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Paths {
    /// Physical memory: `/dev/mem`.
    pub mem: PathBuf,
    /// This process's pagemap: `/proc/self/pagemap`.
    pub pagemap: PathBuf,
    /// The kernel command line: `/proc/cmdline`.
    pub cmdline: PathBuf,
}

impl Default for Paths {
    fn default() -> Self {
        Paths {
            mem: "/dev/mem".into(),
            pagemap: "/proc/self/pagemap".into(),
            cmdline: "/proc/cmdline".into(),
        }
    }
}

/// Where the device registers are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Registers {
    /// The virtio-mmio window at this physical address, through [`Paths::mem`].
    DevMem { base: u64 },
    /// Map 0 of a UIO device (`/dev/uioN`), whose offset 0 is the window.
    Uio { path: PathBuf },
}

/// Where DMA memory comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DmaSource {
    /// This many 2 MiB hugepages, translated through [`Paths::pagemap`].
    Hugepages { count: usize },
    /// A physical region kept from the kernel (`memmap=LEN$PHYS`), through [`Paths::mem`].
    Reserved { phys: u64, len: usize },
}

/// A virtio-mmio device from the kernel command line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MmioDevice {
    pub base: u64,
    pub size: u64,
    pub irq: u32,
}

/// Parses every `virtio_mmio.device=SIZE@ADDR:IRQ[:ID]` of a kernel command line.
pub fn cmdline_devices(cmdline: &str) -> std::result::Result<Vec<MmioDevice>, LinuxError> {
    cmdline
        .split_ascii_whitespace()
        .filter_map(|w| w.strip_prefix("virtio_mmio.device="))
        .map(|v| parse_device(v).ok_or_else(|| LinuxError::BadDeviceSpec(v.into())))
        .collect()
}

fn parse_device(v: &str) -> Option<MmioDevice> {
    let (size, rest) = v.split_once('@')?;
    let mut parts = rest.split(':');
    let base = parse_u64(parts.next()?)?;
    let irq = parts.next()?.parse().ok()?;
    let (digits, shift) = match size.char_indices().last()? {
        (i, 'K' | 'k') => (&size[..i], 10),
        (i, 'M' | 'm') => (&size[..i], 20),
        (i, 'G' | 'g') => (&size[..i], 30),
        _ => (size, 0),
    };
    let size = parse_u64(digits)?.checked_mul(1 << shift)?;
    Some(MmioDevice { base, size, irq })
}

/// A decimal or `0x` hexadecimal number.
pub fn parse_u64(s: &str) -> Option<u64> {
    match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => s.parse().ok(),
    }
}

struct Inner {
    regs: Mapping,
    /// Offset of the window inside `regs` (the base need not be page aligned).
    reg_off: usize,
    pool: Mutex<Pool>,
}

/// Registers and DMA memory of one vGPU, from a Linux process. Clones share both.
#[derive(Clone)]
pub struct LinuxTransport {
    inner: Arc<Inner>,
}

impl core::fmt::Debug for LinuxTransport {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("LinuxTransport")
            .field("regs", &self.inner.regs.base())
            .finish_non_exhaustive()
    }
}

impl LinuxTransport {
    /// Maps the registers and sets up the DMA memory.
    pub fn open(
        paths: &Paths,
        regs: &Registers,
        dma: &DmaSource,
    ) -> std::result::Result<Self, LinuxError> {
        let page = page_size();
        let (file, base): (&Path, u64) = match regs {
            Registers::DevMem { base } => (&paths.mem, *base),
            Registers::Uio { path } => (path, 0),
        };
        let aligned = base - base % page;
        let reg_off = (base - aligned) as usize;
        let regs = Mapping::file(file, aligned, reg_off + MMIO_WINDOW)?;
        let mut pool = Pool::default();
        match dma {
            DmaSource::Reserved { phys, len } => {
                pool.add(Chunk::new(Mapping::file(&paths.mem, *phys, *len)?, *phys));
            }
            DmaSource::Hugepages { count } => {
                let pagemap = Pagemap::open(&paths.pagemap, page)?;
                for _ in 0..*count {
                    let map = Mapping::hugepages(HUGEPAGE_SIZE)?;
                    let v = map.base().as_ptr() as u64;
                    let phys = pagemap.translate(v)?;
                    // A hugepage is one frame; check the last 4 KiB page agrees anyway.
                    let last = v + HUGEPAGE_SIZE as u64 - page;
                    if pagemap.translate(last)? != phys + HUGEPAGE_SIZE as u64 - page {
                        return Err(LinuxError::NotContiguous(v));
                    }
                    pool.add(Chunk::new(map, phys));
                }
            }
        }
        tracing::debug!(?regs, chunks = pool.chunks().len(), "Linux transport open");
        Ok(LinuxTransport {
            inner: Arc::new(Inner {
                regs,
                reg_off,
                pool: Mutex::new(pool),
            }),
        })
    }

    /// The first virtio-mmio device the kernel command line at `paths.cmdline` announces.
    pub fn first_device(paths: &Paths) -> std::result::Result<MmioDevice, LinuxError> {
        let text = std::fs::read_to_string(&paths.cmdline).map_err(|source| LinuxError::Open {
            path: paths.cmdline.clone(),
            source,
        })?;
        cmdline_devices(&text)?
            .into_iter()
            .next()
            .ok_or(LinuxError::NoDevice)
    }

    fn pool(&self) -> MutexGuard<'_, Pool> {
        self.inner.pool.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// DMA bytes not handed out, over all chunks.
    pub fn dma_free_bytes(&self) -> usize {
        self.pool().chunks().iter().map(Chunk::free_bytes).sum()
    }

    /// The register address for an access of `width` bytes at `offset`, if inside the
    /// window and naturally aligned.
    fn reg(&self, offset: usize, width: usize) -> Option<*mut u8> {
        let end = offset.checked_add(width)?;
        if end > MMIO_WINDOW || offset % width != 0 {
            tracing::debug!(offset, width, "register access outside the window refused");
            return None;
        }
        // SAFETY: reg_off + MMIO_WINDOW bytes are mapped (open), and end <= MMIO_WINDOW.
        Some(unsafe {
            self.inner
                .regs
                .base()
                .as_ptr()
                .add(self.inner.reg_off + offset)
        })
    }
}

impl Transport for LinuxTransport {
    fn read8(&self, offset: usize) -> u8 {
        // SAFETY: reg() keeps the access inside the mapped window.
        self.reg(offset, 1)
            .map_or(u8::MAX, |p| unsafe { p.read_volatile() })
    }

    fn read16(&self, offset: usize) -> u16 {
        // SAFETY: inside the mapped window and 2-byte aligned (the mapping is page aligned).
        self.reg(offset, 2)
            .map_or(u16::MAX, |p| unsafe { p.cast::<u16>().read_volatile() })
    }

    fn read32(&self, offset: usize) -> u32 {
        // SAFETY: inside the mapped window and 4-byte aligned.
        self.reg(offset, 4)
            .map_or(u32::MAX, |p| unsafe { p.cast::<u32>().read_volatile() })
    }

    fn write8(&self, offset: usize, value: u8) {
        if let Some(p) = self.reg(offset, 1) {
            // SAFETY: inside the mapped window; the driver intends the register write.
            unsafe { p.write_volatile(value) }
        }
    }

    fn write16(&self, offset: usize, value: u16) {
        if let Some(p) = self.reg(offset, 2) {
            // SAFETY: inside the mapped window and aligned; the write is intended.
            unsafe { p.cast::<u16>().write_volatile(value) }
        }
    }

    fn write32(&self, offset: usize, value: u32) {
        if let Some(p) = self.reg(offset, 4) {
            // SAFETY: inside the mapped window and aligned; the write is intended.
            unsafe { p.cast::<u32>().write_volatile(value) }
        }
    }

    fn dma_alloc(&self, len: usize, align: usize) -> Result<DmaRegion> {
        let (ptr, phys): (NonNull<u8>, u64) =
            self.pool().alloc(len, align).ok_or(Error::OutOfDmaMemory)?;
        // SAFETY: the pool handed this range out to us alone until dma_free; it lies in a
        // mapping the transport keeps alive (every clone holds the Arc) and is physically
        // contiguous from `phys`.
        Ok(unsafe { DmaRegion::new(ptr, phys, len) })
    }

    unsafe fn dma_free(&self, region: DmaRegion) {
        if !self.pool().free(region.virt().as_ptr()) {
            tracing::warn!(
                phys = region.phys(),
                "dma_free of memory this transport did not allocate"
            );
        }
    }

    fn virt_to_phys(&self, ptr: *const u8) -> Result<u64> {
        self.pool()
            .phys(ptr, 1)
            .ok_or(Error::AddressNotTranslatable)
    }
}
