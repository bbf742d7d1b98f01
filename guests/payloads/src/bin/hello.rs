//! Smoke payload: proves the vmm's entry state, BootInfo, console and exit paths.
//!
//! Arguments: `exit=<n>` exits with code n (checks exit-code propagation); `reset` leaves
//! through the i8042 reset instead (the vmm then exits 0); `panic` panics (the runtime
//! prints the message and exits 101). With several vCPUs, every other
//! vCPU checks in through the runtime's AP hook and `main` reports them (`aps=<n>`).
//!
//! `churn=<MiB> passes=<n>` keeps writing memory for live-migration tests: it rewrites
//! every word of a `<MiB>` buffer `n` times (each value depends on the previous one), then
//! prints `churn: mib=<m> passes=<n> checksum=0x<16 hex digits>` and exits 0. The checksum
//! depends only on the arguments, so a migrated run must print the same as an unmigrated
//! one. `progress=<k>` prints `churn: pass <p>` every k passes. `hot=<MiB>` rewrites only
//! the first `<MiB>` after the first pass (a working set inside a larger, filled RAM); the
//! line `churn: filled` follows the first pass.
#![no_std]
#![no_main]

extern crate alloc;

use core::sync::atomic::{AtomicU32, Ordering};

use payload_rt::time::Deadline;
use payload_rt::{println, Args, BootInfo};

payload_rt::entry!(main, ap = ap_main);

/// vCPUs other than 0 that reached their AP hook.
static APS: AtomicU32 = AtomicU32::new(0);
/// How long main waits for the other vCPUs to check in.
const AP_WAIT_MS: u64 = 2_000;

fn ap_main(_boot: &'static BootInfo, _index: u32) {
    APS.fetch_add(1, Ordering::AcqRel);
}

/// Exit code when the vmm ignored the reset request.
const EXIT_RESET_IGNORED: u8 = 3;
const EXIT_BAD_ARGS: u8 = 2;

fn main(boot: &'static BootInfo, args: &'static str) -> u8 {
    println!(
        "hello from vgpu payload: vcpus={} mem={}",
        boot.vcpus,
        boot.mem_bytes() >> 20
    );
    println!("args: {args}");
    if boot.vcpus > 1 {
        let deadline = Deadline::after_ms(AP_WAIT_MS);
        while APS.load(Ordering::Acquire) < boot.vcpus - 1 && !deadline.expired() {
            core::hint::spin_loop();
        }
        println!("aps={}", APS.load(Ordering::Acquire));
    }
    let args = Args::new(args);
    if args.value("churn").is_some() {
        return churn(&args);
    }
    let code = match args.number("exit", 0) {
        Ok(code) => code,
        Err(e) => {
            println!("hello: {e}");
            return EXIT_BAD_ARGS;
        }
    };
    if args.flag("panic") {
        panic!("hello: panicking on request");
    }
    if args.flag("reset") {
        payload_rt::reset();
        println!("hello: reset ignored by the vmm");
        return EXIT_RESET_IGNORED;
    }
    // The vmm passes on the low 8 bits, as the port does.
    code as u8
}

/// One step of the churn: a 64-bit mix of the previous word, its index and the pass.
fn mix(prev: u64, index: u64, pass: u64) -> u64 {
    let mut x = prev ^ index.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (pass << 40);
    x ^= x >> 31;
    x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x ^ (x >> 29)
}

/// The `churn` mode (see the module docs).
fn churn(args: &Args) -> u8 {
    let (mib, passes, progress, hot) = match (
        args.number("churn", 0),
        args.number("passes", 100),
        args.number("progress", 0),
        args.number("hot", 0),
    ) {
        (Ok(m), Ok(p), Ok(g), Ok(h)) if m > 0 && h <= m => (m, p, g, if h == 0 { m } else { h }),
        _ => {
            println!("hello: churn needs churn=<MiB> (> 0), passes=<n>, progress=<k>, hot=<MiB> (<= churn)");
            return EXIT_BAD_ARGS;
        }
    };
    let words = (mib as usize) << 17;
    let mut buf = alloc::vec::Vec::new();
    if buf.try_reserve_exact(words).is_err() {
        println!("hello: churn cannot allocate {mib} MiB");
        return EXIT_BAD_ARGS;
    }
    buf.resize(words, 0u64);
    let hot_words = (hot as usize) << 17;
    for pass in 0..passes {
        let n = if pass == 0 { words } else { hot_words };
        for (i, w) in buf[..n].iter_mut().enumerate() {
            *w = mix(*w, i as u64, pass);
        }
        if pass == 0 {
            println!("churn: filled");
        }
        if progress > 0 && (pass + 1) % progress == 0 {
            println!("churn: pass {}", pass + 1);
        }
    }
    let sum = buf.iter().fold(0xcbf2_9ce4_8422_2325_u64, |h, &w| {
        (h ^ w).wrapping_mul(0x0000_0100_0000_01b3)
    });
    println!("churn: mib={mib} passes={passes} checksum={sum:#018x}");
    0
}
