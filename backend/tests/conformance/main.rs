//! One conformance suite over the `Backend` trait: every test runs on the sim backend, and
//! on the cuda backend where a CUDA GPU is present (otherwise it says `SKIPPED (cuda): why`
//! and checks sim only). With `VGPU_REQUIRE_CUDA=1` a missing GPU fails the suite instead,
//! so a run on the GPU machine cannot pass by skipping.
//!
//! Results are compared bit for bit with CPU references that follow the documented
//! semantics (docs/protocol.md, "Built-in kernels").

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use vgpu_backend::cuda::ContextLimits;
use vgpu_backend::{
    Backend, BackendError, CudaConfig, CudaGpu, HostRegion, LaunchConfig, ModuleImage, SimConfig,
    SimGpu, DEFAULT_VA_BASE,
};
use vgpu_proto::builtin::{fnv1a64, FNV_OFFSET};
use vgpu_proto::{Access, ArgValue, Status};
use vm_memory::VolatileSlice;

mod charging;
mod kernels;
mod memory;
mod sharing;

const MIB: u64 = 1 << 20;

/// Why cuda is not tested here, or None when it is.
fn cuda_skip() -> Option<&'static str> {
    static WHY: OnceLock<Option<String>> = OnceLock::new();
    WHY.get_or_init(|| match CudaGpu::probe() {
        Ok(p) => {
            eprintln!("cuda: testing on {} ({} device(s))", p.name, p.devices);
            None
        }
        Err(why) => {
            assert!(
                std::env::var_os("VGPU_REQUIRE_CUDA").is_none(),
                "VGPU_REQUIRE_CUDA is set but the cuda backend cannot run: {why}"
            );
            Some(why)
        }
    })
    .as_deref()
}

/// What GPU 0's context reserves at the default limits: charged to every cuda share at
/// start, before anything is allocated.
fn cuda_reserve() -> u64 {
    static RESERVE: OnceLock<u64> = OnceLock::new();
    *RESERVE.get_or_init(|| {
        CudaGpu::context_reserve_of(0, &ContextLimits::default())
            .expect("context reserve")
            .total()
            .expect("reserve fits u64")
    })
}

/// A fresh cuda backend with its own address range (tests run in parallel in one process,
/// all in the device's primary context) and `memory` bytes to allocate beside its context
/// reserve.
fn cuda(memory: u64) -> CudaGpu {
    cuda_with(memory + cuda_reserve(), ContextLimits::default())
}

/// A fresh cuda backend whose share is `memory` (the context reserve included) and whose
/// context has `limits`.
fn cuda_with(memory: u64, limits: ContextLimits) -> CudaGpu {
    try_cuda(memory, limits).expect("cuda backend")
}

fn try_cuda(memory: u64, limits: ContextLimits) -> Result<CudaGpu, BackendError> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let k = NEXT.fetch_add(1, Ordering::Relaxed);
    CudaGpu::new(CudaConfig {
        ordinal: 0,
        memory,
        limits,
        va_base: DEFAULT_VA_BASE + (k + 1) * (64 << 30),
        va_size: 16 << 30,
        ..CudaConfig::default()
    })
}

fn sim(memory: u64) -> SimGpu {
    SimGpu::new(SimConfig {
        memory,
        va_size: 16 << 30,
        threads: 2,
        ..SimConfig::default()
    })
    .expect("sim backend")
}

/// Runs `f` on a sim backend and, where possible, on a cuda backend, each with `memory`
/// bytes of device memory.
fn each(memory: u64, f: impl Fn(&str, &dyn Backend)) {
    f("sim", &sim(memory));
    match cuda_skip() {
        None => f("cuda", &cuda(memory)),
        Some(why) => eprintln!("SKIPPED (cuda): {why}"),
    }
}

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

fn builtin(b: &dyn Backend, name: &str) -> u64 {
    let m = b
        .module_load(ModuleImage::Builtin(b"builtin"))
        .expect("builtin module");
    b.get_function(m, name.as_bytes()).expect("function").handle
}

fn r(addr: u64) -> ArgValue {
    ArgValue::Ptr {
        addr,
        access: Access::Read,
    }
}
fn w(addr: u64) -> ArgValue {
    ArgValue::Ptr {
        addr,
        access: Access::Write,
    }
}
fn rw(addr: u64) -> ArgValue {
    ArgValue::Ptr {
        addr,
        access: Access::ReadWrite,
    }
}

const CFG: LaunchConfig = LaunchConfig {
    grid: [1; 3],
    block: [1; 3],
    shared_bytes: 0,
};

fn status<T: std::fmt::Debug>(r: Result<T, BackendError>) -> Status {
    r.expect_err("must fail").status()
}
