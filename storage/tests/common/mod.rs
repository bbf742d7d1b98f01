//! Test helpers: backing files with known contents, removed on drop.
#![allow(dead_code)]

use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};

pub struct TempFile(pub PathBuf);

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// The value stored at u64 index `i` of a pattern file.
pub fn pattern(i: u64) -> u64 {
    i.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ (i >> 7)
}

fn path(tag: &str) -> PathBuf {
    static N: AtomicU32 = AtomicU32::new(0);
    std::env::temp_dir().join(format!(
        "vgpu-storage-{tag}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ))
}

/// A file of `words` u64 values `pattern(0..words)`.
pub fn pattern_file(tag: &str, words: u64) -> TempFile {
    let p = path(tag);
    let bytes: Vec<u8> = (0..words).flat_map(|i| pattern(i).to_le_bytes()).collect();
    std::fs::write(&p, bytes).expect("write pattern file");
    TempFile(p)
}

/// A file holding the given byte chunks back to back.
pub fn file_with(tag: &str, parts: &[&[u8]]) -> TempFile {
    let p = path(tag);
    let mut f = std::fs::File::create(&p).expect("create");
    for part in parts {
        f.write_all(part).expect("write");
    }
    TempFile(p)
}

/// Deterministic xorshift for test data.
pub struct Rng(pub u64);
impl Rng {
    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
}

pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
}
