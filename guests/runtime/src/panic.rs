//! Panics print their message and end the VM with a code tests can tell apart.

use core::sync::atomic::{AtomicBool, Ordering};

use crate::EXIT_PANIC;

static PANICKING: AtomicBool = AtomicBool::new(false);

#[panic_handler]
fn panic(info: &core::panic::PanicInfo) -> ! {
    // A second panic (another vCPU, or formatting the first message) must not recurse or
    // wait for a console lock the first one may hold.
    if !PANICKING.swap(true, Ordering::AcqRel) {
        crate::serial::print_unlocked(format_args!("PANIC: {info}\n"));
        crate::exit::exit(EXIT_PANIC);
    }
    crate::exit::park()
}
