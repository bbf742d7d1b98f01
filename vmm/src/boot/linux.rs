//! Booting a Linux kernel: a bzImage (protected-mode code loaded at `code32_start`, entered
//! at its 64-bit entry, `+0x200`) or an uncompressed vmlinux ELF (entered at `e_entry`,
//! `startup_64`), both in 64-bit long mode at CPL 0 with `rsi` = the zero page
//! (Documentation/arch/x86/boot.rst, "64-bit boot protocol").
//!
//! Guest physical layout in Linux mode (docs/linux-guests.md):
//!
//! | address | what |
//! | --- | --- |
//! | 0x0500 | GDT (the payload one; CS 0x08, DS/SS 0x10, TR 0x18) |
//! | 0x7000 | zero page (`boot_params`) |
//! | 0x8ff0 | boot stack top |
//! | 0x9000..0x10000 | identity page tables (4 GiB, 2 MiB pages) |
//! | 0x2_0000 | kernel command line (at most 64 KiB) |
//! | 0x10_0000 | bzImage protected-mode code; a vmlinux loads at its own `p_paddr` |
//! | top of low RAM | initrd, page aligned, below `initrd_addr_max` |
//! | 0xC000_0000..4 GiB | MMIO hole; never listed as RAM in the E820 map |

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use linux_loader::cmdline::Cmdline;
use linux_loader::configurator::linux::LinuxBootConfigurator;
use linux_loader::configurator::{BootConfigurator, BootParams};
use linux_loader::loader::bootparam::{
    boot_e820_entry, boot_params, setup_header, E820_MAX_ENTRIES_ZEROPAGE, LOADED_HIGH,
    XLF_KERNEL_64,
};
use linux_loader::loader::{bzimage::BzImage, elf::Elf, load_cmdline, KernelLoader};
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend};

use crate::layout;

/// The zero page (`boot_params`), handed to the kernel in `rsi`.
pub const ZERO_PAGE_ADDR: u64 = 0x7000;
/// Stack pointer at entry (the kernel switches to its own stack at once).
pub const BOOT_STACK: u64 = 0x8ff0;
/// The kernel command line.
pub const CMDLINE_ADDR: u64 = 0x2_0000;
/// Longest command line (with its NUL) the vmm writes.
pub const CMDLINE_MAX: usize = 0x1_0000;
/// Start of the extended BIOS data area: RAM below 640 KiB ends here.
pub const EBDA_START: u64 = 0x9_fc00;
/// First byte above the legacy ISA hole.
pub const HIMEM_START: u64 = 0x10_0000;
/// Offset of the 64-bit entry in a bzImage's protected-mode code.
pub const BZIMAGE_ENTRY_64: u64 = 0x200;
/// `type_of_loader` for a boot loader without an assigned id.
pub const LOADER_UNDEFINED: u8 = 0xff;
/// `boot_flag` and `header` magics of a setup header.
pub const BOOT_FLAG_MAGIC: u16 = 0xaa55;
pub const HDRS_MAGIC: u32 = 0x5372_6448;
/// Boot protocol version the vmm fills a vmlinux header as (2.15).
pub const BOOT_PROTOCOL: u16 = 0x020f;
/// Highest initrd address a kernel that does not say otherwise accepts (protocol 2.03+).
pub const DEFAULT_INITRD_ADDR_MAX: u64 = 0x7fff_ffff;
/// Alignment the kernel asks of its load address (a vmlinux has no header to say so).
pub const KERNEL_ALIGNMENT: u32 = 0x100_0000;
/// E820 entry types.
pub const E820_RAM: u32 = 1;

/// The command line the vmm uses when `--cmdline` is not given: the serial console, reset
/// through the i8042 (the vmm exits), no ACPI, PCI or KASLR (none exist here or help), an
/// i8042 that is only a reset line, and reboot on panic so a dead kernel ends the vmm.
pub const DEFAULT_CMDLINE: &str = "console=ttyS0 earlyprintk=serial,ttyS0,115200 reboot=k panic=-1 \
acpi=off pci=off nokaslr i8042.noaux i8042.nomux i8042.dumbkbd tsc=reliable no_timer_check rdinit=/init";

