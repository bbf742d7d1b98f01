//! How much device memory a module holds once loaded, measured before it is compiled: its
//! image, plus for PTX the `.global` and `.const` variables it declares and for a cubin its
//! `.nv.global` sections (which the driver allocates in device memory at load time),
//! rounded up to whole pages.
//!
//! The PTX scan reads only module-scope declarations (outside every `{}` body and `()`
//! parameter list, comments skipped) and never fails: what it cannot size counts as its
//! largest plausible reading, so an obfuscated declaration costs more, never less.

use crate::ModuleImage;

/// Module memory is counted in pages of this size.
pub const MODULE_PAGE: u64 = 4096;

/// Bytes a module of `image` is charged: its image plus its declared globals, in whole
/// pages, at least one page.
pub fn module_footprint(image: &ModuleImage<'_>) -> u64 {
    let raw = match image {
        ModuleImage::Builtin(_) => 0,
        ModuleImage::Ptx(text) => (text.len() as u64).saturating_add(ptx_globals_bytes(text)),
        ModuleImage::Binary(bytes) => {
            (bytes.len() as u64).saturating_add(cubin_globals_bytes(bytes))
        }
    };
    raw.max(1).div_ceil(MODULE_PAGE).saturating_mul(MODULE_PAGE)
}

/// Bytes of the module-scope `.global` and `.const` variables PTX `text` declares
/// (`.extern` declarations define nothing and count 0).
pub fn ptx_globals_bytes(text: &[u8]) -> u64 {
    let mut total = 0u64;
    module_statements(text, |stmt, items| {
        total = total.saturating_add(statement_bytes(stmt, items))
    });
    total
}

/// Most variable names one image's scan yields ([`ptx_global_names`]; variables past
/// them are carried by a migration only when the guest looked them up).
pub const MAX_SCANNED_NAMES: usize = 4096;
/// Longest variable name a scan keeps.
pub const MAX_SCANNED_NAME: usize = 4096;

/// Adds `name` to `names` unless it is empty, too long, there already, or `names` is full.
pub(crate) fn push_name(names: &mut Vec<Vec<u8>>, name: &[u8]) {
    if !name.is_empty()
        && name.len() <= MAX_SCANNED_NAME
        && names.len() < MAX_SCANNED_NAMES
        && !names.iter().any(|n| n == name)
    {
        names.push(name.to_vec());
    }
}

/// Names of the module-scope `.global` and `.const` variables PTX `text` defines (not
/// `.extern` ones), in order, at most [`MAX_SCANNED_NAMES`]; what the scan cannot read is
/// left out.
pub fn ptx_global_names(text: &[u8]) -> Vec<Vec<u8>> {
    let mut names = Vec::new();
    module_statements(text, |stmt, _| {
        let Some(rest) = declarators(stmt) else {
            return;
        };
        for d in rest.split(',') {
            push_name(
                &mut names,
                d.split('[').next().unwrap_or("").trim().as_bytes(),
            );
        }
    });
    names
}

/// Calls `f` with each module-scope statement of PTX `text` (comments skipped) and the
/// number of elements in its initializer (0: none).
fn module_statements(text: &[u8], mut f: impl FnMut(&[u8], u64)) {
    let mut stmt: Vec<u8> = Vec::new();
    // Depth of `{}` and `()`; an initializer's braces are part of its statement.
    let mut depth = 0usize;
    let mut in_init = false;
    let mut init_items = 0u64;
    let mut i = 0;
    while let Some(&c) = text.get(i) {
        // Comments.
        if c == b'/' && text.get(i + 1) == Some(&b'/') {
            while text.get(i).is_some_and(|b| *b != b'\n') {
                i += 1;
            }
            continue;
        }
        if c == b'/' && text.get(i + 1) == Some(&b'*') {
            i += 2;
            while i < text.len() && !(text[i] == b'*' && text.get(i + 1) == Some(&b'/')) {
                i += 1;
            }
            i += 2;
            continue;
        }
        i += 1;
        match c {
            b'{' | b'(' => {
                if depth == 0 && c == b'{' && stmt.contains(&b'=') {
                    in_init = true;
                    init_items = 1;
                }
                depth += 1;
            }
            b'}' | b')' => {
                depth = depth.saturating_sub(1);
                if depth == 0 && c == b'}' && !in_init {
                    // The end of a function body: its header was no declaration.
                    stmt.clear();
                }
            }
            b',' if in_init => init_items = init_items.saturating_add(1),
            b';' if depth == 0 => {
                let items = if in_init { init_items } else { 0 };
                f(&stmt, items);
                stmt.clear();
                in_init = false;
            }
            _ if depth == 0 => stmt.push(c),
            _ => {}
        }
    }
}

