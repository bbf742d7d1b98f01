//! A long-running vGPU workload that checks its own results: the demo's and the daemon
//! tests' guest.
//!
//! Each round uploads `x` (a host-to-device copy), runs `saxpy` (`y = x + y`), a `spin`
//! burst of `spin_us` µs (compute time) and, with `matmul=<d>`, the built-in `matmul` of
//! two d x d matrices (a fixed amount of work: d^3 multiply-adds; `vgpu-bench sharing
//! --backend cuda` counts these rounds beside native processes running the same loop).
//! Every `check=<k>` rounds the device computes the FNV-1a checksum of `y` (built-in
//! `checksum`), the guest compares it with the checksum of the `y` it expects after that
//! many rounds, and prints a progress line: `gpu-load: round r/R ok checksum=0x...`.
//! Integer-valued f32 keep every sum exact, so any lost or corrupted byte changes the
//! checksum.
//!
//! Arguments: `rounds=<n>` (default 100), `n=<elements>` (default 16384), `spin_us=<µs>`
//! (default 10000; 0: no spin), `matmul=<d>` (default 0: none; at most 8192),
//! `check=<k>` (default 10), `retry=<k>` (default 0: a failed request
//! ends the run; k > 0: a request answered `DEVICE_ERROR` or `OUT_OF_MEMORY` is sent again,
//! up to k times each, which is exact because a failed request changed nothing. The fault
//! injection tests use it; the end line then counts the retries), `max_latency_ms=<ms>`
//! (default 0: off; else every request of a round must come back within it, and each
//! progress line is followed by `gpu-load: worst request so far <µs> us`: the kernel
//! deadline tests' neighbour), `hold=<MiB>` (default 0; at most 65536: that much more device
//! memory, allocated in pieces of at most 64 MiB and filled once with the built-in `fill`
//! before the first round, kept resident until the end: the whole-VM migration
//! benchmark's resident memory), `state=1` (default 0: off; else the run also keeps
//! state in a module variable, `counter`: the built-in module's where the device declares
//! it, else a PTX module's; every round reads it back, checks it and writes the next
//! value, at the address it looked up once, so a migration that lost the variable is a
//! mismatch; the end line then says `state=<last value>`).
//! Prints `GPU-LOAD OK rounds=<n> checksum=0x...` and exits 0; otherwise a diagnostic and
//! 2 bad argument, 3 no vGPU, 4 driver/device error, 6 checksum mismatch, 7 a request
//! slower than `max_latency_ms`.
#![no_std]
#![no_main]

extern crate alloc;

use alloc::vec;
use alloc::vec::Vec;

use guest_driver::vgpu::launch_1d;
use guest_driver::vgpu::vgpu_proto::{Access, KernelArg, Status};
use guest_driver::Error;
use payload_rt::vgpu::{open_single, GpuStream};
use payload_rt::{println, Args, BootInfo};

payload_rt::entry!(main);

const EXIT_BAD_ARGS: u8 = 2;
const EXIT_NO_DEVICE: u8 = 3;
const EXIT_DRIVER: u8 = 4;
const EXIT_MISMATCH: u8 = 6;
const EXIT_LATENCY: u8 = 7;

/// `y` stays below this, so every value is an exact f32 integer.
const EXACT_LIMIT: u64 = 1 << 24;

/// Largest `hold=`, MiB, and the piece it is allocated in.
const HOLD_MAX_MIB: u64 = 65536;
const HOLD_PIECE: u64 = 64 << 20;

struct Failure(u8);

fn fail(code: u8, what: core::fmt::Arguments) -> Failure {
    println!("gpu-load: FAIL {what}");
    Failure(code)
}

fn driver(what: &'static str) -> impl Fn(Error) -> Failure {
    move |e| fail(EXIT_DRIVER, format_args!("{what}: {e}"))
}

fn main(boot: &'static BootInfo, args: &'static str) -> u8 {
    match run(boot, Args::new(args)) {
        Ok(()) => 0,
        Err(Failure(code)) => code,
    }
}

fn x_of(i: usize) -> u64 {
    (i % 7 + 1) as u64
}

fn y0_of(i: usize) -> u64 {
    (i % 1000) as u64
}

