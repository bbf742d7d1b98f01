//! Drives the first virtio-mmio device through guest-driver against the in-test echo
//! backend (which copies each chain's readable bytes into its writable buffers), and
//! measures the doorbell round trip.
//!
//! Arguments: `iters=<n>` round trips to time (default 10000). `until-reset`: instead,
//! keep one small request in flight at a time, whatever the backend answers, until the
//! backend disappears; pass when the device then reports DEVICE_NEEDS_RESET and raised a
//! configuration interrupt (the vmm's behaviour when a vhost-user backend dies).
//! Prints `ECHO OK` and exits 0 on success; a diagnostic and a non-zero code otherwise.
#![no_std]
#![no_main]

extern crate alloc;

use alloc::vec;
use alloc::vec::Vec;

use guest_driver::{feature, Buffer, SplitQueue, Used, VirtioMmio};
use payload_rt::time::{rdtsc, Deadline};
use payload_rt::virtio::MmioTransport;
use payload_rt::{bench, println, Args, BootInfo};

payload_rt::entry!(main);

const EXIT_BAD_ARGS: u8 = 2;
const EXIT_NO_DEVICE: u8 = 3;
const EXIT_DRIVER: u8 = 4;
const EXIT_TIMEOUT: u8 = 5;
const EXIT_MISMATCH: u8 = 6;

/// Room for the 64-chain batch at two descriptors per chain.
const QUEUE_LIMIT: u16 = 128;
const BATCH: usize = 64;
const SIZES: [usize; 8] = [1, 7, 64, 511, 4096, 4097, 65536, 1 << 20];
const ROUNDTRIP_BYTES: usize = 64;
/// A live backend answers in microseconds; this only turns a dead one into a diagnostic.
const TIMEOUT_MS: u64 = 5_000;

type Queue = SplitQueue<{ QUEUE_LIMIT as usize }>;
type Device = VirtioMmio<MmioTransport>;

/// What went wrong, as the exit code and the line printed before it.
struct Failure(u8);

fn fail(code: u8, what: core::fmt::Arguments) -> Failure {
    println!("vhost-echo: FAIL {what}");
    Failure(code)
}

fn main(boot: &'static BootInfo, args: &'static str) -> u8 {
    match run(boot, Args::new(args)) {
        Ok(()) => {
            println!("ECHO OK");
            0
        }
        Err(Failure(code)) => code,
    }
}

fn run(boot: &BootInfo, args: Args) -> Result<(), Failure> {
    let iters = args
        .number("iters", 10_000)
        .map_err(|e| fail(EXIT_BAD_ARGS, format_args!("{e}")))?;
    let transport = MmioTransport::from_boot(boot, 0).ok_or_else(|| {
        fail(
            EXIT_NO_DEVICE,
            format_args!("no virtio-mmio device in BootInfo"),
        )
    })?;
    let (dev, mut q) = init(transport)?;
    if args.flag("until-reset") {
        return until_reset(&dev, &mut q);
    }

    for (i, &n) in SIZES.iter().enumerate() {
        echo_one(&dev, &mut q, n, i as u8)?;
    }
    println!(
        "vhost-echo: single chains ok ({} sizes up to {} bytes)",
        SIZES.len(),
        SIZES[SIZES.len() - 1]
    );
    let batch = BATCH.min(usize::from(q.size() / 2));
    for round in 0..3u8 {
        echo_batch(&dev, &mut q, batch, round)?;
    }
    println!("vhost-echo: batches of {batch} chains with one kick ok");

    roundtrip(&dev, &mut q, iters)?;
    // Completions were polled; clear whatever interrupt state the device raised anyway.
    let pending = dev.interrupt_status();
    dev.ack_interrupt(pending);
    if dev.needs_reset() {
        return Err(fail(
            EXIT_DRIVER,
            format_args!("device set DEVICE_NEEDS_RESET"),
        ));
    }
    Ok(())
}