/// The declarators (`a,b[4]`, blanks removed) of a module-scope `.global` or `.const`
/// statement that defines variables; `None` for any other statement.
fn declarators(stmt: &[u8]) -> Option<String> {
    let text = String::from_utf8_lossy(stmt);
    let decl = text.split('=').next().unwrap_or("");
    let tokens: Vec<&str> = decl.split_whitespace().collect();
    let pos = tokens
        .iter()
        .position(|t| *t == ".global" || *t == ".const")?;
    let linkage = [".visible", ".weak", ".common", ".extern"];
    let before = tokens.get(..pos).unwrap_or(&[]);
    if before
        .iter()
        .rev()
        .take_while(|t| linkage.contains(t))
        .any(|t| *t == ".extern")
    {
        return None;
    }
    let mut k = pos + 1;
    while let Some(tok) = tokens.get(k) {
        if !tok.starts_with('.') {
            break;
        }
        if *tok == ".extern" {
            return None;
        }
        if *tok == ".align" {
            k += 1;
        }
        k += 1;
    }
    Some(tokens.get(k..).unwrap_or(&[]).concat())
}

/// Bytes one module-scope statement declares in `.global` or `.const` space.
/// `init_items`: elements in its initializer (0: none). Directives without a `;`
/// (`.version`, `.target`, `.file`) may precede the declaration in `stmt`.
fn statement_bytes(stmt: &[u8], init_items: u64) -> u64 {
    let text = String::from_utf8_lossy(stmt);
    // Declarators follow the directives; an initializer follows '='.
    let decl = text.split('=').next().unwrap_or("");
    let tokens: Vec<&str> = decl.split_whitespace().collect();
    let Some(pos) = tokens
        .iter()
        .position(|t| *t == ".global" || *t == ".const")
    else {
        return 0;
    };
    let linkage = [".visible", ".weak", ".common", ".extern"];
    let before = tokens.get(..pos).unwrap_or(&[]);
    for t in before.iter().rev().take_while(|t| linkage.contains(t)) {
        if *t == ".extern" {
            return 0;
        }
    }
    let mut elem = 0u64;
    let mut vec = 1u64;
    let mut k = pos + 1;
    while let Some(tok) = tokens.get(k) {
        if !tok.starts_with('.') {
            break;
        }
        match *tok {
            ".extern" => return 0,
            // Its argument is a number, not a declarator.
            ".align" => k += 1,
            ".v2" => vec = 2,
            ".v4" => vec = 4,
            ".v8" => vec = 8,
            t => {
                if let Some(n) = type_size(t) {
                    elem = n;
                }
            }
        }
        k += 1;
    }
    let rest: String = tokens.get(k..).unwrap_or(&[]).concat();
    // Unknown type: count the largest scalar.
    let elem = if elem == 0 { 16 } else { elem }.saturating_mul(vec);
    rest.split(',')
        .filter(|d| !d.is_empty())
        .map(|d| declarator_elems(d, init_items).saturating_mul(elem))
        .fold(0u64, u64::saturating_add)
}

/// Elements one declarator (`name`, `name[4]`, `name[2][3]`, `name[]`) holds.
fn declarator_elems(d: &str, init_items: u64) -> u64 {
    let mut n = 1u64;
    for dim in d.split('[').skip(1) {
        let inner = dim.split(']').next().unwrap_or("").trim();
        let k = if inner.is_empty() {
            init_items.max(1)
        } else {
            parse_int(inner).unwrap_or(u64::MAX)
        };
        n = n.saturating_mul(k);
    }
    n
}

