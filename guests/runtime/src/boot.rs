//! The BootInfo block the vmm leaves at 0x7000 (docs/payload-abi.md).

/// "VGPUBOOT", little endian.
pub const BOOT_MAGIC: u64 = 0x544f_4f42_5550_4756;
pub const BOOT_VERSION: u32 = 1;
/// The vmm reserves 0x8000..0x9000 for the argument string.
pub const MAX_ARG_LEN: u64 = 0x1000;
/// RAM above this is either the MMIO hole or beyond the 4 GiB identity map.
pub const IDENTITY_MAP_LIMIT: u64 = 0xC000_0000;

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct MemRegion {
    pub base: u64,
    pub size: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct MmioDevice {
    pub base: u64,
    pub size: u64,
    pub gsi: u32,
    pub _pad: u32,
}

#[repr(C)]
#[derive(Debug)]
pub struct BootInfo {
    pub magic: u64,
    pub version: u32,
    pub vcpus: u32,
    pub tsc_khz: u64,
    pub mem_regions: [MemRegion; 2],
    pub arg_addr: u64,
    pub arg_len: u64,
    pub mmio_count: u32,
    pub _pad: u32,
    pub mmio: [MmioDevice; 8],
}

impl BootInfo {
    pub fn is_valid(&self) -> bool {
        self.magic == BOOT_MAGIC && self.version == BOOT_VERSION
    }

    /// Total guest RAM in bytes, over all regions.
    pub fn mem_bytes(&self) -> u64 {
        self.mem_regions
            .iter()
            .fold(0u64, |acc, r| acc.saturating_add(r.size))
    }

    /// The virtio-mmio devices the vmm reports, in `--vgpu` order.
    pub fn mmio_devices(&self) -> &[MmioDevice] {
        let n = (self.mmio_count as usize).min(self.mmio.len());
        &self.mmio[..n]
    }

    /// The payload argument string; empty when the vmm passed none or it is not UTF-8.
    pub fn args(&self) -> &'static str {
        let len = self.arg_len.min(MAX_ARG_LEN) as usize;
        if len == 0 || self.arg_addr == 0 {
            return "";
        }
        // SAFETY: the vmm reserves arg_addr..arg_addr + arg_len (within 0x8000..0x9000, and
        // the length is capped to that page) in identity-mapped RAM for the argument and
        // nothing in the guest writes there, so a shared 'static slice is sound.
        let bytes = unsafe { core::slice::from_raw_parts(self.arg_addr as *const u8, len) };
        core::str::from_utf8(bytes).unwrap_or("")
    }

    /// The RAM region that holds `addr`, clipped to what the identity map covers.
    pub fn usable_region_containing(&self, addr: u64) -> Option<(u64, u64)> {
        self.mem_regions.iter().find_map(|r| {
            let end = r.base.saturating_add(r.size).min(IDENTITY_MAP_LIMIT);
            (r.size != 0 && r.base <= addr && addr < end).then_some((r.base, end))
        })
    }
}
