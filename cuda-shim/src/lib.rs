//! `vgpu-cuda`: a libcuda-compatible library. It exports the CUDA Driver API C ABI
//! (`cuInit`, `cuMemAlloc_v2`, `cuLaunchKernel`, ..., and `cuGetProcAddress` for loaders
//! that resolve entry points by name) over guest-driver's vGPU API, so unmodified CUDA
//! programs run on a vGPU: in a VM through the Linux transport, in a host or container
//! process through the process transport (`VGPU_SOCKET=/path/to/worker.sock`).
//! Installed as `libcuda.so.1` (`vgpu-cuda install --prefix DIR`); docs/cuda-api.md lists
//! what is supported and what everything else answers.
//!
//! Every exported function catches panics (a bug answers CUDA_ERROR_UNKNOWN instead of
//! aborting the program), checks every pointer and handle C passes, and answers what the
//! real driver answers for bad input.

pub mod api;
pub mod context;
pub mod driver;
pub mod error;
pub mod extra;
pub mod host_map;
pub mod image;
pub mod integrity;
pub mod queue;
pub mod transport;
pub mod types;
pub mod watch;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Once;

use types::{res, CUresult};

/// Environment variable with the library's log filter (tracing's `EnvFilter` syntax;
/// default `warn`). Logs go to stderr.
pub const ENV_LOG: &str = "VGPU_CUDA_LOG";

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

/// A thread-local with a destructor: `try_with` fails once the thread's locals are being
/// destroyed.
struct Alive;

impl Drop for Alive {
    fn drop(&mut self) {}
}

thread_local! {
    static ALIVE: Alive = const { Alive };
}

/// Runs the body of an exported function: panics become CUDA_ERROR_UNKNOWN, `Err(code)`
/// becomes `code`. Nothing unwinds into C: logging too runs under `catch_unwind`, since a
/// call made while the thread's locals are being destroyed (a runtime's exit handlers)
/// cannot reach the logger's thread-local buffers.
pub(crate) fn guard(name: &'static str, f: impl FnOnce() -> Result<(), CUresult>) -> CUresult {
    // Touched before anything logs in this thread, so it is destroyed after the logger's
    // thread-local buffers: once it is gone, so are they, and the call logs nothing.
    let can_log = ALIVE.try_with(|_| ()).is_ok();
    let result = catch_unwind(AssertUnwindSafe(|| {
        init_logging();
        f()
    }));
    if can_log && matches!(result, Ok(Ok(()))) {
        // `VGPU_CUDA_LOG=vgpu_cuda=trace` lists every call a program makes.
        let _ = catch_unwind(|| tracing::trace!(function = name, "ok"));
    }
    let (code, panicked) = match result {
        Ok(Ok(())) => return res::SUCCESS,
        Ok(Err(code)) => (code, false),
        Err(_) => (res::UNKNOWN, true),
    };
    if !can_log {
        return code;
    }
    let _ = catch_unwind(|| {
        if panicked {
            tracing::error!(
                function = name,
                "internal error (panic) caught at the C boundary"
            );
        } else {
            tracing::debug!(function = name, code, "failed");
        }
    });
    code
}

/// Writes `value` through a pointer from C, refusing NULL.
///
/// # Safety
/// `p` must be NULL or valid for a write of `T`.
pub(crate) unsafe fn out<T>(p: *mut T, value: T) -> Result<(), CUresult> {
    if p.is_null() {
        return Err(res::INVALID_VALUE);
    }
    // SAFETY: non-null, and valid for writes by the caller's contract; unaligned is
    // allowed so a packed C struct field works too.
    unsafe { p.write_unaligned(value) };
    Ok(())
}
