//! The guest physical memory map a payload guest sees (docs/payload-abi.md is the contract;
//! keep the two in step).

/// GDT: null, code64, data, TSS.
pub const GDT_ADDR: u64 = 0x500;
/// `BootInfo` handed to the payload in `rdi`.
pub const BOOT_INFO_ADDR: u64 = 0x7000;
/// The payload's argument string.
pub const ARG_ADDR: u64 = 0x8000;
/// Longest argument string the vmm accepts.
pub const ARG_MAX: usize = 0x1000;
/// PML4, then PDPT, then four page directories (identity map of 4 GiB with 2 MiB pages).
pub const PML4_ADDR: u64 = 0x9000;
pub const PDPT_ADDR: u64 = 0xA000;
pub const PD_ADDR: u64 = 0xB000;
/// vCPU stacks live below the image: vCPU i's stack top is `STACKS_TOP - i * STACK_SIZE`.
pub const STACKS_TOP: u64 = 0x20_0000;
pub const STACK_SIZE: u64 = 0x1_0000;
/// How many vCPUs the stack area holds.
pub const MAX_VCPUS: u8 = 16;
/// Payload images are linked here; nothing of the vmm's lives at or above it.
pub const PAYLOAD_START: u64 = 0x20_0000;
/// Smallest guest RAM that holds the boot structures, the stacks and a small image.
pub const MIN_MEMORY: u64 = 4 << 20;
/// RAM below the MMIO hole; RAM beyond this continues at `HIGH_RAM_START`.
pub const LOW_RAM_END: u64 = 0xC000_0000;
pub const HIGH_RAM_START: u64 = 1 << 32;
/// virtio-mmio device windows.
pub const MMIO_BASE: u64 = 0xD000_0000;
pub const MMIO_SIZE: u64 = 0x1000;
/// The first virtio-mmio device's GSI; device i gets `MMIO_GSI_BASE + i`.
pub const MMIO_GSI_BASE: u32 = 5;
/// How many virtio-mmio devices fit the BootInfo table.
pub const MAX_MMIO_DEVICES: usize = 8;
/// KVM's TSS and identity-map pages for Intel hosts, inside the MMIO hole.
pub const KVM_TSS_ADDR: u64 = 0xFFFB_D000;
pub const KVM_IDENTITY_MAP_ADDR: u64 = 0xFFFB_C000;

/// COM1.
pub const COM1_BASE: u16 = 0x3F8;
pub const COM1_IRQ: u32 = 4;
/// Debug exit: the low byte written becomes the vmm's exit code.
pub const DEBUG_EXIT_PORT: u16 = 0xF4;
/// i8042 command port (0xFE resets the machine) and data port.
pub const I8042_CMD_PORT: u16 = 0x64;
pub const I8042_DATA_PORT: u16 = 0x60;
/// vCPU park: the writing vCPU stops running until the VM ends (ring 3 cannot `hlt`).
pub const PARK_PORT: u16 = 0xF5;
/// vCPU idle: the writing vCPU sleeps for the value written, in µs (at most 1000), or
/// until a device interrupts (`idle.rs`).
pub const IDLE_PORT: u16 = 0xF6;
/// Longest idle one write asks for.
pub const IDLE_MAX_US: u32 = 1000;
/// POST code port: accepted and ignored, a cheap VM exit.
pub const POST_PORT: u16 = 0x80;

/// Guest RAM regions `(base, size)` for a VM of `size` bytes.
pub fn ram_regions(size: u64) -> Vec<(u64, u64)> {
    if size <= LOW_RAM_END {
        vec![(0, size)]
    } else {
        vec![(0, LOW_RAM_END), (HIGH_RAM_START, size - LOW_RAM_END)]
    }
}

/// Guest physical base of virtio-mmio device `index`.
pub fn mmio_base(index: usize) -> u64 {
    MMIO_BASE + index as u64 * MMIO_SIZE
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_vm_has_one_region() {
        assert_eq!(ram_regions(256 << 20), vec![(0, 256 << 20)]);
    }

    #[test]
    fn big_vm_skips_the_mmio_hole() {
        let r = ram_regions(4 << 30);
        assert_eq!(
            r,
            vec![(0, LOW_RAM_END), (HIGH_RAM_START, (4 << 30) - LOW_RAM_END)]
        );
        assert!(mmio_base(MAX_MMIO_DEVICES) <= KVM_IDENTITY_MAP_ADDR);
    }

    #[test]
    fn stacks_fit_between_page_tables_and_image() {
        let lowest = STACKS_TOP - u64::from(MAX_VCPUS) * STACK_SIZE;
        assert!(lowest >= PD_ADDR + 4 * 0x1000);
        assert!(ARG_ADDR + ARG_MAX as u64 <= PML4_ADDR);
    }
}
