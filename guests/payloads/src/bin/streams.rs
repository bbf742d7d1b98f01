//! Several vGPU streams (virtqueues) at once: independent batches on every stream, a long
//! kernel on one stream that must not delay the others, events timing a kernel, and a
//! fence that waits for another stream's work.
//!
//! Arguments: `streams=<k>` (default 4; the vGPU needs that many queues), `n=<elements>`
//! per stream (default 4096), `spin_us=<µs>` for the long kernel (default 300000).
//! Prints `STREAMS OK` and exits 0; a diagnostic and a non-zero code otherwise.
#![no_std]
#![no_main]

extern crate alloc;

use alloc::vec;
use alloc::vec::Vec;

use guest_driver::vgpu::launch_1d;
use guest_driver::vgpu::vgpu_proto::{Access, KernelArg, LaunchArgs};
use guest_driver::Error;
use payload_rt::time::{rdtsc, ticks_to_ns};
use payload_rt::vgpu::{probe, stream_options, GpuStream, DEFAULT_QUEUE_SIZE};
use payload_rt::{bench, println, Args, BootInfo};

payload_rt::entry!(main);

const EXIT_BAD_ARGS: u8 = 2;
const EXIT_NO_DEVICE: u8 = 3;
const EXIT_DRIVER: u8 = 4;
const EXIT_MISMATCH: u8 = 6;
const EXIT_NOT_INDEPENDENT: u8 = 7;

struct Failure(u8);

fn fail(code: u8, what: core::fmt::Arguments) -> Failure {
    println!("streams: FAIL {what}");
    Failure(code)
}

fn driver(what: &'static str) -> impl Fn(Error) -> Failure {
    move |e| fail(EXIT_DRIVER, format_args!("{what}: {e}"))
}

fn main(boot: &'static BootInfo, args: &'static str) -> u8 {
    match run(boot, Args::new(args)) {
        Ok(()) => {
            println!("STREAMS OK");
            0
        }
        Err(Failure(code)) => code,
    }
}

/// Handles of the built-in kernels this payload uses.
struct Kernels {
    vector_add: u64,
    spin: u64,
}

fn run(boot: &BootInfo, args: Args) -> Result<(), Failure> {
    let bad = |e| fail(EXIT_BAD_ARGS, format_args!("{e}"));
    let k = args.number("streams", 4).map_err(bad)? as u16;
    let n = args.number("n", 4096).map_err(bad)? as usize;
    let spin_us = args.number("spin_us", 300_000).map_err(bad)?;
    if k < 2 || n == 0 {
        return Err(fail(
            EXIT_BAD_ARGS,
            format_args!("need streams >= 2 and n >= 1"),
        ));
    }
    let mut gpu = probe(boot, 0).map_err(|e| fail(EXIT_NO_DEVICE, format_args!("{e}")))?;
    if gpu.num_queues() < k {
        return Err(fail(
            EXIT_NO_DEVICE,
            format_args!("the vGPU has {} queues, {k} wanted", gpu.num_queues()),
        ));
    }
    let mut streams: Vec<GpuStream> = Vec::new();
    for i in 0..k {
        streams.push(
            gpu.open_stream(i, stream_options(DEFAULT_QUEUE_SIZE))
                .map_err(driver("open stream"))?,
        );
    }
    gpu.start().map_err(driver("DRIVER_OK"))?;

    let module = streams[0].load_builtin().map_err(driver("MODULE_LOAD"))?;
    let kernels = Kernels {
        vector_add: streams[0]
            .get_function(module, "vector_add")
            .map_err(driver("GET_FUNCTION vector_add"))?
            .handle,
        spin: streams[0]
            .get_function(module, "spin")
            .map_err(driver("GET_FUNCTION spin"))?
            .handle,
    };

    concurrent_batches(&mut streams, &kernels, n)?;
    independence(&mut streams, &kernels, spin_us)?;
    events(&mut streams[1], &kernels)?;
    fence(&mut streams, &kernels)?;
    Ok(())
}

/// f32 bit patterns of small integers, converted once (soft-float is slow here).
fn float_bits(max: u32) -> Vec<u32> {
    (0..max).map(|v| (v as f32).to_bits()).collect()
}

fn word(buf: &[u8], i: usize) -> u32 {
    u32::from_le_bytes([buf[4 * i], buf[4 * i + 1], buf[4 * i + 2], buf[4 * i + 3]])
}

