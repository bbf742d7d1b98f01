//! The names of the module variables a binary module image defines: a cubin's object
//! symbols in its `.nv.global*` and user `.nv.constant*` sections, and in a fatbin those
//! of each uncompressed cubin and PTX entry (compressed entries are not read). What a
//! migration carries of a binary module besides the variables the guest looked up
//! (docs/migration.md, "Module variables").
//!
//! The image is the guest's: every offset and count is checked against it, and the scan
//! never fails (what it cannot read adds no name).

use crate::footprint::{ptx_global_names, push_name as push};

const FATBIN_MAGIC: u32 = 0xba55_ed50;
const FATBIN_KIND_PTX: u16 = 1;
const FATBIN_KIND_ELF: u16 = 2;
const FATBIN_FLAG_COMPRESSED: u64 = 0x2000 | 0x8000;
/// `SHT_SYMTAB`.
const SYMTAB: u32 = 2;
/// `STT_OBJECT`.
const OBJECT: u8 = 1;
/// Bytes of one `Elf64_Sym`.
const SYM: usize = 24;

fn u16_at(b: &[u8], o: usize) -> Option<u16> {
    b.get(o..o.checked_add(2)?)?
        .try_into()
        .ok()
        .map(u16::from_le_bytes)
}

fn u32_at(b: &[u8], o: usize) -> Option<u32> {
    b.get(o..o.checked_add(4)?)?
        .try_into()
        .ok()
        .map(u32::from_le_bytes)
}

fn u64_at(b: &[u8], o: usize) -> Option<u64> {
    b.get(o..o.checked_add(8)?)?
        .try_into()
        .ok()
        .map(u64::from_le_bytes)
}

fn usize_at(b: &[u8], o: usize) -> Option<usize> {
    usize::try_from(u64_at(b, o)?).ok()
}

/// The variables binary module `image` (a cubin or a fatbin) defines, in order, each once,
/// at most [`crate::footprint::MAX_SCANNED_NAMES`].
pub(crate) fn binary_global_names(image: &[u8]) -> Vec<Vec<u8>> {
    let mut names = Vec::new();
    if image.starts_with(b"\x7fELF") {
        elf_names(image, &mut names);
    } else if u32_at(image, 0) == Some(FATBIN_MAGIC) {
        fatbin_names(image, &mut names);
    }
    names
}

/// Walks a fatbin's entries (the layout `cuda-shim/src/image.rs` reads too).
fn fatbin_names(b: &[u8], names: &mut Vec<Vec<u8>>) -> Option<()> {
    let header = usize::from(u16_at(b, 6)?);
    let end = header.checked_add(usize_at(b, 8)?)?.min(b.len());
    let mut at = header;
    while at.checked_add(48)? <= end {
        let kind = u16_at(b, at)?;
        let entry_header = usize::try_from(u32_at(b, at + 4)?).ok()?;
        let start = at.checked_add(entry_header)?;
        let stop = start.checked_add(usize_at(b, at + 8)?)?;
        if entry_header == 0 || stop > end {
            return None;
        }
        if u64_at(b, at + 40)? & FATBIN_FLAG_COMPRESSED == 0 {
            let payload = &b[start..stop];
            match kind {
                FATBIN_KIND_ELF => {
                    elf_names(payload, names);
                }
                FATBIN_KIND_PTX => {
                    for n in ptx_global_names(payload) {
                        push(names, &n);
                    }
                }
                _ => {}
            }
        }
        at = stop;
    }
    Some(())
}