/// The f32 bit pattern of a whole number below 2^24, with integer instructions only (the
/// payload is soft-float; this keeps the expected checksum cheap).
fn f32_bits(v: u64) -> u32 {
    if v == 0 {
        return 0;
    }
    let e = 63 - v.leading_zeros();
    let mantissa = ((v << (23 - e)) as u32) & 0x7f_ffff;
    ((e + 127) << 23) | mantissa
}

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// FNV-1a of `y` after `rounds` rounds: y[i] = y0[i] + rounds * x[i].
fn expected_checksum(n: usize, rounds: u64) -> u64 {
    let mut h = FNV_OFFSET;
    for i in 0..n {
        for b in f32_bits(y0_of(i) + rounds * x_of(i)).to_le_bytes() {
            h = (h ^ u64::from(b)).wrapping_mul(FNV_PRIME);
        }
    }
    h
}

/// Runs `f`, again (up to `retry` more times) while it fails with a transient device status.
fn again<T>(
    retry: u64,
    retried: &mut u64,
    what: &'static str,
    mut f: impl FnMut() -> Result<T, Error>,
) -> Result<T, Failure> {
    let mut left = retry;
    loop {
        match f() {
            Err(Error::Device { status, .. })
                if left > 0 && matches!(status, Status::DeviceError | Status::OutOfMemory) =>
            {
                left -= 1;
                *retried += 1;
            }
            other => return other.map_err(driver(what)),
        }
    }
}

/// Runs one request, checks its round trip against `max_ms` (0: no limit) and keeps the
/// worst seen (when the TSC frequency is known; otherwise nothing is measured).
fn timed<T>(
    max_ms: u64,
    worst_ns: &mut u64,
    what: &str,
    f: impl FnOnce() -> Result<T, Failure>,
) -> Result<T, Failure> {
    let t = payload_rt::time::Instant::now();
    let v = f()?;
    if let Some(ns) = t.elapsed_ns() {
        *worst_ns = (*worst_ns).max(ns);
        if max_ms > 0 && ns > max_ms.saturating_mul(1_000_000) {
            return Err(fail(
                EXIT_LATENCY,
                format_args!(
                    "{what} took {} us, more than max_latency_ms={max_ms}",
                    ns / 1000
                ),
            ));
        }
    }
    Ok(v)
}

/// Allocates `mib` MiB in pieces of at most [`HOLD_PIECE`] and fills each once (a pattern,
/// so every page is resident); returns the pieces.
fn hold(
    s: &mut GpuStream,
    module: u64,
    mib: u64,
    retry: u64,
    retried: &mut u64,
) -> Result<Vec<u64>, Failure> {
    let mut pieces = Vec::new();
    if mib == 0 {
        return Ok(pieces);
    }
    let fill = s
        .get_function(module, "fill")
        .map_err(driver("GET_FUNCTION fill"))?;
    let mut left = mib << 20;
    while left > 0 {
        let size = left.min(HOLD_PIECE);
        let d = s.alloc(size).map_err(driver("ALLOC hold"))?;
        let words = size / 4;
        let args = [
            KernelArg::ptr(d, Access::Write),
            KernelArg::u32(0x5a5a_5a5a),
            KernelArg::u64(words),
        ];
        again(retry, retried, "LAUNCH fill hold", || {
            s.launch(&launch_1d(fill.handle, words, 256), &args)
        })?;
        pieces.push(d);
        left -= size;
    }
    Ok(pieces)
}

/// A module declaring the `counter` variable, for a device that runs PTX.
const COUNTER_PTX: &[u8] = b".version 7.8
.target sm_90
.address_size 64
.visible .global .align 8 .u64 counter;
";

/// State kept in a module variable (`state=1`).
struct Counter {
    /// Its device address, looked up once.
    addr: u64,
    /// What it must hold now.
    want: u64,
    /// The PTX module declaring it, when the built-in one does not.
    own: Option<u64>,
}

impl Counter {
    fn new(s: &mut GpuStream, builtin: u64) -> Result<Self, Failure> {
        let (own, (addr, size)) = match s.get_global(builtin, "counter") {
            Ok(g) => (None, g),
            Err(_) => {
                let m = s
                    .load_module_ptx(COUNTER_PTX)
                    .map_err(driver("MODULE_LOAD counter"))?;
                (
                    Some(m),
                    s.get_global(m, "counter")
                        .map_err(driver("GET_GLOBAL counter"))?,
                )
            }
        };
        if size != 8 {
            return Err(fail(
                EXIT_MISMATCH,
                format_args!("the module variable counter is {size} bytes, not 8"),
            ));
        }
        let want = 0x5eed_0000_0000_0000;
        s.memcpy_htod(addr, &u64::to_le_bytes(want))
            .map_err(driver("MEMCPY_HTOD counter"))?;
        Ok(Self { addr, want, own })
    }

