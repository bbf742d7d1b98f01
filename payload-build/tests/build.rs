//! Builds the real payloads and checks the images against docs/payload-abi.md.

use std::path::Path;

const LOAD_BASE: u64 = 0x20_0000;
const ET_EXEC: u16 = 2;
const PT_LOAD: u32 = 1;

fn u16_at(b: &[u8], off: usize) -> u16 {
    u16::from_le_bytes(b[off..off + 2].try_into().unwrap())
}
fn u32_at(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes(b[off..off + 4].try_into().unwrap())
}
fn u64_at(b: &[u8], off: usize) -> u64 {
    u64::from_le_bytes(b[off..off + 8].try_into().unwrap())
}

/// Checks the ELF64 header and program headers; returns the entry point.
fn check_image(path: &Path) -> u64 {
    let b = std::fs::read(path).unwrap();
    assert_eq!(&b[..4], b"\x7fELF", "{}: not an ELF", path.display());
    assert_eq!(b[4], 2, "ELF64");
    assert_eq!(b[5], 1, "little endian");
    assert_eq!(u16_at(&b, 16), ET_EXEC, "static, non-PIE executable");
    assert_eq!(u16_at(&b, 18), 62, "x86-64");
    let entry = u64_at(&b, 24);
    let phoff = u64_at(&b, 32) as usize;
    let phentsize = usize::from(u16_at(&b, 54));
    let phnum = usize::from(u16_at(&b, 56));
    let mut loads = 0;
    for i in 0..phnum {
        let ph = &b[phoff + i * phentsize..];
        if u32_at(ph, 0) == PT_LOAD {
            loads += 1;
            let paddr = u64_at(ph, 24);
            let memsz = u64_at(ph, 40);
            assert!(paddr >= LOAD_BASE, "PT_LOAD at {paddr:#x} below 2 MiB");
            assert!(paddr + memsz < 0xC000_0000, "PT_LOAD beyond low RAM");
        }
    }
    assert!(loads > 0);
    entry
}

#[test]
fn hello_builds_to_a_loadable_image() {
    let path = payload_build::payload("hello").unwrap();
    let entry = check_image(&path);
    assert!(entry >= LOAD_BASE, "entry {entry:#x}");
}

#[test]
fn every_payload_builds_and_enters_at_the_load_base() {
    for name in payload_build::PAYLOADS {
        let path = payload_build::payload(name).unwrap();
        // _start is placed first in .text by payloads/link.ld.
        assert_eq!(check_image(&path), LOAD_BASE, "{name}");
    }
}
