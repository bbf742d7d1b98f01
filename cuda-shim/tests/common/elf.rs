//! The dynamic symbols a shared library exports, read from its ELF file (64-bit,
//! little-endian: x86-64 and AArch64 Linux) as the dynamic loader sees them.

use std::path::Path;

const SHT_DYNSYM: u32 = 11;
const SHN_UNDEF: u16 = 0;
const STB_GLOBAL: u8 = 1;
const STB_WEAK: u8 = 2;
const STT_FUNC: u8 = 2;
const STV_DEFAULT: u8 = 0;

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes(b[at..at + 2].try_into().expect("2 bytes"))
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], at: usize) -> usize {
    let v = u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"));
    usize::try_from(v).expect("an offset of this machine")
}

/// Every function `path` defines and exports (global or weak, default visibility).
pub fn exported_functions(path: &Path) -> Vec<String> {
    let b = std::fs::read(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    assert!(
        b.len() > 64 && b[..4] == *b"\x7fELF" && b[4] == 2 && b[5] == 1,
        "{} is not a 64-bit little-endian ELF file",
        path.display()
    );
    let (shoff, shentsize, shnum) = (u64_at(&b, 0x28), u16_at(&b, 0x3a), u16_at(&b, 0x3c));
    let section = |i: usize| {
        let h = shoff + i * usize::from(shentsize);
        // (type, offset, size, link, entry size)
        (
            u32_at(&b, h + 4),
            u64_at(&b, h + 24),
            u64_at(&b, h + 32),
            u32_at(&b, h + 40) as usize,
            u64_at(&b, h + 56),
        )
    };
    let dynsym = (0..usize::from(shnum))
        .map(section)
        .find(|s| s.0 == SHT_DYNSYM)
        .expect("a .dynsym section");
    let (_, sym_off, sym_size, strtab, sym_ent) = dynsym;
    let (_, str_off, str_size, _, _) = section(strtab);
    let strings = &b[str_off..str_off + str_size];
    let mut names = Vec::new();
    for at in (sym_off..sym_off + sym_size).step_by(sym_ent) {
        let (name, info, other, shndx) = (u32_at(&b, at), b[at + 4], b[at + 5], u16_at(&b, at + 6));
        let bind = info >> 4;
        if shndx == SHN_UNDEF
            || info & 0xf != STT_FUNC
            || !(bind == STB_GLOBAL || bind == STB_WEAK)
            || other & 3 != STV_DEFAULT
        {
            continue;
        }
        let name = &strings[name as usize..];
        let end = name
            .iter()
            .position(|&c| c == 0)
            .expect("a NUL-terminated name");
        names.push(String::from_utf8_lossy(&name[..end]).into_owned());
    }
    names
}
