//! The destination vmm's migration stream decoder (`vmm::migration::wire`): headers, the
//! per-type length caps, the JSON description and state, and RAM runs applied to 8 MiB of
//! guest RAM. Any input must end in a clean error, never a panic, an allocation beyond the
//! caps or a write outside guest RAM.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use vm_memory::GuestMemoryMmap;
use vmm::migration::wire::{apply_ram, read_message, Message, MAX_STATE};

const RAM: u64 = 8 << 20;

fn mem() -> &'static GuestMemoryMmap {
    static M: OnceLock<GuestMemoryMmap> = OnceLock::new();
    M.get_or_init(|| vmm::memory::create_guest_memory(RAM).expect("guest ram"))
}

fuzz_target!(|data: &[u8]| {
    let mut r = data;
    let mut buf = Vec::new();
    loop {
        match read_message(&mut r, &mut buf) {
            Ok(Message::Ram { gpa, data }) => {
                if apply_ram(mem(), gpa, data).is_ok() {
                    assert!(gpa + data.len() as u64 <= RAM);
                }
            }
            Ok(_) => {}
            Err(_) => break,
        }
        assert!(buf.len() <= MAX_STATE);
    }
});
