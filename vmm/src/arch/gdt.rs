//! The GDT a payload runs with: flat 64-bit code and data, and a TSS descriptor KVM needs
//! for a valid task register.

use kvm_bindings::kvm_segment;

/// Builds a GDT entry from flags, base and limit (the layout the CPU expects).
pub const fn gdt_entry(flags: u16, base: u32, limit: u32) -> u64 {
    ((base as u64 & 0xff00_0000) << (56 - 24))
        | ((flags as u64 & 0x0000_f0ff) << 40)
        | ((limit as u64 & 0x000f_0000) << (48 - 16))
        | ((base as u64 & 0x00ff_ffff) << 16)
        | (limit as u64 & 0x0000_ffff)
}

/// Null, code64 (0x08), data (0x10), TSS (0x18).
pub const GDT: [u64; 4] = [
    gdt_entry(0, 0, 0),
    gdt_entry(0xa09b, 0, 0xfffff),
    gdt_entry(0xc093, 0, 0xfffff),
    gdt_entry(0x808b, 0, 0xfffff),
];

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
        selector: u16::from(index) * 8,
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
        assert_eq!(segment(0).unusable, 1);
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
