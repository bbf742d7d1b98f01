//! The first real vGPU program: `c = a + b` with the built-in `vector_add`, synchronously
//! and then as one batch behind one doorbell, checked element by element.
//!
//! Arguments: `n=<elements>` (default 16384), `iters=<n>` round trips for the request
//! latency figure (default 1000). Guest instructions are slow on our nested KVM (see
//! guests/README.md), so the defaults stay small.
//! Prints `VECADD OK` and exits 0; a diagnostic and a non-zero code otherwise.
#![no_std]
#![no_main]

extern crate alloc;

use alloc::vec;
use alloc::vec::Vec;

use guest_driver::vgpu::launch_1d;
use guest_driver::vgpu::vgpu_proto::{Access, KernelArg, LaunchArgs};
use guest_driver::Error;
use payload_rt::time::{rdtsc, ticks_to_ns};
use payload_rt::vgpu::{open_single_with, GpuStream};

/// Requests in flight on the stream: 64 per doorbell, two descriptors each.
const CAP: usize = 128;
use payload_rt::{bench, println, Args, BootInfo};

payload_rt::entry!(main);

const EXIT_BAD_ARGS: u8 = 2;
const EXIT_NO_DEVICE: u8 = 3;
const EXIT_DRIVER: u8 = 4;
const EXIT_MISMATCH: u8 = 6;

struct Failure(u8);

fn fail(code: u8, what: core::fmt::Arguments) -> Failure {
    println!("vecadd: FAIL {what}");
    Failure(code)
}

/// Maps a driver error to the driver exit code with what was being done.
fn driver(what: &'static str) -> impl Fn(Error) -> Failure {
    move |e| fail(EXIT_DRIVER, format_args!("{what}: {e}"))
}

fn main(boot: &'static BootInfo, args: &'static str) -> u8 {
    match run(boot, Args::new(args)) {
        Ok(()) => {
            println!("VECADD OK");
            0
        }
        Err(Failure(code)) => code,
    }
}

/// a[i] and b[i] are small integers, so every sum is exact in f32.
fn a_of(i: usize) -> usize {
    i % 1000
}

fn b_of(i: usize) -> usize {
    i * 7 % 1000
}

/// f32 bit patterns of 0..2000. The payload is soft-float and guest instructions are
/// slow on nested KVM, so convert each value once, not once per element.
fn float_bits() -> Vec<u32> {
    (0..2000u32).map(|v| (v as f32).to_bits()).collect()
}

fn inputs(n: usize, bits: &[u32]) -> (Vec<u8>, Vec<u8>) {
    let mut a = vec![0u8; 4 * n];
    let mut b = vec![0u8; 4 * n];
    for (i, (wa, wb)) in a.chunks_exact_mut(4).zip(b.chunks_exact_mut(4)).enumerate() {
        wa.copy_from_slice(&bits[a_of(i)].to_le_bytes());
        wb.copy_from_slice(&bits[b_of(i)].to_le_bytes());
    }
    (a, b)
}

fn check(c: &[u8], n: usize, bits: &[u32], what: &str) -> Result<(), Failure> {
    for (i, w) in c.chunks_exact(4).enumerate().take(n) {
        let want = bits[a_of(i) + b_of(i)];
        let got = u32::from_le_bytes([w[0], w[1], w[2], w[3]]);
        if got != want {
            return Err(fail(
                EXIT_MISMATCH,
                format_args!("{what}: c[{i}] = {got:#x}, want {want:#x}"),
            ));
        }
    }
    Ok(())
}

/// Prints MB/s for `bytes` moved in `ticks`, when the TSC frequency is known.
fn report_bandwidth(name: &str, bytes: usize, ticks: u64) {
    if let Some(ns) = ticks_to_ns(ticks).filter(|&ns| ns > 0) {
        bench!(name, bytes as f64 * 1000.0 / ns as f64, "MB/s");
    }
}