/// What kind of kernel image a file holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KernelKind {
    /// An uncompressed ELF (`vmlinux`).
    Vmlinux,
    /// A bzImage (`vmlinuz`).
    BzImage,
}

/// A Linux guest to boot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LinuxConfig {
    pub kernel: PathBuf,
    pub initrd: Option<PathBuf>,
    /// The command line before the vmm appends its `virtio_mmio.device=` entries.
    pub cmdline: String,
}

/// Why a Linux guest could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum LinuxBootError {
    /// The kernel or initrd file cannot be read.
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    /// Neither an ELF nor a bzImage.
    #[error(
        "kernel {0} is neither a vmlinux ELF nor a bzImage (no ELF magic, no \"HdrS\" at 0x202)"
    )]
    UnknownKernel(PathBuf),
    /// A bzImage without a 64-bit entry point.
    #[error("bzImage {0} has no 64-bit entry point (XLF_KERNEL_64 clear): give a 64-bit kernel")]
    Not64Bit(PathBuf),
    /// linux-loader refused the image.
    #[error("cannot load kernel {path}: {source}")]
    Load {
        path: PathBuf,
        source: linux_loader::loader::Error,
    },
    /// The kernel does not fit low RAM.
    #[error("kernel {path} ends at {end:#x}, beyond low guest RAM ({ram:#x}): give more --memory")]
    KernelTooBig { path: PathBuf, end: u64, ram: u64 },
    /// The initrd does not fit between the kernel and the top of low RAM.
    #[error("initrd of {size} bytes does not fit between the kernel (ends at {kernel_end:#x}) and {top:#x}: give more --memory")]
    InitrdTooBig {
        size: u64,
        kernel_end: u64,
        top: u64,
    },
    /// The command line is malformed or too long.
    #[error("bad kernel command line: {0}")]
    Cmdline(linux_loader::cmdline::Error),
    /// A NUL or non-ASCII character in the command line.
    #[error("the kernel command line must be ASCII without NUL characters")]
    CmdlineChars,
    /// Writing boot structures failed.
    #[error("cannot write the Linux boot structures into guest memory: {0}")]
    Write(String),
    /// More memory regions than the zero page holds (cannot happen with our layout).
    #[error("too many E820 entries ({0})")]
    TooManyE820(usize),
}

/// What the vCPU needs to enter the kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LinuxEntry {
    pub kind: KernelKind,
    /// 64-bit entry point (guest physical = virtual under the identity map).
    pub entry: u64,
    /// Where the kernel image ends.
    pub kernel_end: u64,
    /// Where the initrd went, `(address, size)`.
    pub initrd: Option<(u64, u64)>,
    /// Command line length with its NUL.
    pub cmdline_size: u32,
}

/// A virtio-mmio device to announce on the command line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MmioAnnounce {
    pub base: u64,
    pub size: u64,
    pub gsi: u32,
}

/// The E820 map for `mem_size` bytes of guest RAM laid out per `layout::ram_regions`:
/// conventional memory below the EBDA, RAM from 1 MiB to the MMIO hole, RAM above 4 GiB.
pub fn e820_map(mem_size: u64) -> Vec<boot_e820_entry> {
    let mut map = vec![boot_e820_entry {
        addr: 0,
        size: EBDA_START,
        r#type: E820_RAM,
    }];
    for (base, size) in layout::ram_regions(mem_size) {
        let start = base.max(HIMEM_START);
        let end = base + size;
        if end > start {
            map.push(boot_e820_entry {
                addr: start,
                size: end - start,
                r#type: E820_RAM,
            });
        }
    }
    map
}

