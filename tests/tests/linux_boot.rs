//! The vmm's Linux path under KVM, without a kernel image: a synthetic "vmlinux" (a few
//! ring-0 instructions) checks the 64-bit boot protocol state it is entered with (rsi =
//! zero page, type_of_loader, cmd_line_ptr, CPL 0) and the serial port; bad kernels and
//! flag combinations give one-line errors. docs/linux-guests.md.

use std::path::PathBuf;
use std::time::Duration;

use vgpu_tests::bins::payload;
use vgpu_tests::require_kvm;
use vgpu_tests::run::{finish, spawn_vmm};

const DEADLINE: Duration = Duration::from_secs(60);

/// Prints "L" on COM1; exits 42 when rsi = 0x7000, boot_params.hdr.type_of_loader = 0xff,
/// cmd_line_ptr = 0x20000 and CPL = 0; exits 1 otherwise. Assembled with GNU as from:
///
/// ```text
///     mov $0x3f8, %dx;  mov $0x4c, %al;  out %al, %dx
///     cmp $0x7000, %rsi;        jne 1f
///     movb 0x210(%rsi), %al;    cmp $0xff, %al;     jne 1f
///     mov 0x228(%rsi), %eax;    cmp $0x20000, %eax; jne 1f
///     mov %cs, %eax;            test $3, %al;       jne 1f
///     mov $42, %al;  out %al, $0xf4
/// 1:  mov $1, %al;   out %al, $0xf4
/// ```
const CHECK_ENTRY: &[u8] = &[
    0x66, 0xba, 0xf8, 0x03, 0xb0, 0x4c, 0xee, 0x48, 0x81, 0xfe, 0x00, 0x70, 0x00, 0x00, 0x75, 0x21,
    0x8a, 0x86, 0x10, 0x02, 0x00, 0x00, 0x3c, 0xff, 0x75, 0x17, 0x8b, 0x86, 0x28, 0x02, 0x00, 0x00,
    0x3d, 0x00, 0x00, 0x02, 0x00, 0x75, 0x0a, 0x8c, 0xc8, 0xa8, 0x03, 0x75, 0x04, 0xb0, 0x2a, 0xe6,
    0xf4, 0xb0, 0x01, 0xe6, 0xf4,
];

/// A minimal ELF64 executable with one PT_LOAD of `code` at physical 16 MiB, as a
/// vmlinux is laid out.
fn vmlinux(code: &[u8]) -> Vec<u8> {
    let paddr: u64 = 0x100_0000;
    let mut out = Vec::new();
    out.extend_from_slice(b"\x7fELF\x02\x01\x01\0\0\0\0\0\0\0\0\0");
    out.extend_from_slice(&2u16.to_le_bytes()); // ET_EXEC
    out.extend_from_slice(&62u16.to_le_bytes()); // x86-64
    out.extend_from_slice(&1u32.to_le_bytes());
    out.extend_from_slice(&paddr.to_le_bytes()); // e_entry
    out.extend_from_slice(&64u64.to_le_bytes()); // e_phoff
    out.extend_from_slice(&0u64.to_le_bytes()); // e_shoff
    out.extend_from_slice(&0u32.to_le_bytes());
    for v in [64u16, 56, 1, 64, 0, 0] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    out.extend_from_slice(&1u32.to_le_bytes()); // PT_LOAD
    out.extend_from_slice(&5u32.to_le_bytes());
    out.extend_from_slice(&120u64.to_le_bytes()); // p_offset
    out.extend_from_slice(&(0xffff_ffff_8000_0000 + paddr).to_le_bytes());
    out.extend_from_slice(&paddr.to_le_bytes());
    out.extend_from_slice(&(code.len() as u64).to_le_bytes());
    out.extend_from_slice(&0x1000u64.to_le_bytes());
    out.extend_from_slice(&0x20_0000u64.to_le_bytes());
    out.extend_from_slice(code);
    out
}

fn tmp(name: &str, bytes: &[u8]) -> PathBuf {
    let p = std::env::temp_dir().join(format!("vgpu-linux-{}-{name}", std::process::id()));
    std::fs::write(&p, bytes).unwrap();
    p
}

#[test]
fn a_vmlinux_is_entered_in_ring0_with_the_zero_page() {
    require_kvm!();
    let k = tmp("entry", &vmlinux(CHECK_ENTRY));
    let initrd = tmp("initrd", &[7u8; 5000]);
    for profile in ["host", "restricted"] {
        let out = finish(
            spawn_vmm(&[
                "--kernel",
                k.to_str().unwrap(),
                "--initrd",
                initrd.to_str().unwrap(),
                "--cpu-profile",
                profile,
                "--memory",
                "64M",
            ]),
            DEADLINE,
        );
        assert_eq!(out.code, Some(42), "{profile}: {out:?}");
        assert_eq!(out.stdout, "L", "{profile}: {out:?}");
    }
    let _ = std::fs::remove_file(k);
    let _ = std::fs::remove_file(initrd);
}

#[test]
fn a_crashing_kernel_is_reported_with_its_rip() {
    require_kvm!();
    // ud2 with no IDT: #UD, #GP, #DF, triple fault.
    let k = tmp("ud2", &vmlinux(&[0x0f, 0x0b]));
    let out = finish(
        spawn_vmm(&["--kernel", k.to_str().unwrap(), "--memory", "64M"]),
        DEADLINE,
    );
    let _ = std::fs::remove_file(k);
    assert_eq!(out.code, Some(125), "{out:?}");
    assert!(out.stderr.contains("rip 0x"), "{out:?}");
    assert!(!out.stderr.contains("panicked"), "{out:?}");
}

#[test]
fn bad_kernels_give_one_line_errors() {
    let garbage = tmp("garbage", b"definitely not a kernel");
    let one_line = |args: &[&str]| {
        let out = finish(spawn_vmm(args), DEADLINE);
        assert_eq!(out.code, Some(1), "{args:?}: {out:?}");
        let lines: Vec<_> = out.stderr.lines().filter(|l| !l.is_empty()).collect();
        assert_eq!(lines.len(), 1, "{args:?}: {out:?}");
        assert!(!out.stderr.contains("panicked"), "{out:?}");
        lines[0].to_string()
    };
    assert!(one_line(&["--kernel", "/nonexistent/vmlinux"]).contains("cannot read"));
    assert!(one_line(&["--kernel", garbage.to_str().unwrap()]).contains("neither a vmlinux"));
    let k = tmp("ok", &vmlinux(CHECK_ENTRY));
    let l = one_line(&[
        "--kernel",
        k.to_str().unwrap(),
        "--initrd",
        "/nonexistent/initrd",
    ]);
    assert!(l.contains("cannot read"), "{l}");
    // Flags that do not go together are refused by the parser (exit 2).
    let hello = payload("hello");
    for args in [
        vec![
            "--payload",
            hello.to_str().unwrap(),
            "--kernel",
            k.to_str().unwrap(),
        ],
        vec!["--payload", hello.to_str().unwrap(), "--initrd", "/x"],
        vec!["--kernel", k.to_str().unwrap(), "--cpu-profile", "weird"],
    ] {
        let out = finish(spawn_vmm(&args), DEADLINE);
        assert_eq!(out.code, Some(2), "{args:?}: {out:?}");
    }
    let _ = std::fs::remove_file(garbage);
    let _ = std::fs::remove_file(k);
}
