//! Thin owners of CUDA driver objects over cudarc's raw bindings (`cudarc::driver::sys`,
//! libcuda loaded at run time): the error type, loading and initialising the driver, the
//! worker's one context, streams, events and small device buffers. Every other file of the
//! cuda backend goes through these; each `unsafe` call is a plain FFI call whose pointer
//! arguments are spelled out at the call.

use std::ffi::{c_char, c_int, CStr};
use std::fmt;
use std::sync::{Arc, OnceLock};

use cudarc::driver::sys::{self, CUresult};

/// Oldest driver the backend runs on: CUDA 13.0 (driver 580). The shipped built-in PTX is
/// ISA 9.0 (nvcc 13.0, `backend/kernels/build-ptx.sh`); the API calls need 12.8
/// (`cuEventElapsedTime_v2`). For an older driver, regenerate the PTX with an older nvcc
/// and lower this.
pub const MIN_DRIVER_VERSION: i32 = 13000;

/// A failed driver call: which call, and the driver's code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CuError {
    /// The driver's result code.
    pub code: CUresult,
    /// The driver function that returned it.
    pub call: &'static str,
}

impl CuError {
    /// The code's name, e.g. `CUDA_ERROR_ILLEGAL_ADDRESS`.
    pub fn name(&self) -> String {
        let mut p: *const c_char = std::ptr::null();
        // SAFETY: cuGetErrorName writes a pointer to a static NUL-terminated string (or
        // leaves it null) into `p`, which lives on this frame.
        let rc = unsafe { sys::cuGetErrorName(self.code, &mut p) };
        if rc != CUresult::CUDA_SUCCESS || p.is_null() {
            return format!("{:?}", self.code);
        }
        // SAFETY: the driver returned a pointer to a static C string.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }

    /// The driver's description of the code.
    pub fn description(&self) -> String {
        let mut p: *const c_char = std::ptr::null();
        // SAFETY: as in `name`: the driver writes a static string pointer into `p`.
        let rc = unsafe { sys::cuGetErrorString(self.code, &mut p) };
        if rc != CUresult::CUDA_SUCCESS || p.is_null() {
            return String::new();
        }
        // SAFETY: the driver returned a pointer to a static C string.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }

    /// True for the errors after which the CUDA context is unusable ("sticky" errors: a
    /// kernel faulted and every later call in the context fails the same way).
    pub fn is_sticky(&self) -> bool {
        use CUresult::*;
        matches!(
            self.code,
            CUDA_ERROR_ILLEGAL_ADDRESS
                | CUDA_ERROR_LAUNCH_TIMEOUT
                | CUDA_ERROR_HARDWARE_STACK_ERROR
                | CUDA_ERROR_ILLEGAL_INSTRUCTION
                | CUDA_ERROR_MISALIGNED_ADDRESS
                | CUDA_ERROR_INVALID_ADDRESS_SPACE
                | CUDA_ERROR_INVALID_PC
                | CUDA_ERROR_LAUNCH_FAILED
                | CUDA_ERROR_ASSERT
                | CUDA_ERROR_ECC_UNCORRECTABLE
                | CUDA_ERROR_CONTEXT_IS_DESTROYED
        )
    }

    /// True when the device ran out of memory.
    pub fn is_oom(&self) -> bool {
        self.code == CUresult::CUDA_ERROR_OUT_OF_MEMORY
    }
}

impl fmt::Display for CuError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} failed with {} ({})",
            self.call,
            self.name(),
            self.description()
        )
    }
}

impl std::error::Error for CuError {}

/// `Ok` for `CUDA_SUCCESS`, else the error with the call's name.
pub fn check(rc: CUresult, call: &'static str) -> Result<(), CuError> {
    if rc == CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(CuError { code: rc, call })
    }
}