    /// Reads the variable back, checks it, writes the next value.
    fn round(&mut self, s: &mut GpuStream, r: u64) -> Result<(), Failure> {
        let mut b = [0u8; 8];
        s.memcpy_dtoh(&mut b, self.addr)
            .map_err(driver("MEMCPY_DTOH counter"))?;
        let got = u64::from_le_bytes(b);
        if got != self.want {
            return Err(fail(
                EXIT_MISMATCH,
                format_args!(
                    "round {r}: the module variable counter holds {got:#x}, want {:#x}",
                    self.want
                ),
            ));
        }
        self.want += 1;
        s.memcpy_htod(self.addr, &u64::to_le_bytes(self.want))
            .map_err(driver("MEMCPY_HTOD counter"))
    }
}

fn as_bytes(words: &[u32]) -> Vec<u8> {
    words.iter().flat_map(|w| w.to_le_bytes()).collect()
}

fn run(boot: &BootInfo, args: Args) -> Result<(), Failure> {
    let num = |key, default| {
        args.number(key, default)
            .map_err(|e| fail(EXIT_BAD_ARGS, format_args!("{e}")))
    };
    let rounds = num("rounds", 100)?;
    let n = num("n", 1 << 14)? as usize;
    let spin_us = num("spin_us", 10_000)?;
    let check = num("check", 10)?.max(1);
    let retry = num("retry", 0)?;
    let max_ms = num("max_latency_ms", 0)?;
    let dim = num("matmul", 0)?;
    let hold_mib = num("hold", 0)?;
    let state = num("state", 0)? != 0;
    let mut worst = 0u64;
    let mut retried = 0u64;
    if dim > 8192 {
        return Err(fail(EXIT_BAD_ARGS, format_args!("matmul must be 0..=8192")));
    }
    if hold_mib > HOLD_MAX_MIB {
        return Err(fail(
            EXIT_BAD_ARGS,
            format_args!("hold must be 0..={HOLD_MAX_MIB} (MiB)"),
        ));
    }
    if n == 0 || n > 1 << 22 {
        return Err(fail(EXIT_BAD_ARGS, format_args!("n must be 1..=4194304")));
    }
    if 1000 + rounds.saturating_mul(7) >= EXACT_LIMIT {
        return Err(fail(
            EXIT_BAD_ARGS,
            format_args!(
                "rounds must stay below {} (exact f32 sums)",
                (EXACT_LIMIT - 1000) / 7
            ),
        ));
    }
    let (_gpu, mut s) = open_single(boot).map_err(|e| fail(EXIT_NO_DEVICE, format_args!("{e}")))?;
    let info = s.get_info().map_err(driver("GET_INFO"))?;
    println!(
        "gpu-load: vGPU {} share {} MiB compute {}/1000: {rounds} rounds of {n} elements, spin {spin_us} us",
        info.vgpu_id,
        info.memory_share >> 20,
        info.compute_share
    );

    let bytes = 4 * n as u64;
    let x = as_bytes(&(0..n).map(|i| f32_bits(x_of(i))).collect::<Vec<_>>());
    let y0 = as_bytes(&(0..n).map(|i| f32_bits(y0_of(i))).collect::<Vec<_>>());
    let dx = s.alloc(bytes).map_err(driver("ALLOC x"))?;
    let dy = s.alloc(bytes).map_err(driver("ALLOC y"))?;
    let dsum = s.alloc(8).map_err(driver("ALLOC sum"))?;
    again(retry, &mut retried, "MEMCPY_HTOD y", || {
        s.memcpy_htod(dy, &y0)
    })?;

    let module = s.load_builtin().map_err(driver("MODULE_LOAD builtin"))?;
    let saxpy = s
        .get_function(module, "saxpy")
        .map_err(driver("GET_FUNCTION saxpy"))?;
    let spin = s
        .get_function(module, "spin")
        .map_err(driver("GET_FUNCTION spin"))?;
    let checksum = s
        .get_function(module, "checksum")
        .map_err(driver("GET_FUNCTION checksum"))?;
    // The matmul operands: zeroed once, then only read (a, b) and overwritten (c).
    let mut matrices = Vec::new();
    let mut mm_args = Vec::new();
    let mut mm_launch = None;
    if dim > 0 {
        let elems = dim * dim;
        for _ in 0..3 {
            matrices.push(s.alloc(4 * elems).map_err(driver("ALLOC matmul"))?);
        }
        let fill = s
            .get_function(module, "fill")
            .map_err(driver("GET_FUNCTION fill"))?;
        for &m in &matrices {
            let args = [
                KernelArg::ptr(m, Access::Write),
                KernelArg::u32(0),
                KernelArg::u64(elems),
            ];
            again(retry, &mut retried, "LAUNCH fill", || {
                s.launch(&launch_1d(fill.handle, elems, 256), &args)
            })?;
        }
        let mm = s
            .get_function(module, "matmul")
            .map_err(driver("GET_FUNCTION matmul"))?;
        mm_launch = Some(launch_1d(mm.handle, elems, 256));
        mm_args = vec![
            KernelArg::ptr(matrices[0], Access::Read),
            KernelArg::ptr(matrices[1], Access::Read),
            KernelArg::ptr(matrices[2], Access::Write),
            KernelArg::u64(dim),
            KernelArg::u64(dim),
            KernelArg::u64(dim),
        ];
    }
    let held = hold(&mut s, module, hold_mib, retry, &mut retried)?;
    let mut var = if state {
        Some(Counter::new(&mut s, module)?)
    } else {
        None
    };
    if hold_mib > 0 {
        println!("gpu-load: holding {hold_mib} MiB resident");
    }
    let saxpy_launch = launch_1d(saxpy.handle, n as u64, 256);
    let saxpy_args = [
        KernelArg::f32(1.0),
        KernelArg::ptr(dx, Access::Read),
        KernelArg::ptr(dy, Access::ReadWrite),
        KernelArg::u64(n as u64),
    ];
    let spin_launch = launch_1d(spin.handle, 1, 1);
    let spin_args = [KernelArg::u64(spin_us)];
    let sum_launch = launch_1d(checksum.handle, 1, 1);
    let sum_args = [
        KernelArg::ptr(dy, Access::Read),
        KernelArg::u64(bytes),
        KernelArg::ptr(dsum, Access::Write),
    ];

    let mut sum = vec![0u8; 8];
    let mut last = 0u64;
    for r in 1..=rounds {
        let rt = &mut retried;
        let w = &mut worst;
        timed(max_ms, w, "MEMCPY_HTOD x", || {
            again(retry, rt, "MEMCPY_HTOD x", || s.memcpy_htod(dx, &x))
        })?;
        timed(max_ms, w, "LAUNCH saxpy", || {
            again(retry, rt, "LAUNCH saxpy", || {
                s.launch(&saxpy_launch, &saxpy_args)
            })
        })?;
        if spin_us > 0 {
            timed(max_ms, w, "LAUNCH spin", || {
                again(retry, rt, "LAUNCH spin", || {
                    s.launch(&spin_launch, &spin_args)
                })
            })?;
        }
        if let Some(mm) = &mm_launch {
            timed(max_ms, w, "LAUNCH matmul", || {
                again(retry, rt, "LAUNCH matmul", || s.launch(mm, &mm_args))
            })?;
        }
        if let Some(v) = var.as_mut() {
            v.round(&mut s, r)?;
        }
        if r % check == 0 || r == rounds {
            timed(max_ms, w, "LAUNCH checksum", || {
                again(retry, rt, "LAUNCH checksum", || {
                    s.launch(&sum_launch, &sum_args)
                })
            })?;
            timed(max_ms, w, "MEMCPY_DTOH sum", || {
                again(retry, rt, "MEMCPY_DTOH sum", || {
                    s.memcpy_dtoh(&mut sum, dsum)
                })
            })?;
            let got = u64::from_le_bytes([
                sum[0], sum[1], sum[2], sum[3], sum[4], sum[5], sum[6], sum[7],
            ]);
            let want = expected_checksum(n, r);
            if got != want {
                return Err(fail(
                    EXIT_MISMATCH,
                    format_args!("round {r}: checksum {got:#018x}, want {want:#018x}"),
                ));
            }
            last = got;
            println!("gpu-load: round {r}/{rounds} ok checksum={got:#018x}");
            if max_ms > 0 {
                println!("gpu-load: worst request so far {} us", worst / 1000);
            }
        }
    }
    if let Some(v) = var {
        println!(
            "gpu-load: the module variable kept its value through every round: state={:#x}",
            v.want
        );
        if let Some(m) = v.own {
            s.unload_module(m)
                .map_err(driver("MODULE_UNLOAD counter"))?;
        }
    }
    s.unload_module(module).map_err(driver("MODULE_UNLOAD"))?;
    for d in [dx, dy, dsum].into_iter().chain(matrices).chain(held) {
        s.free(d).map_err(driver("FREE"))?;
    }
    if retry > 0 {
        println!("gpu-load: {retried} requests retried after transient device errors");
    }
    println!("GPU-LOAD OK rounds={rounds} checksum={last:#018x}");
    Ok(())
}