fn init(transport: MmioTransport) -> Result<(Device, Queue), Failure> {
    let base = transport.base();
    let driver =
        |e: guest_driver::Error| fail(EXIT_DRIVER, format_args!("device at {base:#x}: {e}"));
    let mut dev = VirtioMmio::probe(transport).map_err(driver)?;
    let features = dev.negotiate(0, feature::RING_EVENT_IDX).map_err(driver)?;
    let size = dev.pick_queue_size(0, QUEUE_LIMIT).map_err(driver)?;
    let mut q = Queue::allocate(dev.transport(), size).map_err(driver)?;
    // This payload polls the used ring; interrupts would only cost the device an irqfd write.
    q.set_interrupts(false);
    dev.activate_queue(0, &mut q).map_err(driver)?;
    dev.driver_ok().map_err(driver)?;
    println!(
        "vhost-echo: device {:#x} at {base:#x}, features {features:#x}, queue 0 size {size}",
        dev.device_id()
    );
    Ok((dev, q))
}

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31) ^ (i >> 8) as u8 ^ seed)
        .collect()
}

/// Guest-physical address of a buffer the device reads. Heap memory is identity mapped.
fn addr(buf: &[u8]) -> u64 {
    buf.as_ptr() as u64
}

/// Guest-physical address of a buffer the device writes: taken from a mutable pointer so
/// the compiler knows the bytes may change (the Acquire fence in pop_used orders the reads).
fn addr_mut(buf: &mut [u8]) -> u64 {
    buf.as_mut_ptr() as u64
}

/// Polls until the device returns a chain, or reports a timeout with the device state.
fn wait_used(dev: &Device, q: &mut Queue) -> Result<Used, Failure> {
    let deadline = Deadline::after_ms(TIMEOUT_MS);
    loop {
        match q.pop_used() {
            Ok(Some(used)) => return Ok(used),
            Ok(None) if deadline.expired() => {
                return Err(fail(
                    EXIT_TIMEOUT,
                    format_args!(
                        "no completion after {TIMEOUT_MS} ms ({} outstanding, status {:#x})",
                        q.outstanding(),
                        dev.status()
                    ),
                ))
            }
            Ok(None) => core::hint::spin_loop(),
            Err(e) => return Err(fail(EXIT_DRIVER, format_args!("used ring: {e}"))),
        }
    }
}

fn check(src: &[u8], dst: &[u8], used_len: u32, what: core::fmt::Arguments) -> Result<(), Failure> {
    if used_len as usize != src.len() {
        return Err(fail(
            EXIT_MISMATCH,
            format_args!("{what}: used length {used_len}, sent {}", src.len()),
        ));
    }
    if let Some(i) = src.iter().zip(dst).position(|(a, b)| a != b) {
        return Err(fail(
            EXIT_MISMATCH,
            format_args!("{what}: byte {i} is {:#x}, sent {:#x}", dst[i], src[i]),
        ));
    }
    Ok(())
}

fn echo_one(dev: &Device, q: &mut Queue, n: usize, seed: u8) -> Result<(), Failure> {
    let src = pattern(n, seed);
    let mut dst = vec![0u8; n];
    let len = n as u32;
    let token = q
        .add(&[
            Buffer::readable(addr(&src), len),
            Buffer::writable(addr_mut(&mut dst), len),
        ])
        .map_err(|e| fail(EXIT_DRIVER, format_args!("add {n} bytes: {e}")))?;
    dev.kick(0, q);
    let used = wait_used(dev, q)?;
    if used.token != token {
        return Err(fail(
            EXIT_MISMATCH,
            format_args!("{n} bytes: device returned another chain"),
        ));
    }
    check(&src, &dst, used.len, format_args!("{n} bytes"))
}

