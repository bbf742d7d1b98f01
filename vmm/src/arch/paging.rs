//! Identity page tables for the first 4 GiB with 2 MiB pages.

use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend};

use crate::layout::{PDPT_ADDR, PD_ADDR, PML4_ADDR};

const PRESENT: u64 = 1;
const WRITABLE: u64 = 1 << 1;
const HUGE: u64 = 1 << 7;
/// Ring 3 may use every page: payloads run there.
const USER: u64 = 1 << 2;
/// How many page directories (each maps 1 GiB).
pub const PD_COUNT: u64 = 4;

/// The entries, as `(guest address, value)`, in the order they are written.
pub fn entries() -> impl Iterator<Item = (u64, u64)> {
    let pml4 = std::iter::once((PML4_ADDR, PDPT_ADDR | PRESENT | WRITABLE | USER));
    let pdpt = (0..PD_COUNT).map(|i| {
        (
            PDPT_ADDR + i * 8,
            (PD_ADDR + i * 0x1000) | PRESENT | WRITABLE | USER,
        )
    });
    let pds = (0..PD_COUNT * 512).map(|i| {
        (
            PD_ADDR + i * 8,
            (i << 21) | PRESENT | WRITABLE | HUGE | USER,
        )
    });
    pml4.chain(pdpt).chain(pds)
}

/// Writes the tables into guest memory; returns the value for CR3.
pub fn write<M: GuestMemoryBackend>(mem: &M) -> Result<u64, vm_memory::GuestMemoryError> {
    for (addr, value) in entries() {
        mem.write_obj(value, GuestAddress(addr))?;
    }
    Ok(PML4_ADDR)
}

/// Walks the tables the way the MMU would, for tests: guest virtual to guest physical.
pub fn translate<M: GuestMemoryBackend>(mem: &M, va: u64) -> Option<u64> {
    let pml4e: u64 = mem
        .read_obj(GuestAddress(PML4_ADDR + ((va >> 39) & 0x1ff) * 8))
        .ok()?;
    if pml4e & PRESENT == 0 {
        return None;
    }
    let pdpte: u64 = mem
        .read_obj(GuestAddress((pml4e & !0xfff) + ((va >> 30) & 0x1ff) * 8))
        .ok()?;
    if pdpte & PRESENT == 0 {
        return None;
    }
    let pde: u64 = mem
        .read_obj(GuestAddress((pdpte & !0xfff) + ((va >> 21) & 0x1ff) * 8))
        .ok()?;
    if pde & PRESENT == 0 || pde & HUGE == 0 {
        return None;
    }
    Some((pde & !0x1f_ffff) | (va & 0x1f_ffff))
}

#[cfg(test)]
mod tests {
    use vm_memory::GuestMemoryMmap;

    use super::*;

    #[test]
    fn identity_maps_four_gib() {
        let mem: GuestMemoryMmap =
            GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap();
        assert_eq!(write(&mem).unwrap(), PML4_ADDR);
        for va in [
            0u64,
            0x1234,
            0x20_0000,
            0xC000_0000,
            0xD000_0010,
            0xFFFF_FFFF,
        ] {
            assert_eq!(translate(&mem, va), Some(va), "va {va:#x}");
        }
        assert_eq!(
            translate(&mem, 1 << 32),
            None,
            "nothing above 4 GiB is mapped"
        );
    }

    #[test]
    fn tables_do_not_overlap_boot_info_or_stacks() {
        let last = entries().map(|(a, _)| a).max().unwrap();
        assert!(last < 0x10000);
        assert!(entries().all(|(a, _)| a >= PML4_ADDR));
    }
}