/// The kernel command line: `user`, then one `virtio_mmio.device=<size>@<base>:<gsi>` per
/// device (the same windows and GSIs payloads find in BootInfo).
pub fn cmdline(user: &str, devices: &[MmioAnnounce]) -> Result<Cmdline, LinuxBootError> {
    if !user.is_ascii() || user.contains('\0') {
        return Err(LinuxBootError::CmdlineChars);
    }
    let mut c = Cmdline::try_from(user, CMDLINE_MAX).map_err(LinuxBootError::Cmdline)?;
    for d in devices {
        c.add_virtio_mmio_device(d.size, GuestAddress(d.base), d.gsi, None)
            .map_err(LinuxBootError::Cmdline)?;
    }
    Ok(c)
}

/// Where an initrd of `size` bytes goes: page aligned, as high as low RAM and the kernel's
/// `initrd_addr_max` allow, above the kernel.
pub fn initrd_addr(
    size: u64,
    low_ram_end: u64,
    initrd_addr_max: u64,
    kernel_end: u64,
) -> Result<u64, LinuxBootError> {
    let top = low_ram_end.min(initrd_addr_max.saturating_add(1));
    let too_big = || LinuxBootError::InitrdTooBig {
        size,
        kernel_end,
        top,
    };
    let addr = top.checked_sub(size).ok_or_else(too_big)? & !0xfff;
    let kernel_end_page = kernel_end.checked_add(0xfff).ok_or_else(too_big)? & !0xfff;
    if addr < kernel_end_page {
        return Err(too_big());
    }
    Ok(addr)
}

/// The zero page: the kernel's own setup header for a bzImage (or a fresh one for a
/// vmlinux), our loader fields, the command line, the initrd and the E820 map.
pub fn boot_params(
    header: Option<setup_header>,
    mem_size: u64,
    cmdline_size: u32,
    initrd: Option<(u64, u64)>,
) -> Result<boot_params, LinuxBootError> {
    let mut params = boot_params::default();
    match header {
        Some(h) => params.hdr = h,
        None => {
            params.hdr.header = HDRS_MAGIC;
            params.hdr.version = BOOT_PROTOCOL;
            params.hdr.kernel_alignment = KERNEL_ALIGNMENT;
        }
    }
    params.hdr.boot_flag = BOOT_FLAG_MAGIC;
    params.hdr.type_of_loader = LOADER_UNDEFINED;
    // Protected-mode code is loaded high; no real-mode heap (we never run real mode).
    params.hdr.loadflags |= LOADED_HIGH;
    params.hdr.cmd_line_ptr = CMDLINE_ADDR as u32;
    params.ext_cmd_line_ptr = (CMDLINE_ADDR >> 32) as u32;
    params.hdr.cmdline_size = cmdline_size;
    if let Some((addr, size)) = initrd {
        params.hdr.ramdisk_image = addr as u32;
        params.ext_ramdisk_image = (addr >> 32) as u32;
        params.hdr.ramdisk_size = size as u32;
        params.ext_ramdisk_size = (size >> 32) as u32;
    }
    let map = e820_map(mem_size);
    if map.len() > E820_MAX_ENTRIES_ZEROPAGE {
        return Err(LinuxBootError::TooManyE820(map.len()));
    }
    params.e820_entries = map.len() as u8;
    params.e820_table[..map.len()].copy_from_slice(&map);
    Ok(params)
}

/// Which kind of kernel `file` is.
pub fn kernel_kind(file: &mut File, path: &Path) -> Result<KernelKind, LinuxBootError> {
    let read = |source| LinuxBootError::Read {
        path: path.into(),
        source,
    };
    let mut head = [0u8; 0x206];
    file.seek(SeekFrom::Start(0)).map_err(read)?;
    let mut n = 0;
    while n < head.len() {
        match file.read(&mut head[n..]).map_err(read)? {
            0 => break,
            k => n += k,
        }
    }
    if n >= 4 && head[..4] == *b"\x7fELF" {
        Ok(KernelKind::Vmlinux)
    } else if n >= 0x206 && head[0x202..0x206] == HDRS_MAGIC.to_le_bytes() {
        Ok(KernelKind::BzImage)
    } else {
        Err(LinuxBootError::UnknownKernel(path.into()))
    }
}