/// A cubin's object symbols in variable sections.
fn elf_names(b: &[u8], names: &mut Vec<Vec<u8>>) -> Option<()> {
    if !b.starts_with(b"\x7fELF") || b.get(4) != Some(&2) || b.get(5) != Some(&1) {
        return None;
    }
    let shoff = usize_at(b, 0x28)?;
    let shentsize = usize::from(u16_at(b, 0x3a)?);
    let shnum = usize::from(u16_at(b, 0x3c)?);
    let shstrndx = usize::from(u16_at(b, 0x3e)?);
    if shentsize < 0x40 {
        return None;
    }
    let section = |i: usize| shoff.checked_add(i.checked_mul(shentsize)?);
    let offset_of = |i: usize| usize_at(b, section(i)?.checked_add(0x18)?);
    let size_of = |i: usize| usize_at(b, section(i)?.checked_add(0x20)?);
    // A NUL-terminated string at `off` of string table section `table`.
    let string = |table: usize, off: usize| -> Option<&[u8]> {
        let start = offset_of(table)?;
        let tab = b.get(start..start.checked_add(size_of(table)?)?)?;
        let s = tab.get(off..)?;
        s.get(..s.iter().position(|c| *c == 0)?)
    };
    let variable_section = |i: usize| -> bool {
        let Some(name) = section(i)
            .and_then(|sh| u32_at(b, sh))
            .and_then(|n| string(shstrndx, usize::try_from(n).ok()?))
        else {
            return false;
        };
        name.starts_with(b".nv.global")
            || (name.starts_with(b".nv.constant") && !name.starts_with(b".nv.constant0"))
    };
    for i in 0..shnum {
        let sh = section(i)?;
        if u32_at(b, sh.checked_add(4)?)? != SYMTAB {
            continue;
        }
        let strtab = usize::try_from(u32_at(b, sh.checked_add(0x28)?)?).ok()?;
        let start = offset_of(i)?;
        let syms = b.get(start..start.checked_add(size_of(i)?)?)?;
        for sym in syms.chunks_exact(SYM) {
            let info = sym[4];
            let shndx = usize::from(u16::from_le_bytes([sym[6], sym[7]]));
            if info & 0xf != OBJECT || shndx == 0 || shndx >= shnum || !variable_section(shndx) {
                continue;
            }
            let name_off = u32::from_le_bytes([sym[0], sym[1], sym[2], sym[3]]);
            if let Some(name) = usize::try_from(name_off)
                .ok()
                .and_then(|o| string(strtab, o))
            {
                push(names, name);
            }
        }
    }
    Some(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A minimal cubin: sections null, .shstrtab, .strtab, .symtab, .nv.global,
    /// .nv.constant3, .nv.constant0.k, .text.k; symbols: `counter` and `seed` (objects in
    /// .nv.global), `lut` (object in .nv.constant3), `param` (object in .nv.constant0.k),
    /// `k` (a function).
    fn cubin() -> Vec<u8> {
        let shstr =
            b"\0.shstrtab\0.strtab\0.symtab\0.nv.global\0.nv.constant3\0.nv.constant0.k\0.text.k\0";
        let off = |s: &str| {
            shstr
                .windows(s.len())
                .position(|w| w == s.as_bytes())
                .expect("name") as u32
        };
        let strtab = b"\0counter\0seed\0lut\0param\0k\0";
        let soff = |s: &str| {
            strtab
                .windows(s.len() + 1)
                .position(|w| &w[1..] == s.as_bytes() && w[0] == 0)
                .expect("name") as u32
                + 1
        };
        let sym = |name: u32, kind: u8, shndx: u16| {
            let mut s = vec![0u8; SYM];
            s[0..4].copy_from_slice(&name.to_le_bytes());
            s[4] = kind;
            s[6..8].copy_from_slice(&shndx.to_le_bytes());
            s
        };
        let mut syms = vec![0u8; SYM];
        syms.extend(sym(soff("counter"), OBJECT, 4));
        syms.extend(sym(soff("seed"), OBJECT | 0x10, 4));
        syms.extend(sym(soff("lut"), OBJECT, 5));
        syms.extend(sym(soff("param"), OBJECT, 6));
        syms.extend(sym(soff("k"), 2, 7));
        let mut b = vec![0u8; 64];
        b[..4].copy_from_slice(b"\x7fELF");
        b[4] = 2;
        b[5] = 1;
        let place = |b: &mut Vec<u8>, data: &[u8]| {
            let at = b.len();
            b.extend_from_slice(data);
            (at as u64, data.len() as u64)
        };
        let (shstr_at, shstr_len) = place(&mut b, shstr);
        let (str_at, str_len) = place(&mut b, strtab);
        let (sym_at, sym_len) = place(&mut b, &syms);
        let shoff = b.len() as u64;
        let header = |b: &mut Vec<u8>, name: u32, ty: u32, at: u64, len: u64, link: u32| {
            let mut h = vec![0u8; 64];
            h[0..4].copy_from_slice(&name.to_le_bytes());
            h[4..8].copy_from_slice(&ty.to_le_bytes());
            h[0x18..0x20].copy_from_slice(&at.to_le_bytes());
            h[0x20..0x28].copy_from_slice(&len.to_le_bytes());
            h[0x28..0x2c].copy_from_slice(&link.to_le_bytes());
            b.extend(h);
        };
        header(&mut b, 0, 0, 0, 0, 0);
        header(&mut b, off(".shstrtab"), 3, shstr_at, shstr_len, 0);
        header(&mut b, off(".strtab"), 3, str_at, str_len, 0);
        header(&mut b, off(".symtab"), SYMTAB, sym_at, sym_len, 2);
        header(&mut b, off(".nv.global"), 8, 0, 16, 0);
        header(&mut b, off(".nv.constant3"), 1, 0, 64, 0);
        header(&mut b, off(".nv.constant0.k"), 1, 0, 64, 0);
        header(&mut b, off(".text.k"), 1, 0, 0, 0);
        b[0x28..0x30].copy_from_slice(&shoff.to_le_bytes());
        b[0x3a..0x3c].copy_from_slice(&64u16.to_le_bytes());
        b[0x3c..0x3e].copy_from_slice(&8u16.to_le_bytes());
        b[0x3e..0x40].copy_from_slice(&1u16.to_le_bytes());
        b
    }

    fn names(v: Vec<Vec<u8>>) -> Vec<String> {
        v.into_iter()
            .map(|n| String::from_utf8_lossy(&n).into_owned())
            .collect()
    }

    #[test]
    fn a_cubins_variables_are_its_objects_in_variable_sections() {
        assert_eq!(
            names(binary_global_names(&cubin())),
            ["counter", "seed", "lut"],
            "not the kernel parameter bank, not the function"
        );
    }

    #[test]
    fn a_fatbins_uncompressed_cubin_and_ptx_entries_are_read() {
        let ptx = b".version 8.0\n.target sm_90\n.visible .global .u32 flag;\n";
        let entry = |kind: u16, flags: u64, payload: &[u8]| {
            let mut e = vec![0u8; 64];
            e[0..2].copy_from_slice(&kind.to_le_bytes());
            e[4..8].copy_from_slice(&64u32.to_le_bytes());
            e[8..16].copy_from_slice(&(payload.len() as u64).to_le_bytes());
            e[40..48].copy_from_slice(&flags.to_le_bytes());
            e.extend_from_slice(payload);
            e
        };
        let mut body = entry(FATBIN_KIND_ELF, 0, &cubin());
        body.extend(entry(FATBIN_KIND_PTX, 0, ptx));
        body.extend(entry(FATBIN_KIND_PTX, 0x2000, b"compressed bytes"));
        let mut fat = vec![0u8; 16];
        fat[0..4].copy_from_slice(&FATBIN_MAGIC.to_le_bytes());
        fat[6..8].copy_from_slice(&16u16.to_le_bytes());
        fat[8..16].copy_from_slice(&(body.len() as u64).to_le_bytes());
        fat.extend(body);
        assert_eq!(
            names(binary_global_names(&fat)),
            ["counter", "seed", "lut", "flag"]
        );
    }

    #[test]
    fn hostile_images_add_no_names_and_never_panic() {
        let good = cubin();
        for cut in [0, 4, 63, 64, 100, good.len() - 1] {
            let _ = binary_global_names(&good[..cut]);
        }
        let mut bad = good.clone();
        // Section header table far past the end.
        bad[0x28..0x30].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(binary_global_names(&bad).is_empty());
        let mut bad = good.clone();
        // A string table index out of range.
        bad[0x3e..0x40].copy_from_slice(&u16::MAX.to_le_bytes());
        assert!(binary_global_names(&bad).is_empty());
        let mut fat = vec![0u8; 16];
        fat[0..4].copy_from_slice(&FATBIN_MAGIC.to_le_bytes());
        fat[6..8].copy_from_slice(&16u16.to_le_bytes());
        fat[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
        fat.extend([0xff; 64]);
        assert!(binary_global_names(&fat).is_empty());
        assert!(binary_global_names(b"not an image").is_empty());
    }
}
