//! `vgpu-nvml`: a libnvidia-ml-compatible library for a program on a vGPU. Installed as
//! `libnvidia-ml.so.1` beside the vGPU CUDA library (`vgpu-cuda install`), it answers
//! NVML's device queries (`nvmlDeviceGetCount_v2`, `nvmlDeviceGetMemoryInfo`,
//! `nvmlDeviceGetComputeRunningProcesses_v3`, ...) with the vGPU's own identity, memory
//! share and use, never the physical GPU's and never another tenant's. It reaches the vGPU
//! through the vGPU CUDA library of the same process (`cuda.rs`), so NVML and CUDA share
//! the one connection the vGPU's worker serves. docs/nvml.md lists every answer.
//!
//! `nvmlInit` does not connect: it checks that a vGPU is configured (what `cuInit` would
//! open) and answers `NVML_ERROR_DRIVER_NOT_LOADED` with a log line when none is.
//! `nvmlDeviceGetCount_v2` and the handle lookups by index answer without connecting too,
//! so a program that only counts devices (PyTorch's NVML-based check) leaves the vGPU to
//! whichever process uses it. The first query that needs the device connects, as `cuInit`.
//!
//! Every exported function catches panics (a bug answers `NVML_ERROR_UNKNOWN` instead of
//! aborting the program), checks every pointer and handle C passes, and answers
//! `NVML_ERROR_UNINITIALIZED` before `nvmlInit`.

pub mod cuda;
pub mod device;
pub mod stubs;
pub mod system;
pub mod types;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Mutex, Once};

use types::{ret, NvmlDevice, NvmlReturn};

/// Environment variable with the library's log filter (tracing's `EnvFilter` syntax;
/// default `warn`). Logs go to stderr.
pub const ENV_LOG: &str = "VGPU_NVML_LOG";

/// Installs a stderr logger once, unless the program already installed one.
fn init_logging() {
    static LOG: Once = Once::new();
    LOG.call_once(|| {
        let filter = tracing_subscriber::EnvFilter::try_from_env(ENV_LOG)
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
        let _ = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .with_ansi(false)
            .try_init();
    });
}

/// Runs the body of an exported function: panics become `NVML_ERROR_UNKNOWN`, `Err(code)`
/// becomes `code`. Nothing unwinds into C.
pub(crate) fn guard(name: &'static str, f: impl FnOnce() -> Result<(), NvmlReturn>) -> NvmlReturn {
    let result = catch_unwind(AssertUnwindSafe(|| {
        init_logging();
        f()
    }));
    let code = match result {
        Ok(Ok(())) => return ret::SUCCESS,
        Ok(Err(code)) => code,
        Err(_) => {
            let _ = catch_unwind(|| {
                tracing::error!(
                    function = name,
                    "internal error (panic) caught at the C boundary"
                )
            });
            ret::UNKNOWN
        }
    };
    let _ = catch_unwind(|| tracing::debug!(function = name, code, "failed"));
    code
}

/// How many `nvmlInit` calls are not yet balanced by `nvmlShutdown`.
static INITS: Mutex<u32> = Mutex::new(0);

fn inits() -> std::sync::MutexGuard<'static, u32> {
    INITS.lock().unwrap_or_else(|e| e.into_inner())
}

/// The CUDA library, when NVML is initialised; `UNINITIALIZED` otherwise.
pub(crate) fn initialised() -> Result<&'static cuda::Cuda, NvmlReturn> {
    if *inits() == 0 {
        return Err(ret::UNINITIALIZED);
    }
    cuda::loaded().ok_or(ret::UNINITIALIZED)
}

/// The one device handle: the address of a private static, compared and never
/// dereferenced by anyone.
static DEVICE: u8 = 0;

pub(crate) fn handle() -> NvmlDevice {
    std::ptr::addr_of!(DEVICE).cast_mut().cast()
}

/// The CUDA library, after checking NVML is initialised and `dev` is the vGPU's handle.
pub(crate) fn device(dev: NvmlDevice) -> Result<&'static cuda::Cuda, NvmlReturn> {
    let c = initialised()?;
    if dev != handle() {
        return Err(ret::INVALID_ARGUMENT);
    }
    Ok(c)
}

/// Writes `value` through a pointer from C, refusing NULL.
///
/// # Safety
/// `p` must be NULL or valid for a write of `T`.
pub(crate) unsafe fn out<T>(p: *mut T, value: T) -> Result<(), NvmlReturn> {
    if p.is_null() {
        return Err(ret::INVALID_ARGUMENT);
    }
    // SAFETY: non-null, and valid for writes by the caller's contract; unaligned is
    // allowed so a packed C struct field works too.
    unsafe { p.write_unaligned(value) };
    Ok(())
}

/// Copies `text` and a NUL into the caller's buffer of `len` bytes:
/// `NVML_ERROR_INSUFFICIENT_SIZE` when it does not fit (NVML writes nothing then).
///
/// # Safety
/// `buf` must be NULL or valid for writes of `len` bytes.
pub(crate) unsafe fn out_text(
    buf: *mut std::ffi::c_char,
    len: std::ffi::c_uint,
    text: &str,
) -> Result<(), NvmlReturn> {
    if buf.is_null() {
        return Err(ret::INVALID_ARGUMENT);
    }
    let bytes = text.as_bytes();
    if bytes.len() >= len as usize {
        return Err(ret::INSUFFICIENT_SIZE);
    }
    // SAFETY: the caller's buffer holds `len` bytes; we write bytes.len() + 1 <= len.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), buf.cast::<u8>(), bytes.len());
        buf.add(bytes.len()).write(0);
    }
    Ok(())
}