/// Loads libcuda and initialises the driver, once per process. The error says what is
/// missing (no library, no device, a driver too old).
pub fn init() -> Result<(), String> {
    static INIT: OnceLock<Result<(), String>> = OnceLock::new();
    INIT.get_or_init(|| {
        // SAFETY: only tries dlopen on libcuda's usual names and closes what it opened.
        if !unsafe { sys::is_culib_present() } {
            return Err(
                "libcuda.so (the NVIDIA driver's CUDA library) is not installed or not on \
                        the loader path; install the NVIDIA driver, or use the sim backend"
                    .into(),
            );
        }
        // SAFETY: plain FFI call without pointers.
        check(unsafe { sys::cuInit(0) }, "cuInit").map_err(|e| match e.code {
            CUresult::CUDA_ERROR_NO_DEVICE => {
                "the NVIDIA driver sees no GPU (cuInit: CUDA_ERROR_NO_DEVICE); check nvidia-smi, \
                 or use the sim backend"
                    .to_string()
            }
            _ => format!("{e}; check the NVIDIA driver (nvidia-smi), or use the sim backend"),
        })?;
        let mut v: c_int = 0;
        check(
            // SAFETY: writes one int into `v`.
            unsafe { sys::cuDriverGetVersion(&mut v) },
            "cuDriverGetVersion",
        )
        .map_err(|e| e.to_string())?;
        if v < MIN_DRIVER_VERSION {
            return Err(format!(
                "the NVIDIA driver supports CUDA {}.{}; the cuda backend needs CUDA {}.{} or later \
                 (driver 580 or newer): upgrade the driver, or use the sim backend",
                v / 1000,
                v % 1000 / 10,
                MIN_DRIVER_VERSION / 1000,
                MIN_DRIVER_VERSION % 1000 / 10
            ));
        }
        tracing::debug!(cuda = v, "CUDA driver initialised");
        Ok(())
    })
    .clone()
}

/// Number of CUDA devices (after [`init`]).
pub fn device_count() -> Result<i32, CuError> {
    let mut n: c_int = 0;
    // SAFETY: writes one int into `n`.
    check(unsafe { sys::cuDeviceGetCount(&mut n) }, "cuDeviceGetCount")?;
    Ok(n)
}

/// What the backend needs to know about one device.
#[derive(Clone, Debug)]
pub struct DeviceProps {
    /// Device name, e.g. "NVIDIA H200".
    pub name: String,
    /// Physical memory in bytes.
    pub total_memory: u64,
    /// Multiprocessors.
    pub sm_count: u32,
    /// Compute capability (major, minor).
    pub capability: (i32, i32),
    /// Whether the device supports the virtual memory management API.
    pub vmm: bool,
}

fn attribute(dev: sys::CUdevice, attr: sys::CUdevice_attribute) -> Result<i32, CuError> {
    let mut v: c_int = 0;
    check(
        // SAFETY: writes one int into `v`.
        unsafe { sys::cuDeviceGetAttribute(&mut v, attr, dev) },
        "cuDeviceGetAttribute",
    )?;
    Ok(v)
}

