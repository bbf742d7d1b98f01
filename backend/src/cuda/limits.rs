//! The context's limits and what they reserve on the GPU.
//!
//! The driver reserves local memory for every thread the GPU can hold at once: the
//! per-thread stack limit times the multiprocessors times the most threads one holds (on
//! the H200, 132 × 2048 × 1 KiB = 264 MiB at the default 1 KiB stack), plus the device
//! `malloc` heap and the printf FIFO. Each worker sets the three limits explicitly when its
//! context starts ([`apply`]), reads them back (the driver rounds: the stack to 16 bytes,
//! the heap to at least 4 MiB, the FIFO to at least 512 KiB) and charges the sum to the
//! vGPU's ledger. A kernel that needs more local memory per thread than the stack limit
//! would make the driver grow the reservation at launch (and keep it grown: the driver
//! raises the stack limit itself), so such launches are refused before the driver sees
//! them (docs/cuda.md, "Context reserve").

use std::ffi::c_int;

use cudarc::driver::sys::{self, CUdevice_attribute, CUlimit};

use super::driver::{check, CuError};

/// Per-thread stack by default: the driver's own default.
pub const DEFAULT_STACK: u64 = 1 << 10;
/// Device `malloc` heap by default: the driver's own default.
pub const DEFAULT_HEAP: u64 = 8 << 20;
/// printf FIFO by default.
pub const DEFAULT_PRINTF_FIFO: u64 = 1 << 20;

/// The limits a worker sets on its context (`vgpu-worker --cuda-stack`, `--cuda-heap`,
/// `--cuda-printf-fifo`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ContextLimits {
    /// Stack (local memory) per GPU thread, in bytes (`CU_LIMIT_STACK_SIZE`).
    pub stack_bytes: u64,
    /// Device `malloc` heap, in bytes (`CU_LIMIT_MALLOC_HEAP_SIZE`).
    pub heap_bytes: u64,
    /// printf FIFO, in bytes (`CU_LIMIT_PRINTF_FIFO_SIZE`).
    pub printf_fifo_bytes: u64,
}

impl Default for ContextLimits {
    fn default() -> Self {
        Self {
            stack_bytes: DEFAULT_STACK,
            heap_bytes: DEFAULT_HEAP,
            printf_fifo_bytes: DEFAULT_PRINTF_FIFO,
        }
    }
}

/// What a context reserves on its GPU, from the limits as the driver took them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ContextReserve {
    /// Stack per thread, as read back.
    pub stack_bytes: u64,
    /// Multiprocessors of the GPU.
    pub sms: u64,
    /// Most resident threads per multiprocessor.
    pub threads_per_sm: u64,
    /// Device heap, as read back.
    pub heap_bytes: u64,
    /// printf FIFO, as read back.
    pub printf_fifo_bytes: u64,
}

impl ContextReserve {
    /// Bytes of local memory for every resident thread.
    pub fn stacks(&self) -> Option<u64> {
        self.stack_bytes
            .checked_mul(self.sms)?
            .checked_mul(self.threads_per_sm)
    }

    /// The whole reserve in bytes: stacks + heap + FIFO; None if it overflows.
    pub fn total(&self) -> Option<u64> {
        self.stacks()?
            .checked_add(self.heap_bytes)?
            .checked_add(self.printf_fifo_bytes)
    }

    /// How the reserve is made up, for messages.
    pub fn detail(&self) -> String {
        format!(
            "stack {} B x {} SMs x {} threads per SM + heap {} B + printf FIFO {} B",
            self.stack_bytes,
            self.sms,
            self.threads_per_sm,
            self.heap_bytes,
            self.printf_fifo_bytes
        )
    }
}

/// One device attribute.
fn attribute(dev: sys::CUdevice, attr: CUdevice_attribute) -> Result<u64, CuError> {
    let mut v: c_int = 0;
    check(
        // SAFETY: writes one int into `v`, which lives on this frame.
        unsafe { sys::cuDeviceGetAttribute(&mut v, attr, dev) },
        "cuDeviceGetAttribute",
    )?;
    Ok(u64::try_from(v).unwrap_or(0))
}

