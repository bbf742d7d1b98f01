//! `vgpu-native-load`: the native anchor of `vgpu-bench sharing --backend cuda`. One
//! process on one CUDA GPU runs the loop a `gpu-load` guest runs with `matmul=<d>`: copy
//! 64 KiB in (pinned host memory), the built-in `saxpy` over 16384 elements, the built-in
//! `matmul` of two d x d matrices, each waited for before the next, exactly the kernels
//! and geometry the cuda backend uses (`vgpu_backend::cuda::BUILTIN_PTX`).
//!
//! `--calibrate-us T` picks the d whose round takes about T µs of kernel time alone and
//! prints `NATIVE calibrate dim=<d> kernel_us=<µs>` (the median round's device time,
//! measured with events). `--dim d --from-ms A --until-ms B` (unix time, ms) runs rounds
//! until B and prints `NATIVE rounds=<rounds completed inside [A, B]> ready_late_ms=<ms>`
//! (how far past A the process became ready; 0 when it was ready in time).
//! `--dim d --window-from-stdin` prints `NATIVE ready` once its context, module and first
//! round are done, then reads `A B` (the window, unix ms) from one line of stdin: a bench
//! starting many processes opens the window only when every one of them is ready.
//!
//! Matmul does a fixed amount of work per round (d^3 multiply-adds), so N of these
//! processes time-sliced on one GPU count rounds, not device time: a spin kernel would
//! overlap under the driver's time-slicing and overstate native throughput.

use std::ffi::{c_void, CString};
use std::process::ExitCode;
use std::time::{SystemTime, UNIX_EPOCH};

use clap::Parser;
use cudarc::driver::sys::{self, CUresult};

#[derive(Parser)]
#[command(about = "the native anchor of vgpu-bench sharing: gpu-load's loop on CUDA")]
struct Args {
    /// Pick the matmul dimension whose round takes about this many µs of kernel time.
    #[arg(long)]
    calibrate_us: Option<u64>,
    /// Matmul dimension (d x d x d).
    #[arg(long, default_value_t = 512)]
    dim: u64,
    /// Start of the counting window, unix time in ms.
    #[arg(long, default_value_t = 0)]
    from_ms: u64,
    /// End of the counting window (and of the run), unix time in ms.
    #[arg(long, default_value_t = 0)]
    until_ms: u64,
    /// Print `NATIVE ready` when set up, then read the window `FROM_MS UNTIL_MS` from stdin.
    #[arg(long)]
    window_from_stdin: bool,
    /// CUDA device ordinal.
    #[arg(long, default_value_t = 0)]
    device: i32,
}

/// Elements of `x` and `y` (64 KiB each), as in gpu-load.
const ELEMS: u64 = 1 << 14;
/// Threads per block and blocks per multiprocessor of the cuda backend's element-wise
/// grids (backend/src/cuda/builtin.rs).
const BLOCK: u32 = 256;
const BLOCKS_PER_SM: u64 = 32;

