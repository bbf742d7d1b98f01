//! Leaving the VM: debug exit port, i8042 reset, parking a vCPU.

use crate::io::{outb, outl};

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

/// vCPU idle port: the vmm sleeps the writing vCPU for the value in µs (at most 1000).
const IDLE_PORT: u16 = 0xF6;

/// Gives the host `us` microseconds of this vCPU's time (the vmm sleeps instead of
/// running it): how a ring-3 payload that cannot `hlt` waits without burning a host CPU.
pub fn idle_us(us: u32) {
    // SAFETY: a write to the idle port has no effect on memory.
    unsafe { outl(IDLE_PORT, us) }
}

/// vCPU park port: the vmm stops running the vCPU that writes it.
const PARK_PORT: u16 = 0xF5;

/// Stops this vCPU for good. Payloads run in ring 3 (docs/payload-abi.md), where `hlt`
/// faults, so the vmm parks the vCPU on a port write; the pause loop only covers a vmm
/// that ignores the port.
pub fn park() -> ! {
    // SAFETY: a write to the park port has no effect on memory.
    unsafe { outb(PARK_PORT, 0) }
    loop {
        core::hint::spin_loop();
    }
}