/// Sets `limit` to `bytes` on the current context and reads back what the driver took.
/// The heap and the printf FIFO cannot change once a kernel of the context used them (the
/// driver answers `CUDA_ERROR_INVALID_VALUE`; only a context shared within one process,
/// never a worker's, gets there): then what the driver holds is read and charged.
fn set(limit: CUlimit, bytes: u64, call: &'static str) -> Result<u64, CuError> {
    let want = usize::try_from(bytes).unwrap_or(usize::MAX);
    let set = check(
        // SAFETY: plain FFI call on the context current on this thread (bound by the caller).
        unsafe { sys::cuCtxSetLimit(limit, want) },
        call,
    );
    match set {
        Ok(()) => {}
        Err(e)
            if e.code == sys::CUresult::CUDA_ERROR_INVALID_VALUE
                && limit != CUlimit::CU_LIMIT_STACK_SIZE =>
        {
            tracing::warn!(error = %e, wanted = bytes,
                "the driver kept the context's limit (fixed once a kernel used it, or the value is out of range); charging what it holds");
        }
        Err(e) => return Err(e),
    }
    let mut got: usize = 0;
    check(
        // SAFETY: writes one size_t into `got`, which lives on this frame.
        unsafe { sys::cuCtxGetLimit(&mut got, limit) },
        "cuCtxGetLimit",
    )?;
    Ok(got as u64)
}

/// Sets `limits` on the context current on this thread (of device `dev`) and returns what
/// they reserve.
pub(super) fn apply(dev: sys::CUdevice, limits: &ContextLimits) -> Result<ContextReserve, CuError> {
    use CUdevice_attribute::*;
    // Backends of one process share the primary context (tests; a migration target):
    // each sets and reads back its limits without another's settings in between.
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = crate::sync::lock(&ONE_AT_A_TIME);
    Ok(ContextReserve {
        stack_bytes: set(
            CUlimit::CU_LIMIT_STACK_SIZE,
            limits.stack_bytes,
            "cuCtxSetLimit(CU_LIMIT_STACK_SIZE)",
        )?,
        heap_bytes: set(
            CUlimit::CU_LIMIT_MALLOC_HEAP_SIZE,
            limits.heap_bytes,
            "cuCtxSetLimit(CU_LIMIT_MALLOC_HEAP_SIZE)",
        )?,
        printf_fifo_bytes: set(
            CUlimit::CU_LIMIT_PRINTF_FIFO_SIZE,
            limits.printf_fifo_bytes,
            "cuCtxSetLimit(CU_LIMIT_PRINTF_FIFO_SIZE)",
        )?,
        sms: attribute(dev, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?,
        threads_per_sm: attribute(dev, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR)?,
    })
}

impl super::CudaGpu {
    /// What GPU `ordinal`'s context reserves under `limits` (the bytes a vGPU's share
    /// must hold before it allocates anything), as [`CudaGpu::new`](super::CudaGpu::new)
    /// charges it.
    pub fn context_reserve_of(
        ordinal: i32,
        limits: &ContextLimits,
    ) -> crate::Result<ContextReserve> {
        super::driver::init().map_err(crate::BackendError::Device)?;
        let (dev, _) = super::driver::device(ordinal).map_err(super::memory::dev_err)?;
        let _ctx = super::driver::Context::primary(dev).map_err(super::memory::dev_err)?;
        apply(dev, limits).map_err(super::memory::dev_err)
    }

    /// What this vGPU's context reserves (charged to its memory share since it started).
    pub fn context_reserve(&self) -> ContextReserve {
        self.reserve
    }
}

/// Refuses a function needing `need` bytes of local memory per thread when the context's
/// stack limit is `limit`.
pub(super) fn check_local(function: &str, need: u64, limit: u64) -> crate::Result<()> {
    if need > limit {
        return Err(crate::BackendError::LocalMemory {
            function: function.to_string(),
            need,
            limit,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_h200_reserve_at_the_defaults() {
        let r = ContextReserve {
            stack_bytes: 1024,
            sms: 132,
            threads_per_sm: 2048,
            heap_bytes: 8 << 20,
            printf_fifo_bytes: 1 << 20,
        };
        assert_eq!(r.stacks(), Some(264 << 20));
        assert_eq!(r.total(), Some(273 << 20));
        assert!(r.detail().contains("132 SMs"), "{}", r.detail());
        let huge = ContextReserve {
            stack_bytes: u64::MAX / 2,
            ..r
        };
        assert_eq!(huge.total(), None, "overflow is no reserve");
    }

    #[test]
    fn local_memory_beyond_the_stack_is_refused_with_the_figures() {
        check_local("f", 1024, 1024).expect("at the limit");
        let e = check_local("big_local", 65536, 1024).expect_err("over");
        assert_eq!(e.status(), vgpu_proto::Status::OutOfMemory);
        let m = e.to_string();
        for part in ["big_local", "65536", "1024", "--cuda-stack"] {
            assert!(m.contains(part), "{m}");
        }
    }
}