fn echo_batch(dev: &Device, q: &mut Queue, batch: usize, round: u8) -> Result<(), Failure> {
    // Chain i carries 32 + 61 * i bytes, so every chain's echo is distinguishable.
    let srcs: Vec<Vec<u8>> = (0..batch)
        .map(|i| pattern(32 + 61 * i, round ^ i as u8))
        .collect();
    let mut dsts: Vec<Vec<u8>> = srcs.iter().map(|s| vec![0u8; s.len()]).collect();
    // Token index (a head descriptor, below the queue size) -> chain number.
    let mut chain_of = vec![usize::MAX; usize::from(q.size())];
    for (i, (s, d)) in srcs.iter().zip(&mut dsts).enumerate() {
        let token = q
            .add(&[
                Buffer::readable(addr(s), s.len() as u32),
                Buffer::writable(addr_mut(d), d.len() as u32),
            ])
            .map_err(|e| fail(EXIT_DRIVER, format_args!("batch add {i}: {e}")))?;
        chain_of[usize::from(token.index())] = i;
    }
    dev.kick(0, q);
    let mut seen = vec![false; batch];
    for _ in 0..batch {
        let used = wait_used(dev, q)?;
        let i = chain_of[usize::from(used.token.index())];
        if i >= batch || seen[i] {
            return Err(fail(
                EXIT_MISMATCH,
                format_args!("batch: unexpected chain {:?}", used.token),
            ));
        }
        seen[i] = true;
        check(
            &srcs[i],
            &dsts[i],
            used.len,
            format_args!("batch round {round} chain {i}"),
        )?;
    }
    Ok(())
}

fn roundtrip(dev: &Device, q: &mut Queue, iters: u64) -> Result<(), Failure> {
    let src = pattern(ROUNDTRIP_BYTES, 0x5a);
    let mut dst = vec![0u8; ROUNDTRIP_BYTES];
    let bufs = [
        Buffer::readable(addr(&src), ROUNDTRIP_BYTES as u32),
        Buffer::writable(addr_mut(&mut dst), ROUNDTRIP_BYTES as u32),
    ];
    let mut kicks = 0u64;
    let start = rdtsc();
    for i in 0..iters {
        q.add(&bufs)
            .map_err(|e| fail(EXIT_DRIVER, format_args!("roundtrip {i}: {e}")))?;
        kicks += u64::from(dev.kick(0, q));
        let used = wait_used(dev, q)?;
        if used.len as usize != ROUNDTRIP_BYTES {
            return Err(fail(
                EXIT_MISMATCH,
                format_args!("roundtrip {i}: used length {}", used.len),
            ));
        }
    }
    let ticks = rdtsc().saturating_sub(start);
    check(
        &src,
        &dst,
        ROUNDTRIP_BYTES as u32,
        format_args!("roundtrip"),
    )?;
    println!("vhost-echo: {iters} round trips, {kicks} doorbells");
    bench::report_per_iter("vhost_roundtrip", ticks, iters);
    Ok(())
}

/// Sends requests until they stop completing, then expects DEVICE_NEEDS_RESET.
fn until_reset(dev: &Device, q: &mut Queue) -> Result<(), Failure> {
    let src = pattern(ROUNDTRIP_BYTES, 0x11);
    let mut dst = vec![0u8; ROUNDTRIP_BYTES];
    let bufs = [
        Buffer::readable(addr(&src), ROUNDTRIP_BYTES as u32),
        Buffer::writable(addr_mut(&mut dst), ROUNDTRIP_BYTES as u32),
    ];
    let mut served = 0u64;
    loop {
        q.add(&bufs)
            .map_err(|e| fail(EXIT_DRIVER, format_args!("until-reset add: {e}")))?;
        dev.kick(0, q);
        let deadline = Deadline::after_ms(TIMEOUT_MS);
        let completed = loop {
            match q.pop_used() {
                Ok(Some(_)) => break true,
                Ok(None) if dev.needs_reset() || deadline.expired() => break false,
                Ok(None) => core::hint::spin_loop(),
                Err(e) => return Err(fail(EXIT_DRIVER, format_args!("used ring: {e}"))),
            }
        };
        if completed {
            served += 1;
            if served == 1 {
                println!("vhost-echo: serving");
            }
            continue;
        }
        if !dev.needs_reset() {
            return Err(fail(
                EXIT_TIMEOUT,
                format_args!(
                    "request {served} never completed and the device did not ask for a reset"
                ),
            ));
        }
        let config_irq = dev.interrupt_status() & 2 != 0;
        println!(
            "vhost-echo: DEVICE_NEEDS_RESET after {served} requests, config interrupt {config_irq}"
        );
        return if config_irq {
            Ok(())
        } else {
            Err(fail(
                EXIT_DRIVER,
                format_args!("no configuration interrupt with the reset request"),
            ))
        };
    }
}
