//! One conformance suite over the `Backend` trait: every test runs on the sim backend, and
//! on the cuda backend where a CUDA GPU is present (otherwise it says `SKIPPED (cuda): why`
//! and checks sim only). With `VGPU_REQUIRE_CUDA=1` a missing GPU fails the suite instead,
//! so a run on the GPU machine cannot pass by skipping.
//!
//! Results are compared bit for bit with CPU references that follow the documented
//! semantics (docs/protocol.md, "Built-in kernels").

use std::time::{Duration, Instant};

use vgpu_backend::cuda::ContextLimits;
use vgpu_backend::{
    Backend, BackendError, CudaGpu, HostRegion, LaunchConfig, LaunchOne, ModuleImage,
};
use vgpu_proto::builtin::{fnv1a64, FNV_OFFSET};
use vgpu_proto::{ArgValue, Status};
use vm_memory::VolatileSlice;

#[path = "../common/mod.rs"]
mod common;
use common::*;

mod charging;
mod kernels;
mod memory;
mod sharing;

fn put(b: &dyn Backend, addr: u64, bytes: &[u8]) -> Result<u64, BackendError> {
    let mut buf = bytes.to_vec();
    b.copy_htod(addr, &VolatileSlice::from(&mut buf[..]))
}

fn get(b: &dyn Backend, addr: u64, len: usize) -> Result<Vec<u8>, BackendError> {
    let mut buf = vec![0u8; len];
    b.copy_dtoh(addr, &VolatileSlice::from(&mut buf[..]))?;
    Ok(buf)
}

fn words(v: &[u32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn floats(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn get_u32(b: &dyn Backend, addr: u64, n: usize) -> Vec<u32> {
    get(b, addr, n * 4)
        .expect("dtoh")
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn get_f32_bits(b: &dyn Backend, addr: u64, n: usize) -> Vec<u32> {
    get_u32(b, addr, n)
}

/// Pseudo-random f32s in [-50, 93), with fractions, deterministic per seed.
fn data(n: usize, seed: u32) -> Vec<f32> {
    let mut x = seed.wrapping_mul(0x9e37_79b9) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            (x % 14_300) as f32 / 100.0 - 50.0 + (x >> 20) as f32 / 4096.0
        })
        .collect()
}

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u64 * 131 + u64::from(seed) * 7 + (i as u64 >> 9)) as u8)
        .collect()
}