#[derive(Debug, thiserror::Error)]
enum Error {
    #[error("{0} failed with {1:?}")]
    Cuda(&'static str, CUresult),
    #[error("{0}")]
    Setup(String),
}

fn check(rc: CUresult, call: &'static str) -> Result<(), Error> {
    if rc == CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(Error::Cuda(call, rc))
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// The loop's GPU objects in this process's one context.
struct Load {
    saxpy: sys::CUfunction,
    matmul: sys::CUfunction,
    sms: u64,
    host: *mut c_void,
    dx: sys::CUdeviceptr,
    dy: sys::CUdeviceptr,
    a: sys::CUdeviceptr,
    b: sys::CUdeviceptr,
    c: sys::CUdeviceptr,
    dim: u64,
    start: sys::CUevent,
    end: sys::CUevent,
}

fn grid_for(work: u64, sms: u64) -> u32 {
    let cap = sms.max(1) * BLOCKS_PER_SM;
    u32::try_from(work.div_ceil(u64::from(BLOCK)).clamp(1, cap)).unwrap_or(1)
}

fn alloc(bytes: u64) -> Result<sys::CUdeviceptr, Error> {
    let mut p: sys::CUdeviceptr = 0;
    let len = usize::try_from(bytes).map_err(|_| Error::Setup("allocation too large".into()))?;
    // SAFETY: writes one device pointer into `p`.
    check(unsafe { sys::cuMemAlloc_v2(&mut p, len) }, "cuMemAlloc_v2")?;
    Ok(p)
}

fn launch(f: sys::CUfunction, grid: u32, params: &mut [*mut c_void]) -> Result<(), Error> {
    check(
        // SAFETY: `f` is a live function of the loaded module and `params` holds one pointer
        // per kernel parameter, to values that outlive the call (the driver copies them).
        unsafe {
            sys::cuLaunchKernel(
                f,
                grid,
                1,
                1,
                BLOCK,
                1,
                1,
                0,
                std::ptr::null_mut(),
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        },
        "cuLaunchKernel",
    )
}

fn sync() -> Result<(), Error> {
    // SAFETY: plain FFI call; waits for the current context's work.
    check(unsafe { sys::cuCtxSynchronize() }, "cuCtxSynchronize")
}

impl Load {
    fn new(device: i32, dim: u64) -> Result<Self, Error> {
        // SAFETY: only tries dlopen on libcuda's usual names.
        if !unsafe { sys::is_culib_present() } {
            return Err(Error::Setup("libcuda.so is not on the loader path".into()));
        }
        // SAFETY: plain FFI call without pointers.
        check(unsafe { sys::cuInit(0) }, "cuInit")?;
        let mut dev: sys::CUdevice = 0;
        // SAFETY: writes one device handle into `dev`.
        check(unsafe { sys::cuDeviceGet(&mut dev, device) }, "cuDeviceGet")?;
        let mut ctx: sys::CUcontext = std::ptr::null_mut();
        check(
            // SAFETY: writes one context handle into `ctx`; released when the process exits.
            unsafe { sys::cuDevicePrimaryCtxRetain(&mut ctx, dev) },
            "cuDevicePrimaryCtxRetain",
        )?;
        // SAFETY: `ctx` is the live primary context just retained.
        check(unsafe { sys::cuCtxSetCurrent(ctx) }, "cuCtxSetCurrent")?;
        let mut sms: i32 = 0;
        check(
            // SAFETY: writes one int into `sms`.
            unsafe {
                sys::cuDeviceGetAttribute(
                    &mut sms,
                    sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
                    dev,
                )
            },
            "cuDeviceGetAttribute",
        )?;
        let ptx = CString::new(vgpu_backend::cuda::BUILTIN_PTX)
            .map_err(|_| Error::Setup("the built-in PTX holds a NUL byte".into()))?;
        let mut module: sys::CUmodule = std::ptr::null_mut();
        check(
            // SAFETY: `ptx` is NUL-terminated PTX text that outlives the call.
            unsafe { sys::cuModuleLoadData(&mut module, ptx.as_ptr().cast()) },
            "cuModuleLoadData",
        )?;
        let func = |name: &str| -> Result<sys::CUfunction, Error> {
            let cname = CString::new(name).map_err(|_| Error::Setup(name.into()))?;
            let mut f: sys::CUfunction = std::ptr::null_mut();
            check(
                // SAFETY: `module` is live; `cname` is NUL-terminated; writes one handle.
                unsafe { sys::cuModuleGetFunction(&mut f, module, cname.as_ptr()) },
                "cuModuleGetFunction",
            )?;
            Ok(f)
        };
        let (saxpy, matmul) = (func("saxpy")?, func("matmul")?);
        let mut host: *mut c_void = std::ptr::null_mut();
        check(
            // SAFETY: writes one pointer to ELEMS * 4 bytes of pinned host memory into `host`.
            unsafe { sys::cuMemAllocHost_v2(&mut host, (ELEMS * 4) as usize) },
            "cuMemAllocHost_v2",
        )?;
        // SAFETY: `host` points at ELEMS * 4 writable bytes just allocated.
        unsafe { std::ptr::write_bytes(host.cast::<u8>(), 0, (ELEMS * 4) as usize) };
        let matrix = dim
            .checked_mul(dim)
            .and_then(|e| e.checked_mul(4))
            .ok_or_else(|| Error::Setup(format!("dim {dim} too large")))?;
        let event = || -> Result<sys::CUevent, Error> {
            let mut e: sys::CUevent = std::ptr::null_mut();
            check(
                // SAFETY: writes one event handle into `e`.
                unsafe { sys::cuEventCreate(&mut e, 0) },
                "cuEventCreate",
            )?;
            Ok(e)
        };
        let (start, end) = (event()?, event()?);
        let load = Load {
            saxpy,
            matmul,
            sms: u64::try_from(sms).unwrap_or(1),
            host,
            dx: alloc(ELEMS * 4)?,
            dy: alloc(ELEMS * 4)?,
            a: alloc(matrix)?,
            b: alloc(matrix)?,
            c: alloc(matrix)?,
            dim,
            start,
            end,
        };
        for (p, bytes) in [
            (load.dx, ELEMS * 4),
            (load.dy, ELEMS * 4),
            (load.a, matrix),
            (load.b, matrix),
        ] {
            check(
                // SAFETY: `p` is a live allocation of `bytes` bytes.
                unsafe { sys::cuMemsetD8_v2(p, 0, bytes as usize) },
                "cuMemsetD8_v2",
            )?;
        }
        sync()?;
        Ok(load)
    }

    /// One round: copy in, saxpy, matmul, each waited for (timed: the two kernels back to
    /// back between two events). Returns the kernels' device time in µs when `timed`.
    fn round(&self, timed: bool) -> Result<f64, Error> {
        check(
            // SAFETY: `host` holds ELEMS * 4 pinned bytes, `dx` as many device bytes.
            unsafe { sys::cuMemcpyHtoD_v2(self.dx, self.host, (ELEMS * 4) as usize) },
            "cuMemcpyHtoD_v2",
        )?;
        if timed {
            check(
                // SAFETY: a live event of this context, on the default stream.
                unsafe { sys::cuEventRecord(self.start, std::ptr::null_mut()) },
                "cuEventRecord",
            )?;
        }
        let mut alpha: f32 = 1.0;
        let (mut x, mut y, mut n) = (self.dx, self.dy, ELEMS);
        launch(
            self.saxpy,
            grid_for(ELEMS, self.sms),
            &mut [
                (&mut alpha as *mut f32).cast(),
                (&mut x as *mut u64).cast(),
                (&mut y as *mut u64).cast(),
                (&mut n as *mut u64).cast(),
            ],
        )?;
        if !timed {
            sync()?;
        }
        let (mut a, mut b, mut c) = (self.a, self.b, self.c);
        let (mut m, mut nn, mut k) = (self.dim, self.dim, self.dim);
        launch(
            self.matmul,
            grid_for(self.dim * self.dim, self.sms),
            &mut [
                (&mut a as *mut u64).cast(),
                (&mut b as *mut u64).cast(),
                (&mut c as *mut u64).cast(),
                (&mut m as *mut u64).cast(),
                (&mut nn as *mut u64).cast(),
                (&mut k as *mut u64).cast(),
            ],
        )?;
        if !timed {
            sync()?;
            return Ok(0.0);
        }
        check(
            // SAFETY: a live event of this context, on the default stream.
            unsafe { sys::cuEventRecord(self.end, std::ptr::null_mut()) },
            "cuEventRecord",
        )?;
        sync()?;
        let mut ms: f32 = 0.0;
        check(
            // SAFETY: both events are live and completed; writes one float into `ms`.
            unsafe { sys::cuEventElapsedTime_v2(&mut ms, self.start, self.end) },
            "cuEventElapsedTime_v2",
        )?;
        Ok(f64::from(ms) * 1000.0)
    }

    /// The median device time of `n` timed rounds, µs.
    fn median_us(&self, n: usize) -> Result<f64, Error> {
        let mut t = Vec::with_capacity(n);
        for _ in 0..n {
            t.push(self.round(true)?);
        }
        t.sort_by(f64::total_cmp);
        Ok(t[n / 2])
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        for p in [self.dx, self.dy, self.a, self.b, self.c] {
            // SAFETY: frees this process's own device allocation once (nothing runs: every
            // round synchronised before returning).
            let _ = unsafe { sys::cuMemFree_v2(p) };
        }
        // SAFETY: frees this process's own pinned buffer once; the context goes with the
        // process.
        let _ = unsafe { sys::cuMemFreeHost(self.host) };
    }
}

/// The d (a multiple of 32) whose round takes about `target_us` alone, and its time.
fn calibrate(device: i32, target_us: u64) -> Result<(u64, f64), Error> {
    let mut dim = 512u64;
    for _ in 0..3 {
        let load = Load::new(device, dim)?;
        load.median_us(3)?;
        let t = load.median_us(7)?;
        drop(load);
        let scale = (target_us as f64 / t.max(1.0)).cbrt();
        // gpu-load takes matmul=<d> up to 8192.
        let next = (((dim as f64 * scale) / 32.0).round() as u64 * 32).clamp(32, 8192);
        if next == dim {
            return Ok((dim, t));
        }
        dim = next;
    }
    let load = Load::new(device, dim)?;
    load.median_us(3)?;
    Ok((dim, load.median_us(9)?))
}

fn run(args: &Args) -> Result<(), Error> {
    if let Some(target) = args.calibrate_us {
        let (dim, us) = calibrate(args.device, target.max(1))?;
        println!("NATIVE calibrate dim={dim} kernel_us={us:.1}");
        return Ok(());
    }
    let load = Load::new(args.device, args.dim.max(1))?;
    load.round(false)?;
    let (from_ms, until_ms) = if args.window_from_stdin {
        window_from_stdin()?
    } else {
        (args.from_ms, args.until_ms)
    };
    let late = now_ms().saturating_sub(from_ms);
    let mut rounds = 0u64;
    loop {
        load.round(false)?;
        let t = now_ms();
        if t > until_ms {
            break;
        }
        if t >= from_ms {
            rounds += 1;
        }
    }
    println!("NATIVE rounds={rounds} ready_late_ms={late}");
    Ok(())
}

/// Says it is ready and reads `FROM_MS UNTIL_MS` from one line of stdin.
fn window_from_stdin() -> Result<(u64, u64), Error> {
    use std::io::{BufRead, Write};
    let mut out = std::io::stdout().lock();
    writeln!(out, "NATIVE ready")
        .and_then(|()| out.flush())
        .map_err(|e| Error::Setup(format!("cannot write to stdout: {e}")))?;
    drop(out);
    let mut line = String::new();
    std::io::stdin()
        .lock()
        .read_line(&mut line)
        .map_err(|e| Error::Setup(format!("cannot read the window from stdin: {e}")))?;
    let mut it = line.split_whitespace().map(str::parse::<u64>);
    match (it.next(), it.next()) {
        (Some(Ok(from)), Some(Ok(until))) if from <= until => Ok((from, until)),
        _ => Err(Error::Setup(format!(
            "stdin must give the window as two unix times in ms, FROM_MS UNTIL_MS; got {:?}",
            line.trim()
        ))),
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("vgpu-native-load: {e}");
            ExitCode::FAILURE
        }
    }
}
