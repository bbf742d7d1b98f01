//! Smoke payload: proves the vmm's entry state, BootInfo, console and exit paths.
//!
//! Arguments: `exit=<n>` exits with code n (checks exit-code propagation); `reset` leaves
//! through the i8042 reset instead (the vmm then exits 0); `panic` panics (the runtime
//! prints the message and exits 101). With several vCPUs, every other
//! vCPU checks in through the runtime's AP hook and `main` reports them (`aps=<n>`).
#![no_std]
#![no_main]

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
