//! The `BootInfo` block a payload finds at `rdi` (docs/payload-abi.md).

use vm_memory::{ByteValued, Bytes, GuestAddress, GuestMemoryBackend};

use crate::layout;

pub const BOOT_MAGIC: u64 = 0x544f_4f42_5550_4756; // "VGPUBOOT"
pub const BOOT_VERSION: u32 = 1;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemRegion {
    pub base: u64,
    pub size: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MmioDevice {
    pub base: u64,
    pub size: u64,
    pub gsi: u32,
    pub _pad: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
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
    pub mmio: [MmioDevice; layout::MAX_MMIO_DEVICES],
}

// SAFETY: BootInfo and its members are repr(C) plain integers with explicit padding fields,
// so every byte pattern is a valid value and there is no implicit padding.
unsafe impl ByteValued for BootInfo {}

const _: () = assert!(std::mem::size_of::<BootInfo>() == 64 + 16 + 8 * 24);

/// Why the boot info could not be written.
#[derive(Debug, thiserror::Error)]
pub enum BootInfoError {
    /// The payload argument is too long.
    #[error("the payload argument is {0} bytes; at most 4096 fit: shorten --payload-arg")]
    ArgTooLong(usize),
    /// More devices than the table holds.
    #[error("{0} virtio devices requested; at most 8 fit: give fewer --vgpu options")]
    TooManyDevices(usize),
    /// Guest memory write failed.
    #[error("cannot write the boot info into guest memory: {0}")]
    Write(#[from] vm_memory::GuestMemoryError),
}

/// Builds the boot info for a VM.
pub fn build(
    mem_size: u64,
    vcpus: u8,
    tsc_khz: u64,
    arg_len: usize,
    mmio_devices: usize,
) -> Result<BootInfo, BootInfoError> {
    if arg_len > layout::ARG_MAX {
        return Err(BootInfoError::ArgTooLong(arg_len));
    }
    if mmio_devices > layout::MAX_MMIO_DEVICES {
        return Err(BootInfoError::TooManyDevices(mmio_devices));
    }
    let mut info = BootInfo {
        magic: BOOT_MAGIC,
        version: BOOT_VERSION,
        vcpus: u32::from(vcpus),
        tsc_khz,
        arg_addr: layout::ARG_ADDR,
        arg_len: arg_len as u64,
        mmio_count: mmio_devices as u32,
        ..Default::default()
    };
    for (slot, (base, size)) in info
        .mem_regions
        .iter_mut()
        .zip(layout::ram_regions(mem_size))
    {
        *slot = MemRegion { base, size };
    }
    for (i, slot) in info.mmio.iter_mut().take(mmio_devices).enumerate() {
        *slot = MmioDevice {
            base: layout::mmio_base(i),
            size: layout::MMIO_SIZE,
            gsi: layout::MMIO_GSI_BASE + i as u32,
            _pad: 0,
        };
    }
    Ok(info)
}

/// Writes the boot info and the argument string into guest memory.
pub fn write<M: GuestMemoryBackend>(
    mem: &M,
    info: &BootInfo,
    arg: &str,
) -> Result<(), BootInfoError> {
    if arg.len() > layout::ARG_MAX {
        return Err(BootInfoError::ArgTooLong(arg.len()));
    }
    mem.write_obj(*info, GuestAddress(layout::BOOT_INFO_ADDR))?;
    mem.write_slice(arg.as_bytes(), GuestAddress(layout::ARG_ADDR))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_devices_and_memory() {
        let info = build(256 << 20, 2, 3_000_000, 5, 2).unwrap();
        assert_eq!(
            info.mem_regions[0],
            MemRegion {
                base: 0,
                size: 256 << 20
            }
        );
        assert_eq!(info.mem_regions[1].size, 0);
        assert_eq!(info.mmio[1].base, layout::MMIO_BASE + 0x1000);
        assert_eq!(info.mmio[1].gsi, 6);
        assert_eq!(info.mmio[2], MmioDevice::default());
    }

    #[test]
    fn rejects_long_args_and_many_devices() {
        assert!(matches!(
            build(1 << 30, 1, 0, 5000, 0),
            Err(BootInfoError::ArgTooLong(5000))
        ));
        assert!(matches!(
            build(1 << 30, 1, 0, 0, 9),
            Err(BootInfoError::TooManyDevices(9))
        ));
    }
}
