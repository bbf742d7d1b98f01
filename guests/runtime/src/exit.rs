//! Leaving the VM: debug exit port, i8042 reset, parking a vCPU.

use crate::io::outb;

/// Debug exit device: the vmm exits with the low 8 bits written here.
const EXIT_PORT: u16 = 0xF4;
const I8042_COMMAND: u16 = 0x64;
const I8042_RESET: u8 = 0xFE;

/// Ends the VM; the vmm exits with `code`.
pub fn exit(code: u8) -> ! {
    // SAFETY: the debug exit port only ends the VM.
    unsafe { outb(EXIT_PORT, code) }
    // Only reached if the vmm ignored the exit; never return into a payload that asked to stop.
    park()
}

/// Asks the i8042 to reset the machine; the vmm treats it as a clean shutdown (exit 0).
/// Returns if the vmm ignored the request, so the caller can report that.
pub fn reset() {
    // SAFETY: writing 0xFE to the i8042 command port pulses reset and nothing else.
    unsafe { outb(I8042_COMMAND, I8042_RESET) }
}

/// Stops this vCPU for good: interrupts off, halt, and halt again on any wake-up.
pub fn park() -> ! {
    loop {
        // SAFETY: cli/hlt only affect this vCPU's interrupt flag and execution; touches no memory.
        unsafe { core::arch::asm!("cli", "hlt", options(nomem, nostack)) }
    }
}
