//! The zero page, E820 map, command line and initrd placement, field by field, and loading
//! synthetic vmlinux and bzImage files.

use std::io::Write;

use linux_loader::elf::{Elf64_Ehdr, Elf64_Phdr, PT_LOAD};
use vm_memory::{ByteValued, Bytes, GuestAddress};

use super::*;
use crate::memory::create_guest_memory;

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

fn tmp(name: &str, bytes: &[u8]) -> PathBuf {
    let p = std::env::temp_dir().join(format!("vmm-linux-{}-{name}", std::process::id()));
    File::create(&p).unwrap().write_all(bytes).unwrap();
    p
}

fn devices(n: usize) -> Vec<MmioAnnounce> {
    (0..n)
        .map(|i| MmioAnnounce {
            base: layout::mmio_base(i),
            size: layout::MMIO_SIZE,
            gsi: layout::MMIO_GSI_BASE + i as u32,
        })
        .collect()
}

#[test]
fn e820_small_vm_skips_the_legacy_hole() {
    let map = e820_map(256 * MIB);
    assert_eq!(map.len(), 2);
    assert_eq!(
        (map[0].addr, map[0].size, map[0].r#type),
        (0, EBDA_START, 1)
    );
    assert_eq!(
        (map[1].addr, map[1].size, map[1].r#type),
        (HIMEM_START, 256 * MIB - HIMEM_START, 1)
    );
}

#[test]
fn e820_big_vm_respects_the_mmio_hole() {
    let mem = 6 * GIB;
    let map = e820_map(mem);
    assert_eq!(map.len(), 3);
    assert_eq!({ map[1].addr }, HIMEM_START);
    assert_eq!({ map[1].addr } + { map[1].size }, layout::LOW_RAM_END);
    assert_eq!({ map[2].addr }, layout::HIGH_RAM_START);
    assert_eq!({ map[2].size }, mem - layout::LOW_RAM_END);
    // No RAM entry touches the MMIO hole, where the virtio-mmio windows live.
    for e in &map {
        let end = e.addr + e.size;
        assert!(end <= layout::LOW_RAM_END || e.addr >= layout::HIGH_RAM_START);
        assert!(!(e.addr..end).contains(&layout::mmio_base(0)));
    }
    // Every byte of guest RAM above 1 MiB is listed exactly once.
    let listed: u64 = map.iter().map(|e| e.size).sum();
    assert_eq!(listed, EBDA_START + mem - HIMEM_START);
}

#[test]
fn cmdline_announces_each_device() {
    let c = cmdline("console=ttyS0 reboot=k", &devices(2)).unwrap();
    let s = c.as_cstring().unwrap().into_string().unwrap();
    assert_eq!(
        s,
        "console=ttyS0 reboot=k virtio_mmio.device=4K@0xd0000000:5 \
         virtio_mmio.device=4K@0xd0001000:6"
    );
    assert!(matches!(
        cmdline("bad\0char", &[]),
        Err(LinuxBootError::CmdlineChars)
    ));
    assert!(cmdline("caf\u{e9}", &[]).is_err());
    assert!(cmdline(&"x".repeat(CMDLINE_MAX + 1), &[]).is_err());
}

#[test]
fn initrd_goes_high_and_above_the_kernel() {
    let low = 256 * MIB;
    let a = initrd_addr(1_000_000, low, DEFAULT_INITRD_ADDR_MAX, 64 * MIB).unwrap();
    assert_eq!(a, (low - 1_000_000) & !0xfff);
    assert_eq!(a % 4096, 0);
    assert!(a + 1_000_000 <= low);
    // A 3 GiB low region is capped by initrd_addr_max.
    let a = initrd_addr(4096, layout::LOW_RAM_END, 0x7fff_ffff, 64 * MIB).unwrap();
    assert_eq!(a, 0x8000_0000 - 4096);
    // Too big: would overlap the kernel, or is bigger than RAM.
    assert!(matches!(
        initrd_addr(200 * MIB, low, DEFAULT_INITRD_ADDR_MAX, 64 * MIB),
        Err(LinuxBootError::InitrdTooBig { .. })
    ));
    assert!(initrd_addr(u64::MAX, low, DEFAULT_INITRD_ADDR_MAX, 0).is_err());
    assert!(initrd_addr(10, low, DEFAULT_INITRD_ADDR_MAX, u64::MAX).is_err());
}

#[test]
fn zero_page_fields_for_a_vmlinux() {
    let p = boot_params(None, 512 * MIB, 42, Some((0x1f00_0000, 0x12_3456))).unwrap();
    let hdr = p.hdr;
    assert_eq!({ hdr.boot_flag }, 0xaa55);
    assert_eq!({ hdr.header }, 0x5372_6448);
    assert_eq!({ hdr.version }, BOOT_PROTOCOL);
    assert_eq!({ hdr.type_of_loader }, 0xff);
    assert_eq!({ hdr.loadflags } & LOADED_HIGH, LOADED_HIGH);
    assert_eq!({ hdr.kernel_alignment }, 0x100_0000);
    assert_eq!({ hdr.cmd_line_ptr }, CMDLINE_ADDR as u32);
    assert_eq!({ p.ext_cmd_line_ptr }, 0);
    assert_eq!({ hdr.cmdline_size }, 42);
    assert_eq!({ hdr.ramdisk_image }, 0x1f00_0000);
    assert_eq!({ hdr.ramdisk_size }, 0x12_3456);
    assert_eq!(({ p.ext_ramdisk_image }, { p.ext_ramdisk_size }), (0, 0));
    assert_eq!(p.e820_entries, 2);
    let e = p.e820_table;
    assert_eq!(({ e[1].addr }, { e[1].size }), (HIMEM_START, 511 * MIB));
    assert_eq!({ e[2].size }, 0);
    // The layout the kernel reads: hdr at 0x1f1, e820 count at 0x1e8, table at 0x2d0.
    let bytes = p.as_slice();
    assert_eq!(bytes[0x1e8], 2);
    assert_eq!(bytes[0x210], 0xff, "type_of_loader");
    assert_eq!(
        u32::from_le_bytes(bytes[0x228..0x22c].try_into().unwrap()),
        0x2_0000,
        "cmd_line_ptr"
    );
    assert_eq!(
        u64::from_le_bytes(bytes[0x2d0 + 20..0x2d0 + 28].try_into().unwrap()),
        HIMEM_START,
        "second e820 entry's address (entries are 20 bytes, packed)"
    );
}

#[test]
fn zero_page_keeps_a_bzimage_header_and_splits_high_initrd() {
    let h = setup_header {
        header: HDRS_MAGIC,
        version: 0x020f,
        loadflags: 0x01 | 0x20,
        xloadflags: XLF_KERNEL_64,
        init_size: 0x200_0000,
        kernel_alignment: 0x20_0000,
        ..Default::default()
    };
    let p = boot_params(Some(h), 8 * GIB, 10, Some((0x1_2345_6000, 0x1_0000_0000))).unwrap();
    let hdr = p.hdr;
    assert_eq!(
        { hdr.loadflags },
        0x21,
        "the kernel's flags kept, LOADED_HIGH set"
    );
    assert_eq!({ hdr.init_size }, 0x200_0000);
    assert_eq!({ hdr.kernel_alignment }, 0x20_0000);
    assert_eq!({ hdr.type_of_loader }, 0xff);
    assert_eq!(
        ({ hdr.ramdisk_image }, { p.ext_ramdisk_image }),
        (0x2345_6000, 1)
    );
    assert_eq!(({ hdr.ramdisk_size }, { p.ext_ramdisk_size }), (0, 1));
    assert_eq!(p.e820_entries, 3);
}

fn vmlinux(entry: u64, paddr: u64, code: &[u8], memsz: u64) -> Vec<u8> {
    let mut eh = Elf64_Ehdr::default();
    eh.e_ident[..4].copy_from_slice(b"\x7fELF");
    eh.e_ident[4] = 2;
    eh.e_ident[5] = 1;
    eh.e_ident[6] = 1;
    eh.e_type = 2;
    eh.e_machine = 62;
    eh.e_version = 1;
    eh.e_entry = entry;
    eh.e_phoff = 64;
    eh.e_ehsize = 64;
    eh.e_phentsize = 56;
    eh.e_phnum = 1;
    let ph = Elf64_Phdr {
        p_type: PT_LOAD,
        p_flags: 5,
        p_offset: 120,
        p_vaddr: 0xffff_ffff_8000_0000 + paddr,
        p_paddr: paddr,
        p_filesz: code.len() as u64,
        p_memsz: memsz,
        p_align: 0x20_0000,
    };
    let mut out = eh.as_slice().to_vec();
    out.extend_from_slice(ph.as_slice());
    out.extend_from_slice(code);
    out
}

fn bzimage(xloadflags: u16, payload: &[u8]) -> Vec<u8> {
    let setup_sects = 1u8;
    let mut img = vec![0u8; (usize::from(setup_sects) + 1) * 512];
    let h = setup_header {
        setup_sects,
        boot_flag: BOOT_FLAG_MAGIC,
        header: HDRS_MAGIC,
        version: 0x020f,
        loadflags: LOADED_HIGH,
        code32_start: 0x10_0000,
        initrd_addr_max: 0x7fff_ffff,
        xloadflags,
        init_size: 0x40_0000,
        ..Default::default()
    };
    img[0x1f1..0x1f1 + std::mem::size_of::<setup_header>()].copy_from_slice(h.as_slice());
    img.extend_from_slice(payload);
    img
}

#[test]
fn loads_a_vmlinux_with_initrd_and_devices() {
    let mem = create_guest_memory(64 * MIB).unwrap();
    let kernel = tmp(
        "vmlinux",
        &vmlinux(0x100_0000, 0x100_0000, &[0x90; 64], 0x1000),
    );
    let initrd = tmp("initrd", &[0xab; 10_000]);
    let config = LinuxConfig {
        kernel: kernel.clone(),
        initrd: Some(initrd.clone()),
        cmdline: "console=ttyS0".into(),
    };
    let e = load(&mem, &config, 64 * MIB, &devices(1)).unwrap();
    assert_eq!(e.kind, KernelKind::Vmlinux);
    assert_eq!(e.entry, 0x100_0000);
    assert_eq!(e.kernel_end, 0x100_1000);
    let (ia, is) = e.initrd.unwrap();
    assert_eq!(is, 10_000);
    assert_eq!(ia, (64 * MIB - 10_000) & !0xfff);
    assert_eq!(mem.read_obj::<u8>(GuestAddress(ia + 9_999)).unwrap(), 0xab);
    assert_eq!(mem.read_obj::<u8>(GuestAddress(0x100_0000)).unwrap(), 0x90);
    let p: boot_params = mem.read_obj(GuestAddress(ZERO_PAGE_ADDR)).unwrap();
    assert_eq!({ p.hdr.ramdisk_image } as u64, ia);
    assert_eq!({ p.hdr.ramdisk_size } as u64, is);
    assert_eq!({ p.hdr.cmdline_size }, e.cmdline_size);
    let mut line = vec![0u8; e.cmdline_size as usize];
    mem.read_slice(&mut line, GuestAddress(CMDLINE_ADDR))
        .unwrap();
    assert_eq!(
        line,
        b"console=ttyS0 virtio_mmio.device=4K@0xd0000000:5\0".to_vec()
    );
    let _ = std::fs::remove_file(kernel);
    let _ = std::fs::remove_file(initrd);
}

#[test]
fn loads_a_bzimage_at_code32_start() {
    let mem = create_guest_memory(64 * MIB).unwrap();
    let kernel = tmp("bzimage", &bzimage(XLF_KERNEL_64, &[0xcc; 4096]));
    let config = LinuxConfig {
        kernel: kernel.clone(),
        initrd: None,
        cmdline: DEFAULT_CMDLINE.into(),
    };
    let e = load(&mem, &config, 64 * MIB, &[]).unwrap();
    assert_eq!(e.kind, KernelKind::BzImage);
    assert_eq!(e.entry, 0x10_0000 + BZIMAGE_ENTRY_64);
    assert_eq!(e.kernel_end, 0x10_0000 + 0x40_0000, "init_size counts");
    assert_eq!(mem.read_obj::<u8>(GuestAddress(0x10_0000)).unwrap(), 0xcc);
    let p: boot_params = mem.read_obj(GuestAddress(ZERO_PAGE_ADDR)).unwrap();
    assert_eq!({ p.hdr.type_of_loader }, 0xff);
    assert_eq!({ p.hdr.initrd_addr_max }, 0x7fff_ffff);
    assert_eq!({ p.hdr.ramdisk_size }, 0);
    let _ = std::fs::remove_file(kernel);
}

#[test]
fn rejects_bad_kernels() {
    let mem = create_guest_memory(32 * MIB).unwrap();
    let cfg = |p: &Path| LinuxConfig {
        kernel: p.into(),
        initrd: None,
        cmdline: String::new(),
    };
    let garbage = tmp("garbage", b"not a kernel at all");
    assert!(matches!(
        load(&mem, &cfg(&garbage), 32 * MIB, &[]),
        Err(LinuxBootError::UnknownKernel(_))
    ));
    let bz32 = tmp("bz32", &bzimage(0, &[0; 512]));
    assert!(matches!(
        load(&mem, &cfg(&bz32), 32 * MIB, &[]),
        Err(LinuxBootError::Not64Bit(_))
    ));
    let big = tmp("big", &vmlinux(0x100_0000, 0x100_0000, &[0; 16], 64 * MIB));
    assert!(matches!(
        load(&mem, &cfg(&big), 32 * MIB, &[]),
        Err(LinuxBootError::KernelTooBig { .. })
    ));
    assert!(matches!(
        load(&mem, &cfg(Path::new("/nonexistent/vmlinux")), 32 * MIB, &[]),
        Err(LinuxBootError::Read { .. })
    ));
    let ok = tmp("ok", &vmlinux(0x100_0000, 0x100_0000, &[0; 16], 0x1000));
    let mut c = cfg(&ok);
    c.initrd = Some("/nonexistent/initrd".into());
    assert!(matches!(
        load(&mem, &c, 32 * MIB, &[]),
        Err(LinuxBootError::Read { .. })
    ));
    for p in [garbage, bz32, big, ok] {
        let _ = std::fs::remove_file(p);
    }
}
