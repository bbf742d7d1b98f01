//! Anchor for the vmm benchmarks: the cost of one guest exit to the vmm and back, measured
//! with writes to the POST code port (0x80), which the vmm accepts and ignores.
//!
//! Argument: the number of exits, as a bare number or `n=<count>` (default 100000).
#![no_std]
#![no_main]

use payload_rt::args::parse_number;
use payload_rt::{bench, io, println, Args, BootInfo};

payload_rt::entry!(main);

const DEFAULT_EXITS: u64 = 100_000;
const POST_PORT: u16 = 0x80;
const EXIT_BAD_ARGS: u8 = 2;

fn main(_boot: &'static BootInfo, args: &'static str) -> u8 {
    let args = Args::new(args);
    let n = match args.positional(0).or(args.value("n")) {
        None => DEFAULT_EXITS,
        Some(s) => match parse_number(s) {
            Some(n) if n > 0 => n,
            _ => {
                println!("kvm-exits: bad exit count {s:?}");
                return EXIT_BAD_ARGS;
            }
        },
    };
    bench!("kvm_exit_cost", n, || {
        // SAFETY: the POST code port is a write-only sink in this vmm (payload-abi.md).
        unsafe { io::outb(POST_PORT, 0) }
    });
    println!("kvm-exits: {n} exits");
    0
}