/// Every stream gets its own c = a + b (different inputs per stream) as one batch
/// (upload, upload, launch, download); all batches are in flight together.
fn concurrent_batches(
    streams: &mut [GpuStream],
    kernels: &Kernels,
    n: usize,
) -> Result<(), Failure> {
    let bits = float_bits(1100);
    let k = streams.len();
    // a[i] = i % 1000 + s, b[i] = s: small integers, exact sums.
    let mut host: Vec<(Vec<u8>, Vec<u8>, Vec<u8>)> = Vec::new();
    let mut dev: Vec<[u64; 3]> = Vec::new();
    for (s, st) in streams.iter_mut().enumerate() {
        let mut a = vec![0u8; 4 * n];
        let mut b = vec![0u8; 4 * n];
        for i in 0..n {
            a[4 * i..4 * i + 4].copy_from_slice(&bits[i % 1000 + s].to_le_bytes());
            b[4 * i..4 * i + 4].copy_from_slice(&bits[s].to_le_bytes());
        }
        host.push((a, b, vec![0u8; 4 * n]));
        let mut d = [0u64; 3];
        for x in &mut d {
            *x = st.alloc(4 * n as u64).map_err(driver("ALLOC"))?;
        }
        dev.push(d);
    }
    let t0 = rdtsc();
    for ((st, (a, b, c)), &[da, db, dc]) in streams.iter_mut().zip(host.iter_mut()).zip(&dev) {
        let len = 4 * n as u64;
        let launch = launch_1d(kernels.vector_add, n as u64, 256);
        let kargs = [
            KernelArg::ptr(da, Access::Read),
            KernelArg::ptr(db, Access::Read),
            KernelArg::ptr(dc, Access::Write),
            KernelArg::u64(n as u64),
        ];
        // SAFETY: a, b and c are identity-mapped heap buffers kept in `host` until every
        // stream's wait_all below returned (completion or device reset); the CPU does not
        // touch c before then.
        let tickets = unsafe {
            [
                st.enqueue_htod(da, a.as_ptr() as u64, len),
                st.enqueue_htod(db, b.as_ptr() as u64, len),
                st.enqueue_launch(&launch, &kargs, &[]),
                st.enqueue_dtoh(c.as_mut_ptr() as u64, len, dc),
            ]
        };
        for t in tickets {
            t.map_err(driver("enqueue"))?;
        }
    }
    // One doorbell per stream, all streams busy at once.
    for st in streams.iter_mut() {
        st.submit();
    }
    for st in streams.iter_mut() {
        st.wait_all().map_err(driver("batch"))?;
    }
    let ticks = rdtsc() - t0;
    for (s, (_, _, c)) in host.iter().enumerate() {
        for i in 0..n {
            let want = bits[i % 1000 + 2 * s];
            if word(c, i) != want {
                return Err(fail(
                    EXIT_MISMATCH,
                    format_args!("stream {s}: c[{i}] = {:#x}, want {want:#x}", word(c, i)),
                ));
            }
        }
    }
    if let Some(ns) = ticks_to_ns(ticks) {
        bench!("streams_concurrent_batches", ns, "ns");
    }
    for (st, d) in streams.iter_mut().zip(&dev) {
        for &x in d {
            st.free(x).map_err(driver("FREE"))?;
        }
    }
    println!("streams: {k} concurrent batches of {n} elements ok");
    Ok(())
}

fn spin_launch(kernels: &Kernels) -> LaunchArgs {
    launch_1d(kernels.spin, 1, 1)
}

