//! COM1 through vm-superio's 16550A, its interrupt on an irqfd.

use std::io::Write;

use vm_superio::serial::NoEvents;
use vm_superio::{Serial, Trigger};
use vmm_sys_util::eventfd::EventFd;

use super::bus::BusDevice;

/// Raises the serial IRQ by writing its irqfd.
pub struct IrqTrigger(pub EventFd);

impl Trigger for IrqTrigger {
    type E = std::io::Error;
    fn trigger(&self) -> std::io::Result<()> {
        self.0.write(1)
    }
}

/// The guest's console.
pub struct SerialDevice<W: Write + Send> {
    inner: Serial<IrqTrigger, NoEvents, W>,
}

impl<W: Write + Send> SerialDevice<W> {
    pub fn new(irq: EventFd, out: W) -> Self {
        Self {
            inner: Serial::new(IrqTrigger(irq), out),
        }
    }

    /// Flushes what the guest wrote.
    pub fn flush(&mut self) {
        let _ = self.inner.writer_mut().flush();
    }
}

impl<W: Write + Send> BusDevice for SerialDevice<W> {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        data.fill(0xff);
        if let (Ok(off), Some(first)) = (u8::try_from(offset), data.first_mut()) {
            *first = self.inner.read(off);
        }
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        if let (Ok(off), Some(&value)) = (u8::try_from(offset), data.first()) {
            if let Err(e) = self.inner.write(off, value) {
                tracing::debug!("serial write failed: {e:?}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guest_bytes_reach_the_writer() {
        let mut dev = SerialDevice::new(EventFd::new(libc::EFD_NONBLOCK).unwrap(), Vec::new());
        for b in b"hi\n" {
            dev.write(0, &[*b]);
        }
        // LSR reports the transmitter empty, so a polling guest never stalls.
        let mut lsr = [0u8];
        dev.read(5, &mut lsr);
        assert_ne!(lsr[0] & 0x20, 0);
        assert_eq!(dev.inner.writer(), b"hi\n");
        dev.write(300, &[1]);
        dev.write(0, &[]);
    }
}
