//! The vmm's payload loader (`vmm::loader::load_payload`: our checks, then linux-loader's
//! ELF loader) on arbitrary files into 8 MiB of guest RAM. A bad image must be an error,
//! never a panic, a huge allocation or a write outside guest RAM.
#![no_main]

use std::io::Write;
use std::path::PathBuf;
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use vm_memory::GuestMemoryMmap;

const RAM: u64 = 8 << 20;

fn mem() -> &'static GuestMemoryMmap {
    static M: OnceLock<GuestMemoryMmap> = OnceLock::new();
    M.get_or_init(|| vmm::memory::create_guest_memory(RAM).expect("guest ram"))
}

fn path() -> &'static PathBuf {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| std::env::temp_dir().join(format!("fuzz-elf-{}", std::process::id())))
}

fuzz_target!(|data: &[u8]| {
    let p = path();
    std::fs::File::create(p)
        .and_then(|mut f| f.write_all(data))
        .expect("write image");
    let low_ram_end = vmm::layout::ram_regions(RAM)[0].1;
    if let Ok(l) = vmm::loader::load_payload(mem(), p, low_ram_end) {
        assert!(l.entry >= vmm::layout::PAYLOAD_START && l.entry < low_ram_end);
    }
});
