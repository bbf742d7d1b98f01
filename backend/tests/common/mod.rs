//! What the backend's test binaries share: the sim and cuda backends they run on (cuda
//! where a GPU is present, otherwise `SKIPPED (cuda): why`; with `VGPU_REQUIRE_CUDA=1` a
//! missing GPU fails instead), built-in kernels and kernel arguments.

// Each test binary uses its own part of this.
#![allow(dead_code)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use vgpu_backend::cuda::ContextLimits;
use vgpu_backend::{
    Backend, BackendError, CudaConfig, CudaGpu, LaunchConfig, ModuleImage, SimConfig, SimGpu,
    DEFAULT_VA_BASE,
};
use vgpu_proto::{Access, ArgValue, Status};

pub const MIB: u64 = 1 << 20;

/// Why cuda is not tested here, or None when it is.
pub fn cuda_skip() -> Option<&'static str> {
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
pub fn cuda_reserve() -> u64 {
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
pub fn cuda(memory: u64) -> CudaGpu {
    cuda_with(memory + cuda_reserve(), ContextLimits::default())
}

/// A fresh cuda backend whose share is `memory` (the context reserve included) and whose
/// context has `limits`.
pub fn cuda_with(memory: u64, limits: ContextLimits) -> CudaGpu {
    try_cuda(memory, limits).expect("cuda backend")
}

pub fn try_cuda(memory: u64, limits: ContextLimits) -> Result<CudaGpu, BackendError> {
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

pub fn sim(memory: u64) -> SimGpu {
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
pub fn each(memory: u64, f: impl Fn(&str, &dyn Backend)) {
    f("sim", &sim(memory));
    match cuda_skip() {
        None => f("cuda", &cuda(memory)),
        Some(why) => eprintln!("SKIPPED (cuda): {why}"),
    }
}

/// The handle of built-in kernel `name`.
pub fn builtin(b: &dyn Backend, name: &str) -> u64 {
    let m = b
        .modules()
        .module_load(ModuleImage::Builtin(b"builtin"))
        .expect("builtin module");
    b.modules()
        .get_function(m, name.as_bytes())
        .expect("function")
        .handle
}

pub fn r(addr: u64) -> ArgValue {
    ArgValue::Ptr {
        addr,
        access: Access::Read,
    }
}

pub fn w(addr: u64) -> ArgValue {
    ArgValue::Ptr {
        addr,
        access: Access::Write,
    }
}

pub fn rw(addr: u64) -> ArgValue {
    ArgValue::Ptr {
        addr,
        access: Access::ReadWrite,
    }
}

/// One thread.
pub const CFG: LaunchConfig = LaunchConfig {
    grid: [1; 3],
    block: [1; 3],
    shared_bytes: 0,
};

/// The status of an error that must happen.
pub fn status<T: std::fmt::Debug>(r: Result<T, BackendError>) -> Status {
    r.expect_err("must fail").status()
}
