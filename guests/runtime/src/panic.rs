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

/// The precompiled `core` for the host triple is built with unwinding, so its unwind
/// tables name this personality routine and the link needs the symbol. With
/// panic = "abort" and no unwinder in the image nothing ever calls it; if something did,
/// stopping is the only safe answer.
#[unsafe(no_mangle)]
extern "C" fn rust_eh_personality() -> ! {
    crate::serial::print_unlocked(format_args!("PANIC: unwinding is not supported\n"));
    crate::exit::exit(EXIT_PANIC)
}
