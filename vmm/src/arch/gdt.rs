//! The GDT a payload runs with: flat 64-bit code and data for ring 0 and ring 3, and a TSS
//! descriptor KVM needs for a valid task register. Payloads run in ring 3 (see
//! docs/payload-abi.md: the KVM on our machines emulates ring-0 guest code instruction by
//! instruction, but runs ring-3 code natively).

use kvm_bindings::kvm_segment;

/// Builds a GDT entry from flags, base and limit (the layout the CPU expects).
pub const fn gdt_entry(flags: u16, base: u32, limit: u32) -> u64 {
    ((base as u64 & 0xff00_0000) << (56 - 24))
        | ((flags as u64 & 0x0000_f0ff) << 40)
        | ((limit as u64 & 0x000f_0000) << (48 - 16))
        | ((base as u64 & 0x00ff_ffff) << 16)
        | (limit as u64 & 0x0000_ffff)
}

/// Null, kernel code64 (0x08), kernel data (0x10), TSS (0x18, 16 bytes: its upper half is
/// entry 4, zero for a TSS below 4 GiB), user data (0x28, DPL 3), user code64 (0x30, DPL 3).
pub const GDT: [u64; 7] = [
    gdt_entry(0, 0, 0),
    gdt_entry(0xa09b, 0, 0xfffff),
    gdt_entry(0xc093, 0, 0xfffff),
    gdt_entry(0x808b, TSS_ADDR as u32, 0x67),
    0,
    gdt_entry(0xc0f3, 0, 0xfffff),
    gdt_entry(0xa0fb, 0, 0xfffff),
];

/// Where the (all-zero) TSS lives: right after the GDT.
pub const TSS_ADDR: u64 = crate::layout::GDT_ADDR + 0x100;
pub const KERNEL_CODE: u8 = 1;
pub const KERNEL_DATA: u8 = 2;
pub const TSS: u8 = 3;
pub const USER_DATA: u8 = 5;
pub const USER_CODE: u8 = 6;

/// The KVM segment register matching GDT entry `index`.
pub fn segment(index: u8) -> kvm_segment {
    let entry = GDT[index as usize];
    let base = ((entry >> 16) & 0x00ff_ffff) | ((entry >> 32) & 0xff00_0000);
    let limit_raw = (entry & 0xffff) | ((entry >> 32) & 0x000f_0000);
    let g = ((entry >> 55) & 1) as u8;
    kvm_segment {
        base,
        // With G set the limit counts 4 KiB pages.
        limit: if g == 1 {
            ((limit_raw << 12) | 0xfff) as u32
        } else {
            limit_raw as u32
        },
        selector: (u16::from(index) * 8) | ((entry >> 45) & 3) as u16,
        type_: ((entry >> 40) & 0xf) as u8,
        present: ((entry >> 47) & 1) as u8,
        dpl: ((entry >> 45) & 3) as u8,
        db: ((entry >> 54) & 1) as u8,
        s: ((entry >> 44) & 1) as u8,
        l: ((entry >> 53) & 1) as u8,
        g,
        avl: ((entry >> 52) & 1) as u8,
        unusable: if (entry >> 47) & 1 == 1 { 0 } else { 1 },
        padding: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn code_segment_is_64_bit_ring0() {
        let cs = segment(1);
        assert_eq!(cs.selector, 0x08);
        assert_eq!(cs.l, 1);
        assert_eq!(cs.db, 0, "long mode code must have D clear");
        assert_eq!(cs.dpl, 0);
        assert_eq!(cs.present, 1);
        assert_eq!(cs.type_, 0xb);
        assert_eq!(cs.limit, 0xffff_ffff);
    }

    #[test]
    fn data_and_tss_segments() {
        let ds = segment(2);
        assert_eq!((ds.selector, ds.type_, ds.s, ds.db), (0x10, 0x3, 1, 1));
        let tss = segment(3);
        assert_eq!((tss.selector, tss.type_, tss.s), (0x18, 0xb, 0));
        assert_eq!(tss.base, TSS_ADDR);
        assert_eq!(segment(0).unusable, 1);
        let ucs = segment(USER_CODE);
        assert_eq!((ucs.selector, ucs.dpl, ucs.l, ucs.type_), (0x33, 3, 1, 0xb));
        let uds = segment(USER_DATA);
        assert_eq!((uds.selector, uds.dpl, uds.type_), (0x2b, 3, 0x3));
    }

    #[test]
    fn entry_round_trips_base_and_limit() {
        let e = gdt_entry(0xc093, 0x1234_5678, 0xabcde);
        let s = {
            let base = ((e >> 16) & 0x00ff_ffff) | ((e >> 32) & 0xff00_0000);
            let limit = (e & 0xffff) | ((e >> 32) & 0x000f_0000);
            (base, limit)
        };
        assert_eq!(s, (0x1234_5678, 0xabcde));
    }
}