/// A long kernel on stream 0; the other streams' requests must complete meanwhile.
fn independence(streams: &mut [GpuStream], kernels: &Kernels, spin_us: u64) -> Result<(), Failure> {
    let (first, others) = streams.split_at_mut(1);
    let s0 = &mut first[0];
    let t = s0
        .enqueue_launch(&spin_launch(kernels), &[KernelArg::u64(spin_us)], &[])
        .map_err(driver("enqueue spin"))?;
    s0.submit();
    let start = rdtsc();
    let mut worst = 0u64;
    for st in others.iter_mut() {
        let t0 = rdtsc();
        st.stream_sync().map_err(driver("STREAM_SYNC"))?;
        worst = worst.max(rdtsc() - t0);
    }
    let others_done = rdtsc() - start;
    let spin_ns = s0.wait(t).map_err(driver("spin"))?[0];
    let total = rdtsc() - start;
    let (Some(worst_ns), Some(others_ns), Some(total_ns)) = (
        ticks_to_ns(worst),
        ticks_to_ns(others_done),
        ticks_to_ns(total),
    ) else {
        println!("streams: TSC frequency unknown; independence not timed");
        return Ok(());
    };
    bench!("streams_independent_latency", worst_ns, "ns");
    println!(
        "streams: {} other streams answered within {} us while stream 0 ran a {} us kernel (device {} us, total {} us)",
        others.len(),
        others_ns / 1000,
        spin_us,
        spin_ns / 1000,
        total_ns / 1000
    );
    // The others must finish well inside the long kernel's run.
    if others_ns * 2 > spin_us * 1000 {
        return Err(fail(
            EXIT_NOT_INDEPENDENT,
            format_args!(
                "other streams took {} us during a {spin_us} us kernel on stream 0",
                others_ns / 1000
            ),
        ));
    }
    Ok(())
}

/// EVENT_RECORD around a kernel on one stream; EVENT_ELAPSED must cover the kernel.
fn events(st: &mut GpuStream, kernels: &Kernels) -> Result<(), Failure> {
    const SPIN_US: u64 = 20_000;
    let (start, end) = (0x5354_0001, 0x5354_0002);
    st.event_record(start).map_err(driver("EVENT_RECORD"))?;
    st.launch(&spin_launch(kernels), &[KernelArg::u64(SPIN_US)])
        .map_err(driver("spin"))?;
    st.event_record(end).map_err(driver("EVENT_RECORD"))?;
    let elapsed = st
        .event_elapsed(start, end)
        .map_err(driver("EVENT_ELAPSED"))?;
    if st
        .event_query(end)
        .map_err(driver("EVENT_QUERY"))?
        .is_none()
    {
        return Err(fail(
            EXIT_MISMATCH,
            format_args!("recorded event not complete"),
        ));
    }
    for e in [start, end] {
        st.event_destroy(e).map_err(driver("EVENT_DESTROY"))?;
    }
    bench!("streams_event_elapsed", elapsed, "ns");
    if elapsed < SPIN_US * 1000 * 9 / 10 {
        return Err(fail(
            EXIT_MISMATCH,
            format_args!("events measured {elapsed} ns around a {SPIN_US} us kernel"),
        ));
    }
    println!(
        "streams: events ok ({} us around a {SPIN_US} us kernel)",
        elapsed / 1000
    );
    Ok(())
}

/// A FENCE on stream 1 completes only after what stream 0 was running.
///
/// The fence covers only what the other queues were *executing* when it started
/// (docs/protocol.md). If stream 0's worker thread has not picked its kernel up by then
/// (a loaded 2-core host can leave it unscheduled for longer than the head start below),
/// the fence rightly returns at once. So a try where the kernel is still running after
/// the fence is repeated, and only three such tries in a row fail the check: a fence that
/// never waits fails every time.
fn fence(streams: &mut [GpuStream], kernels: &Kernels) -> Result<(), Failure> {
    const SPIN_US: u64 = 200_000;
    const TRIES: u32 = 3;
    let (first, rest) = streams.split_at_mut(1);
    let (s0, s1) = (&mut first[0], &mut rest[0]);
    for attempt in 1..=TRIES {
        let t = s0
            .enqueue_launch(&spin_launch(kernels), &[KernelArg::u64(SPIN_US)], &[])
            .map_err(driver("enqueue spin"))?;
        s0.submit();
        // Give stream 0's worker time to start the kernel: half the kernel's run.
        payload_rt::time::delay_us(SPIN_US / 2);
        s1.fence().map_err(driver("FENCE"))?;
        if s0.try_take(t).map_err(driver("spin"))?.is_some() {
            println!("streams: fence waited for the other stream's kernel (try {attempt})");
            return Ok(());
        }
        s0.wait(t).map_err(driver("spin"))?;
        println!("streams: try {attempt}: the kernel had not started when the fence ran; again");
    }
    Err(fail(
        EXIT_MISMATCH,
        format_args!(
            "FENCE returned while stream 0's kernel was still running, {TRIES} tries in a row"
        ),
    ))
}