fn parse_int(s: &str) -> Option<u64> {
    let s = s.trim_end_matches(['U', 'u']);
    match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => s.parse().ok(),
    }
}

/// Size in bytes of a PTX fundamental type directive.
fn type_size(tok: &str) -> Option<u64> {
    Some(match tok {
        ".b8" | ".u8" | ".s8" | ".pred" => 1,
        ".b16" | ".u16" | ".s16" | ".f16" | ".bf16" => 2,
        ".b32" | ".u32" | ".s32" | ".f32" | ".f16x2" | ".bf16x2" => 4,
        ".b64" | ".u64" | ".s64" | ".f64" => 8,
        ".b128" => 16,
        _ => return None,
    })
}

/// Bytes of the `.nv.global` sections (the module's `__device__` variables, allocated in
/// device memory when it loads) of a cubin (64-bit little-endian ELF); 0 for anything else
/// or a section table that does not lie inside `image`.
pub fn cubin_globals_bytes(image: &[u8]) -> u64 {
    elf_globals(image).unwrap_or(0)
}

fn elf_globals(b: &[u8]) -> Option<u64> {
    if !b.starts_with(b"\x7fELF") || b.get(4) != Some(&2) || b.get(5) != Some(&1) {
        return None;
    }
    let u16_at = |o: usize| {
        b.get(o..o.checked_add(2)?)
            .and_then(|w| w.try_into().ok())
            .map(u16::from_le_bytes)
    };
    let u32_at = |o: usize| {
        b.get(o..o.checked_add(4)?)
            .and_then(|w| w.try_into().ok())
            .map(u32::from_le_bytes)
    };
    let u64_at = |o: usize| {
        b.get(o..o.checked_add(8)?)
            .and_then(|w| w.try_into().ok())
            .map(u64::from_le_bytes)
    };
    let shoff = usize::try_from(u64_at(0x28)?).ok()?;
    let shentsize = usize::from(u16_at(0x3a)?);
    let shnum = usize::from(u16_at(0x3c)?);
    let shstrndx = usize::from(u16_at(0x3e)?);
    if shentsize < 0x40 {
        return None;
    }
    let section = |i: usize| shoff.checked_add(i.checked_mul(shentsize)?);
    let names = usize::try_from(u64_at(section(shstrndx)?.checked_add(0x18)?)?).ok()?;
    let mut total = 0u64;
    for i in 0..shnum {
        let sh = section(i)?;
        let name_off = usize::try_from(u32_at(sh)?).ok()?;
        let name = b.get(names.checked_add(name_off)?..)?;
        let name = name.get(..name.iter().position(|c| *c == 0)?)?;
        if name.starts_with(b".nv.global") {
            total = total.saturating_add(u64_at(sh.checked_add(0x20)?)?);
        }
    }
    Some(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn module_scope_globals_and_consts_are_counted() {
        let ptx = br#"
.version 8.0
.target sm_90
.address_size 64
// .global .b8 commented[999999];
/* .global .b8 also_commented[999999]; */
.global .align 4 .b8 buf[1048576];
.visible .global .align 8 .u64 counter;
.const .align 4 .f32 coeffs[16] = {1.0, 2.0, 3.0, 4.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0};
.global .u32 a, b[4], c[2][3];
.global .align 16 .v4 .f32 vecs[8];
.const .b8 msg[] = {104, 105, 0};
.extern .global .b8 elsewhere[65536];
.visible .entry k(
    .param .u64 .ptr .global .align 1 p,
    .param .u32 n
)
{
    .reg .b32 %r<4>;
    .global .b8 not_module_scope[77777];
    ld.const.f32 %f1, [coeffs];
    ret;
}
"#;
        let want = 1048576 + 8 + 16 * 4 + 4 * (1 + 4 + 6) + 16 * 8 + 3;
        assert_eq!(ptx_globals_bytes(ptx), want);
        let names: Vec<String> = ptx_global_names(ptx)
            .into_iter()
            .map(|n| String::from_utf8_lossy(&n).into_owned())
            .collect();
        assert_eq!(
            names,
            ["buf", "counter", "coeffs", "a", "b", "c", "vecs", "msg"],
            "every defined variable, not the extern one, the parameter or the local"
        );
        // A flood of declarations yields a bounded list.
        let mut flood = b".global .b8 ".to_vec();
        for i in 0..10_000 {
            flood.extend_from_slice(format!("v{i},").as_bytes());
        }
        flood.extend_from_slice(b"last;");
        assert_eq!(ptx_global_names(&flood).len(), MAX_SCANNED_NAMES);
        let fp = module_footprint(&ModuleImage::Ptx(ptx));
        assert_eq!(fp % MODULE_PAGE, 0);
        assert!(fp >= want + ptx.len() as u64);
    }

    #[test]
    fn hostile_sizes_saturate_and_builtins_cost_a_page() {
        assert_eq!(
            ptx_globals_bytes(b".global .b64 huge[18446744073709551615];"),
            u64::MAX
        );
        assert_eq!(
            ptx_globals_bytes(b".global .b8 x[0xzz];"),
            u64::MAX,
            "an unreadable size counts as the largest"
        );
        assert_eq!(
            module_footprint(&ModuleImage::Builtin(b"builtin")),
            MODULE_PAGE
        );
        assert_eq!(
            module_footprint(&ModuleImage::Binary(&[0u8; 5000])),
            2 * MODULE_PAGE
        );
        assert_eq!(ptx_globals_bytes(b"}}}))) ;;; { ( .global"), 0);
    }

    /// A 64-bit ELF with a section-name table and sections (name, size).
    fn elf(sections: &[(&str, u64)]) -> Vec<u8> {
        let mut names = vec![0u8];
        let mut name_offs = Vec::new();
        for (n, _) in sections.iter().chain([(".shstrtab", 0)].iter()) {
            name_offs.push(names.len() as u32);
            names.extend_from_slice(n.as_bytes());
            names.push(0);
        }
        let shoff = 0x40 + names.len().next_multiple_of(8);
        let count = sections.len() + 2;
        let mut b = vec![0u8; shoff + count * 0x40];
        b[..6].copy_from_slice(b"\x7fELF\x02\x01");
        b[0x28..0x30].copy_from_slice(&(shoff as u64).to_le_bytes());
        b[0x3a..0x3c].copy_from_slice(&0x40u16.to_le_bytes());
        b[0x3c..0x3e].copy_from_slice(&(count as u16).to_le_bytes());
        b[0x3e..0x40].copy_from_slice(&((count - 1) as u16).to_le_bytes());
        b[0x40..0x40 + names.len()].copy_from_slice(&names);
        let mut put = |i: usize, name: u32, off: u64, size: u64| {
            let sh = shoff + i * 0x40;
            b[sh..sh + 4].copy_from_slice(&name.to_le_bytes());
            b[sh + 0x18..sh + 0x20].copy_from_slice(&off.to_le_bytes());
            b[sh + 0x20..sh + 0x28].copy_from_slice(&size.to_le_bytes());
        };
        for (i, (_, size)) in sections.iter().enumerate() {
            put(i + 1, name_offs[i], 0, *size);
        }
        put(
            count - 1,
            name_offs[sections.len()],
            0x40,
            names.len() as u64,
        );
        b
    }

    #[test]
    fn a_cubins_device_variables_are_charged() {
        let image = elf(&[
            (".text.k", 50),
            (".nv.global", 1 << 20),
            (".nv.global.init", 100),
        ]);
        assert_eq!(cubin_globals_bytes(&image), (1 << 20) + 100);
        let fp = module_footprint(&ModuleImage::Binary(&image));
        assert_eq!(
            fp,
            ((image.len() as u64 + (1 << 20) + 100).div_ceil(MODULE_PAGE)) * MODULE_PAGE
        );
        assert_eq!(
            cubin_globals_bytes(&image[..100]),
            0,
            "truncated section table"
        );
        assert_eq!(cubin_globals_bytes(b"not an elf"), 0);
    }
}