/// The device with this ordinal and its properties.
pub fn device(ordinal: i32) -> Result<(sys::CUdevice, DeviceProps), CuError> {
    use sys::CUdevice_attribute::*;
    let mut dev: sys::CUdevice = 0;
    check(
        // SAFETY: writes one device handle into `dev`.
        unsafe { sys::cuDeviceGet(&mut dev, ordinal) },
        "cuDeviceGet",
    )?;
    let mut name = [0 as c_char; 128];
    check(
        // SAFETY: the driver writes at most `len` bytes, NUL-terminated, into `name`.
        unsafe { sys::cuDeviceGetName(name.as_mut_ptr(), name.len() as c_int, dev) },
        "cuDeviceGetName",
    )?;
    // SAFETY: the driver NUL-terminated the name inside the buffer.
    let name = unsafe { CStr::from_ptr(name.as_ptr()) }
        .to_string_lossy()
        .into_owned();
    let mut total: usize = 0;
    check(
        // SAFETY: writes one usize into `total`.
        unsafe { sys::cuDeviceTotalMem_v2(&mut total, dev) },
        "cuDeviceTotalMem",
    )?;
    Ok((
        dev,
        DeviceProps {
            name,
            total_memory: total as u64,
            sm_count: u32::try_from(attribute(dev, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?)
                .unwrap_or(1),
            capability: (
                attribute(dev, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
                attribute(dev, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
            ),
            vmm: attribute(
                dev,
                CU_DEVICE_ATTRIBUTE_VIRTUAL_ADDRESS_MANAGEMENT_SUPPORTED,
            )? != 0,
        },
    ))
}

/// The worker's CUDA context: the device's primary context, retained for the backend's
/// life. Everything that owns a driver object holds an `Arc` of it, so the context is
/// released last.
#[derive(Debug)]
pub struct Context {
    raw: sys::CUcontext,
    dev: sys::CUdevice,
}

// SAFETY: a CUcontext is a handle the driver API accepts from any thread (the driver
// synchronises internally); we only pass it to cuCtxSetCurrent and release it once, in Drop.
unsafe impl Send for Context {}
// SAFETY: as above; `&Context` only hands the handle to thread-safe driver calls.
unsafe impl Sync for Context {}

impl Context {
    /// Retains the primary context of `dev`.
    pub fn primary(dev: sys::CUdevice) -> Result<Arc<Self>, CuError> {
        let mut raw: sys::CUcontext = std::ptr::null_mut();
        check(
            // SAFETY: writes one context handle into `raw`.
            unsafe { sys::cuDevicePrimaryCtxRetain(&mut raw, dev) },
            "cuDevicePrimaryCtxRetain",
        )?;
        let ctx = Arc::new(Self { raw, dev });
        ctx.bind()?;
        Ok(ctx)
    }

    /// The raw handle (for calls that name two contexts, like `cuMemcpyPeerAsync`).
    pub fn raw(&self) -> sys::CUcontext {
        self.raw
    }

    /// Makes the context current on the calling thread (cheap: a thread-local store in the
    /// driver). Every backend entry point calls it first, since the queue threads that call
    /// the backend are not ours.
    pub fn bind(&self) -> Result<(), CuError> {
        // SAFETY: `raw` is a live context (retained until Drop).
        check(unsafe { sys::cuCtxSetCurrent(self.raw) }, "cuCtxSetCurrent")
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        if let Err(e) = check(
            // SAFETY: releases the retain taken in `primary`, once.
            unsafe { sys::cuDevicePrimaryCtxRelease_v2(self.dev) },
            "cuDevicePrimaryCtxRelease",
        ) {
            tracing::warn!(error = %e, "releasing the CUDA context failed");
        }
    }
}

/// A non-blocking stream (never synchronises with the legacy default stream).
#[derive(Debug)]
pub struct Stream {
    raw: sys::CUstream,
    ctx: Arc<Context>,
}

// SAFETY: a CUstream is a driver handle usable from any thread whose current context is
// its context (callers bind first); one owner destroys it once.
unsafe impl Send for Stream {}

impl Stream {
    /// A fresh stream in `ctx` (which the caller has bound).
    pub fn new(ctx: &Arc<Context>) -> Result<Self, CuError> {
        let mut raw: sys::CUstream = std::ptr::null_mut();
        check(
            // SAFETY: writes one stream handle into `raw`.
            unsafe {
                sys::cuStreamCreate(&mut raw, sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32)
            },
            "cuStreamCreate",
        )?;
        Ok(Self {
            raw,
            ctx: ctx.clone(),
        })
    }

    /// The raw handle, for driver calls.
    pub fn raw(&self) -> sys::CUstream {
        self.raw
    }

    /// Waits for everything queued on the stream.
    pub fn synchronize(&self) -> Result<(), CuError> {
        check(
            // SAFETY: `raw` is a live stream.
            unsafe { sys::cuStreamSynchronize(self.raw) },
            "cuStreamSynchronize",
        )
    }
}

/// The GPU's address of host memory at `p` that is pinned in the bound context
/// (`cuMemAllocHost`, or registered with `DEVICEMAP`).
pub fn host_device_pointer(p: *mut std::ffi::c_void) -> Result<sys::CUdeviceptr, CuError> {
    let mut d: sys::CUdeviceptr = 0;
    check(
        // SAFETY: the driver only looks `p` up among its pinned ranges; writes one pointer.
        unsafe { sys::cuMemHostGetDevicePointer_v2(&mut d, p, 0) },
        "cuMemHostGetDevicePointer",
    )?;
    Ok(d)
}

/// Work on the GPU whose end can be asked about without waiting: all of a stream, or what
/// was queued before an event.
pub trait Completion {
    /// Whether the work has finished (`Err`: it failed, or the context is lost).
    fn finished(&self) -> Result<bool, CuError>;

    /// Whether the work has finished, as read without a driver call (a word the stream
    /// writes, `signal.rs`); `None` when there is nothing to read that way. A `false` says
    /// nothing of a failure: only [`Completion::finished`] reports one.
    fn signalled(&self) -> Option<bool> {
        None
    }
}

/// The answer of a query call: finished, not yet, or its error.
fn query_answer(rc: sys::CUresult, call: &'static str) -> Result<bool, CuError> {
    if rc == sys::CUresult::CUDA_ERROR_NOT_READY {
        return Ok(false);
    }
    check(rc, call).map(|()| true)
}

impl Completion for Stream {
    /// Everything queued on the stream (`cuStreamQuery`): the same cost as querying an
    /// event, with no event to record first.
    fn finished(&self) -> Result<bool, CuError> {
        // SAFETY: `raw` is a live stream.
        query_answer(unsafe { sys::cuStreamQuery(self.raw) }, "cuStreamQuery")
    }
}

impl Completion for Event {
    /// What was queued before the event (`cuEventQuery`).
    fn finished(&self) -> Result<bool, CuError> {
        // SAFETY: `raw` is a live event.
        query_answer(unsafe { sys::cuEventQuery(self.raw) }, "cuEventQuery")
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        if self.ctx.bind().is_err() {
            return;
        }
        // SAFETY: destroys our own live stream once.
        let _ = unsafe { sys::cuStreamDestroy_v2(self.raw) };
    }
}

/// A timing event (a batch's marks between its runs).
#[derive(Debug)]
pub struct Event {
    raw: sys::CUevent,
    ctx: Arc<Context>,
}

// SAFETY: as for Stream: a driver handle, used with its context bound, destroyed once.
unsafe impl Send for Event {}

impl Event {
    /// A fresh event with timing enabled.
    pub fn new(ctx: &Arc<Context>) -> Result<Self, CuError> {
        Self::with_flags(ctx, sys::CUevent_flags::CU_EVENT_DEFAULT)
    }

    fn with_flags(ctx: &Arc<Context>, flags: sys::CUevent_flags) -> Result<Self, CuError> {
        let mut raw: sys::CUevent = std::ptr::null_mut();
        check(
            // SAFETY: writes one event handle into `raw`.
            unsafe { sys::cuEventCreate(&mut raw, flags as u32) },
            "cuEventCreate",
        )?;
        Ok(Self {
            raw,
            ctx: ctx.clone(),
        })
    }

    /// Records the event on `stream`.
    pub fn record(&self, stream: &Stream) -> Result<(), CuError> {
        check(
            // SAFETY: both handles are live and belong to the same context.
            unsafe { sys::cuEventRecord(self.raw, stream.raw) },
            "cuEventRecord",
        )
    }

    /// Device time from `start` to this event, in nanoseconds (0.5 µs resolution).
    pub fn since_ns(&self, start: &Event) -> Result<u64, CuError> {
        let mut ms: f32 = 0.0;
        check(
            // SAFETY: both events are live and completed; writes one float into `ms`.
            unsafe { sys::cuEventElapsedTime_v2(&mut ms, start.raw, self.raw) },
            "cuEventElapsedTime_v2",
        )?;
        Ok((f64::from(ms.max(0.0)) * 1e6) as u64)
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        if self.ctx.bind().is_err() {
            return;
        }
        // SAFETY: destroys our own live event once.
        let _ = unsafe { sys::cuEventDestroy_v2(self.raw) };
    }
}

/// A plain device buffer (`cuMemAlloc`) the backend uses for its own scratch data
/// (reduce_sum partial sums, the gather fault index, memmove staging). Never handed to a
/// guest and outside the vGPU's address range.
#[derive(Debug)]
pub struct DevBuf {
    ptr: sys::CUdeviceptr,
    len: usize,
    ctx: Arc<Context>,
}

// SAFETY: a device address owned by this value alone, freed once in Drop with its context
// bound.
unsafe impl Send for DevBuf {}

impl DevBuf {
    /// `len` bytes of device memory (uninitialised).
    pub fn new(ctx: &Arc<Context>, len: usize) -> Result<Self, CuError> {
        let mut ptr: sys::CUdeviceptr = 0;
        // SAFETY: writes one device pointer into `ptr`.
        check(unsafe { sys::cuMemAlloc_v2(&mut ptr, len) }, "cuMemAlloc")?;
        Ok(Self {
            ptr,
            len,
            ctx: ctx.clone(),
        })
    }

    /// Its device address.
    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    /// Its size.
    pub fn len(&self) -> usize {
        self.len
    }
}

impl Drop for DevBuf {
    fn drop(&mut self) {
        if self.ctx.bind().is_err() {
            return;
        }
        // SAFETY: frees our own allocation once; users synchronised their streams before
        // giving the buffer up.
        let _ = unsafe { sys::cuMemFree_v2(self.ptr) };
    }
}