/// Requests per second with 1, 8 and 64 requests per doorbell (STREAM_SYNC: the cheapest
/// request, so the figure is the path's, not the work's).
fn batching(s: &mut GpuStream<CAP>, iters: u64) -> Result<(), Failure> {
    for batch in [1u64, 8, 64] {
        let rounds = (iters / batch).max(4);
        let t0 = rdtsc();
        for _ in 0..rounds {
            for _ in 0..batch {
                s.enqueue_stream_sync()
                    .map_err(driver("enqueue STREAM_SYNC"))?;
            }
            s.submit();
            s.wait_all().map_err(driver("STREAM_SYNC batch"))?;
        }
        if let Some(ns) = ticks_to_ns(rdtsc() - t0).filter(|&ns| ns > 0) {
            let rate = (rounds * batch) as f64 * 1e9 / ns as f64;
            match batch {
                1 => bench!("vgpu_requests_per_s_batch1", rate, "req/s"),
                8 => bench!("vgpu_requests_per_s_batch8", rate, "req/s"),
                _ => bench!("vgpu_requests_per_s_batch64", rate, "req/s"),
            }
        }
    }
    Ok(())
}

/// Null-kernel launches (`spin` for 0 µs): the synchronous round trip of one launch, and
/// the rate of 32 launches per doorbell.
fn null_kernels(s: &mut GpuStream<CAP>, module: u64, iters: u64) -> Result<(), Failure> {
    let spin = s
        .get_function(module, "spin")
        .map_err(driver("GET_FUNCTION spin"))?;
    let launch = launch_1d(spin.handle, 1, 1);
    let args = [KernelArg::u64(0)];
    let t0 = rdtsc();
    for _ in 0..iters {
        s.launch(&launch, &args).map_err(driver("LAUNCH spin"))?;
    }
    bench::report_per_iter("vgpu_null_launch_roundtrip", rdtsc() - t0, iters);
    let rounds = (iters / 32).max(4);
    let t0 = rdtsc();
    for _ in 0..rounds {
        for _ in 0..32 {
            s.enqueue_launch(&launch, &args, &[])
                .map_err(driver("enqueue LAUNCH spin"))?;
        }
        s.submit();
        s.wait_all().map_err(driver("LAUNCH spin batch"))?;
    }
    if let Some(ns) = ticks_to_ns(rdtsc() - t0).filter(|&ns| ns > 0) {
        bench!(
            "vgpu_null_launches_per_s_batch32",
            (rounds * 32) as f64 * 1e9 / ns as f64,
            "launch/s"
        );
    }
    Ok(())
}

