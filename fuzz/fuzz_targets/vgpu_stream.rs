//! The destination worker's vGPU state stream (`vgpu_migration::wire` and
//! `Migratable::receive_from`): headers, per-type caps, then the whole receive path into
//! a fresh simulated vGPU. Any input must end in a clean error or a complete state, never
//! a panic, an allocation beyond the caps or a placement outside the vGPU's range; a
//! refused stream leaves no device memory behind.
#![no_main]

use std::io::{Read, Write};
use std::sync::Arc;

use libfuzzer_sys::fuzz_target;
use vgpu_backend::{SimConfig, SimGpu};
use vgpu_migration::wire::{read_message, MAX_PAYLOAD};
use vgpu_migration::Migratable;

/// Reads the fuzzer's bytes; writes go nowhere.
struct Duplex<'a>(&'a [u8]);

impl Read for Duplex<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.0.read(buf)
    }
}

impl Write for Duplex<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fuzz_target!(|data: &[u8]| {
    let mut r = data;
    let mut buf = Vec::new();
    while read_message(&mut r, &mut buf).is_ok() {
        assert!(buf.len() <= MAX_PAYLOAD);
    }
    let Ok(sim) = SimGpu::new(SimConfig {
        memory: 16 << 20,
        va_size: 1 << 30,
        threads: 1,
        ..SimConfig::default()
    }) else {
        return;
    };
    let m = Migratable::new(Arc::new(sim));
    // The token is empty so that inputs reach past the hello.
    match m.receive_from(Duplex(data), b"", || {}) {
        Ok(_) => {}
        Err(_) => assert_eq!(m.current().memory_usage().used, 0),
    }
});
