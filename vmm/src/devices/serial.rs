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

/// Why a serial port state could not be restored.
#[derive(Debug, thiserror::Error)]
pub enum SerialRestoreError {
    #[error("the serial port's state is invalid (its input FIFO holds more than 64 bytes)")]
    BadState,
    #[error("cannot duplicate the serial interrupt eventfd: {0}")]
    EventFd(std::io::Error),
}

/// The guest's console. `inner` is `None` only for the instant a restore swaps it.
pub struct SerialDevice<W: Write + Send> {
    inner: Option<Serial<IrqTrigger, NoEvents, W>>,
}

impl<W: Write + Send> SerialDevice<W> {
    pub fn new(irq: EventFd, out: W) -> Self {
        Self {
            inner: Some(Serial::new(IrqTrigger(irq), out)),
        }
    }

    /// Flushes what the guest wrote.
    pub fn flush(&mut self) {
        if let Some(inner) = self.inner.as_mut() {
            let _ = inner.writer_mut().flush();
        }
    }

    /// The UART's registers and input FIFO.
    pub fn state(&self) -> vm_superio::serial::SerialState {
        self.inner.as_ref().map(Serial::state).unwrap_or_default()
    }

    /// Replaces the UART's registers and FIFO with `state`, keeping the output and the
    /// interrupt line. On error the device keeps its previous state.
    pub fn restore(
        &mut self,
        state: &vm_superio::serial::SerialState,
    ) -> Result<(), SerialRestoreError> {
        if state.in_buffer.len() > 64 {
            return Err(SerialRestoreError::BadState);
        }
        let Some(old) = self.inner.take() else {
            return Err(SerialRestoreError::BadState);
        };
        let irq = match old.interrupt_evt().0.try_clone() {
            Ok(irq) => irq,
            Err(e) => {
                self.inner = Some(old);
                return Err(SerialRestoreError::EventFd(e));
            }
        };
        let out = old.into_writer();
        match Serial::from_state(state, IrqTrigger(irq), NoEvents, out) {
            Ok(s) => {
                self.inner = Some(s);
                Ok(())
            }
            // from_state fails only on an oversized FIFO (checked above) or a failed
            // interrupt write, after it consumed the writer: the port is gone either way.
            Err(e) => {
                tracing::error!("cannot restore the serial port: {e:?}");
                Err(SerialRestoreError::BadState)
            }
        }
    }
}

impl<W: Write + Send> BusDevice for SerialDevice<W> {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        data.fill(0xff);
        if let (Ok(off), Some(first), Some(inner)) =
            (u8::try_from(offset), data.first_mut(), self.inner.as_mut())
        {
            *first = inner.read(off);
        }
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        if let (Ok(off), Some(&value), Some(inner)) =
            (u8::try_from(offset), data.first(), self.inner.as_mut())
        {
            if let Err(e) = inner.write(off, value) {
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
        assert_eq!(dev.inner.as_ref().unwrap().writer(), b"hi\n");
        dev.write(300, &[1]);
        dev.write(0, &[]);
    }

    #[test]
    fn state_round_trips_and_keeps_the_output() {
        let mut dev = SerialDevice::new(EventFd::new(libc::EFD_NONBLOCK).unwrap(), Vec::new());
        dev.write(7, &[0x5a]); // scratch register
        dev.write(0, b"a");
        let state = dev.state();
        assert_eq!(state.scratch, 0x5a);
        let mut other = SerialDevice::new(EventFd::new(libc::EFD_NONBLOCK).unwrap(), Vec::new());
        other.restore(&state).unwrap();
        let mut scratch = [0u8];
        other.read(7, &mut scratch);
        assert_eq!(scratch[0], 0x5a);
        let mut big = state.clone();
        big.in_buffer = vec![0; 65];
        assert!(other.restore(&big).is_err());
        other.read(7, &mut scratch);
        assert_eq!(scratch[0], 0x5a);
    }
}
