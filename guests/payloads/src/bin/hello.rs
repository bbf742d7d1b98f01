//! Smoke payload: proves the vmm's entry state, BootInfo, console and exit paths.
//!
//! Arguments: `exit=<n>` exits with code n (checks exit-code propagation); `reset` leaves
//! through the i8042 reset instead (the vmm then exits 0).
#![no_std]
#![no_main]

use payload_rt::{println, Args, BootInfo};

payload_rt::entry!(main);

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
    let args = Args::new(args);
    let code = match args.number("exit", 0) {
        Ok(code) => code,
        Err(e) => {
            println!("hello: {e}");
            return EXIT_BAD_ARGS;
        }
    };
    if args.flag("reset") {
        payload_rt::reset();
        println!("hello: reset ignored by the vmm");
        return EXIT_RESET_IGNORED;
    }
    // The vmm passes on the low 8 bits, as the port does.
    code as u8
}
