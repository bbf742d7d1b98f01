//! COM1 console. The vmm forwards what the guest writes to its stdout; tests parse it.

use core::fmt::{self, Write};
use core::sync::atomic::{AtomicBool, Ordering};

use crate::io::{inb, outb, pause};

const COM1: u16 = 0x3F8;
const LSR: u16 = COM1 + 5;
/// Line status: transmit holding register empty.
const LSR_THRE: u8 = 0x20;
/// Each poll is a VM exit; an emulated UART is ready at once, so this bound only keeps a
/// broken device from hanging the payload.
const MAX_POLLS: u32 = 1 << 16;

/// Serialises whole `print!` calls across vCPUs so lines do not interleave.
static LOCK: AtomicBool = AtomicBool::new(false);

pub struct Serial;

impl Serial {
    pub fn write_byte(b: u8) {
        let mut polls = 0;
        // SAFETY: reading COM1's line status register has no side effect beyond the exit.
        while unsafe { inb(LSR) } & LSR_THRE == 0 && polls < MAX_POLLS {
            polls += 1;
            pause();
        }
        // SAFETY: writing the transmit register of COM1 prints one byte, nothing else.
        unsafe { outb(COM1, b) }
    }
}

impl Write for Serial {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        s.bytes().for_each(Self::write_byte);
        Ok(())
    }
}

/// Prints under the console lock. Used by `print!`/`println!`.
pub fn print_locked(args: fmt::Arguments) {
    while LOCK
        .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
        .is_err()
    {
        pause();
    }
    // Serial::write_str never fails, so neither does this.
    let _ = Serial.write_fmt(args);
    LOCK.store(false, Ordering::Release);
}

/// Prints without taking the lock: the panic path, which may run while the lock is held.
pub fn print_unlocked(args: fmt::Arguments) {
    let _ = Serial.write_fmt(args);
}

#[macro_export]
macro_rules! print {
    ($($arg:tt)*) => { $crate::serial::print_locked(format_args!($($arg)*)) };
}

#[macro_export]
macro_rules! println {
    () => { $crate::print!("\n") };
    ($($arg:tt)*) => { $crate::serial::print_locked(format_args!("{}\n", format_args!($($arg)*))) };
}
