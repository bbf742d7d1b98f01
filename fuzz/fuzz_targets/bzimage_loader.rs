//! The vmm's Linux loader (`vmm::boot::linux::load`: kind detection, bzImage or vmlinux
//! through linux-loader, our size checks, the zero page) on arbitrary kernel files into
//! 64 MiB of guest RAM, with a small initrd. A bad kernel must be an error, never a panic,
//! an overflow, a huge allocation or a write outside guest RAM.
#![no_main]

use std::io::Write;
use std::path::PathBuf;
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use vm_memory::GuestMemoryMmap;
use vmm::boot::linux::{load, MmioAnnounce};
use vmm::LinuxConfig;

const RAM: u64 = 64 << 20;

fn mem() -> &'static GuestMemoryMmap {
    static M: OnceLock<GuestMemoryMmap> = OnceLock::new();
    M.get_or_init(|| vmm::memory::create_guest_memory(RAM).expect("guest ram"))
}

fn paths() -> &'static (PathBuf, PathBuf) {
    static P: OnceLock<(PathBuf, PathBuf)> = OnceLock::new();
    P.get_or_init(|| {
        let dir = std::env::temp_dir();
        let pid = std::process::id();
        let initrd = dir.join(format!("fuzz-initrd-{pid}"));
        std::fs::write(&initrd, [0x5a; 4096]).expect("initrd");
        (dir.join(format!("fuzz-kernel-{pid}")), initrd)
    })
}

fuzz_target!(|data: &[u8]| {
    let (kernel, initrd) = paths();
    std::fs::File::create(kernel)
        .and_then(|mut f| f.write_all(data))
        .expect("write image");
    let cfg = LinuxConfig {
        kernel: kernel.clone(),
        initrd: (data.first().copied().unwrap_or(0) & 1 == 1).then(|| initrd.clone()),
        cmdline: vmm::DEFAULT_CMDLINE.into(),
    };
    let dev = [MmioAnnounce {
        base: 0xd000_0000,
        size: 0x1000,
        gsi: 5,
    }];
    if let Ok(e) = load(mem(), &cfg, RAM, &dev) {
        assert!(e.kernel_end <= RAM);
    }
});