fn run(boot: &BootInfo, args: Args) -> Result<(), Failure> {
    let n = args
        .number("n", 1 << 14)
        .map_err(|e| fail(EXIT_BAD_ARGS, format_args!("{e}")))? as usize;
    let iters = args
        .number("iters", 1000)
        .map_err(|e| fail(EXIT_BAD_ARGS, format_args!("{e}")))?;
    if n == 0 {
        return Err(fail(EXIT_BAD_ARGS, format_args!("n must be at least 1")));
    }
    let (_gpu, mut s) = open_single_with::<CAP>(boot, 2 * CAP as u16)
        .map_err(|e| fail(EXIT_NO_DEVICE, format_args!("{e}")))?;
    let info = s.get_info().map_err(driver("GET_INFO"))?;
    println!(
        "vecadd: vGPU {} '{}' backend {} share {} MiB, {} queues",
        info.vgpu_id,
        info.name_str(),
        info.backend,
        info.memory_share >> 20,
        info.num_queues
    );

    let bytes = 4 * n as u64;
    let bits = float_bits();
    let (a, b) = inputs(n, &bits);
    let da = s.alloc(bytes).map_err(driver("ALLOC a"))?;
    let db = s.alloc(bytes).map_err(driver("ALLOC b"))?;
    let dc = s.alloc(bytes).map_err(driver("ALLOC c"))?;

    let t0 = rdtsc();
    s.memcpy_htod(da, &a).map_err(driver("MEMCPY_HTOD a"))?;
    report_bandwidth("vgpu_htod_bandwidth", a.len(), rdtsc() - t0);
    s.memcpy_htod(db, &b).map_err(driver("MEMCPY_HTOD b"))?;
    // Poison c so a kernel that wrote nothing cannot pass.
    s.memset(dc, u32::MAX, n as u64, 4)
        .map_err(driver("MEMSET c"))?;

    let module = s.load_builtin().map_err(driver("MODULE_LOAD builtin"))?;
    let f = s
        .get_function(module, "vector_add")
        .map_err(driver("GET_FUNCTION vector_add"))?;
    if f.params != 4 {
        return Err(fail(
            EXIT_MISMATCH,
            format_args!("vector_add has {} parameters, want 4", f.params),
        ));
    }
    let launch = launch_1d(f.handle, n as u64, 256);
    let kargs = [
        KernelArg::ptr(da, Access::Read),
        KernelArg::ptr(db, Access::Read),
        KernelArg::ptr(dc, Access::Write),
        KernelArg::u64(n as u64),
    ];
    let device_ns = s
        .launch(&launch, &kargs)
        .map_err(driver("LAUNCH vector_add"))?;
    bench!("vecadd_device_time", device_ns, "ns");

    let mut c = vec![0u8; bytes as usize];
    let t0 = rdtsc();
    s.memcpy_dtoh(&mut c, dc).map_err(driver("MEMCPY_DTOH c"))?;
    report_bandwidth("vgpu_dtoh_bandwidth", c.len(), rdtsc() - t0);
    check(&c, n, &bits, "synchronous")?;
    println!("vecadd: synchronous c = a + b ok ({n} elements)");

    batched(&mut s, (&a, &b), [da, db, dc], (&launch, &kargs), n, &bits)?;
    println!("vecadd: batched (4 requests, one doorbell) ok");

    let t0 = rdtsc();
    for _ in 0..iters {
        s.stream_sync().map_err(driver("STREAM_SYNC"))?;
    }
    bench::report_per_iter("vgpu_request_roundtrip", rdtsc() - t0, iters);
    batching(&mut s, iters)?;
    null_kernels(&mut s, module, iters)?;

    s.unload_module(module).map_err(driver("MODULE_UNLOAD"))?;
    for d in [da, db, dc] {
        s.free(d).map_err(driver("FREE"))?;
    }
    Ok(())
}

/// The same computation as one batch: two uploads, the launch and the download enqueued
/// together and submitted with a single doorbell; in-order completion on the stream makes
/// the download see the kernel's result.
fn batched(
    s: &mut GpuStream<CAP>,
    (a, b): (&[u8], &[u8]),
    [da, db, dc]: [u64; 3],
    (launch, kargs): (&LaunchArgs, &[KernelArg]),
    n: usize,
    bits: &[u32],
) -> Result<(), Failure> {
    s.memset(dc, 0, n as u64, 4).map_err(driver("MEMSET c"))?;
    let mut c = vec![0u8; 4 * n];
    let len = c.len() as u64;
    let phys = |p: *const u8| p as u64;
    // SAFETY: a, b and c are identity-mapped heap buffers that outlive the wait_all below
    // (which returns only when every request completed or the device was reset), and the
    // CPU does not touch c until then.
    let tickets = unsafe {
        [
            s.enqueue_htod(da, phys(a.as_ptr()), len),
            s.enqueue_htod(db, phys(b.as_ptr()), len),
            s.enqueue_launch(launch, kargs, &[]),
            s.enqueue_dtoh(phys(c.as_mut_ptr()), len, dc),
        ]
    };
    for t in tickets {
        t.map_err(driver("enqueue"))?;
    }
    s.submit();
    s.wait_all().map_err(driver("batch"))?;
    check(&c, n, bits, "batched")
}