/// Loads the kernel, the initrd and the command line, and writes the zero page.
pub fn load<M: GuestMemoryBackend>(
    mem: &M,
    config: &LinuxConfig,
    mem_size: u64,
    devices: &[MmioAnnounce],
) -> Result<LinuxEntry, LinuxBootError> {
    let path = &config.kernel;
    let read = |source| LinuxBootError::Read {
        path: path.clone(),
        source,
    };
    let low_ram_end = layout::ram_regions(mem_size)[0].1;
    let mut file = File::open(path).map_err(read)?;
    let kind = kernel_kind(&mut file, path)?;
    let load_err = |source| LinuxBootError::Load {
        path: path.clone(),
        source,
    };
    let (entry, kernel_end, header) = match kind {
        KernelKind::Vmlinux => {
            let r = Elf::load(mem, None, &mut file, Some(GuestAddress(HIMEM_START)))
                .map_err(load_err)?;
            (r.kernel_load.0, r.kernel_end, None)
        }
        KernelKind::BzImage => {
            let r = BzImage::load(mem, None, &mut file, Some(GuestAddress(HIMEM_START)))
                .map_err(load_err)?;
            let hdr = r.setup_header.unwrap_or_default();
            if hdr.xloadflags & XLF_KERNEL_64 == 0 {
                return Err(LinuxBootError::Not64Bit(path.clone()));
            }
            // The decompressor works in place up to init_size bytes from the load address.
            let end = r.kernel_end.max(r.kernel_load.0 + u64::from(hdr.init_size));
            (r.kernel_load.0 + BZIMAGE_ENTRY_64, end, Some(hdr))
        }
    };
    if kernel_end > low_ram_end {
        return Err(LinuxBootError::KernelTooBig {
            path: path.clone(),
            end: kernel_end,
            ram: low_ram_end,
        });
    }

    let initrd = match &config.initrd {
        None => None,
        Some(p) => {
            let bytes = std::fs::read(p).map_err(|source| LinuxBootError::Read {
                path: p.clone(),
                source,
            })?;
            let max = header
                .map(|h| u64::from(h.initrd_addr_max))
                .filter(|&m| m != 0)
                .unwrap_or(DEFAULT_INITRD_ADDR_MAX);
            let addr = initrd_addr(bytes.len() as u64, low_ram_end, max, kernel_end)?;
            mem.write_slice(&bytes, GuestAddress(addr))
                .map_err(|e| LinuxBootError::Write(e.to_string()))?;
            Some((addr, bytes.len() as u64))
        }
    };

    let cmdline = cmdline(&config.cmdline, devices)?;
    let cmdline_size = cmdline
        .as_cstring()
        .map_err(LinuxBootError::Cmdline)?
        .as_bytes_with_nul()
        .len() as u32;
    load_cmdline(mem, GuestAddress(CMDLINE_ADDR), &cmdline)
        .map_err(|e| LinuxBootError::Write(e.to_string()))?;
    let params = boot_params(header, mem_size, cmdline_size, initrd)?;
    LinuxBootConfigurator::write_bootparams(
        &BootParams::new(&params, GuestAddress(ZERO_PAGE_ADDR)),
        mem,
    )
    .map_err(|e| LinuxBootError::Write(e.to_string()))?;
    tracing::info!(
        ?kind,
        entry = format_args!("{entry:#x}"),
        kernel_end = format_args!("{kernel_end:#x}"),
        ?initrd,
        cmdline = %cmdline.as_cstring().map(|c| c.to_string_lossy().into_owned()).unwrap_or_default(),
        "Linux kernel loaded"
    );
    Ok(LinuxEntry {
        kind,
        entry,
        kernel_end,
        initrd,
        cmdline_size,
    })
}

#[cfg(test)]
#[path = "linux_tests.rs"]
mod tests;
