//! The small ISA pieces a payload uses: the debug-exit port, the i8042 reset line and the
//! POST code port.

use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::Arc;
use std::time::Instant;

use vmm_sys_util::eventfd::EventFd;

use super::bus::BusDevice;

/// How the VM ended, shared by every device and vCPU that can end it. The first reason wins.
pub struct ExitState {
    code: AtomicI32,
    set: AtomicBool,
    /// Written once the VM should stop; the event loop waits on it.
    pub evt: EventFd,
    /// When the vmm started, and when the guest first did port I/O (ms, -1 = not yet).
    pub started: Instant,
    first_io_us: AtomicI32,
}

impl ExitState {
    pub fn new(started: Instant) -> std::io::Result<Self> {
        Ok(Self {
            code: AtomicI32::new(0),
            set: AtomicBool::new(false),
            evt: EventFd::new(libc::EFD_NONBLOCK)?,
            started,
            first_io_us: AtomicI32::new(-1),
        })
    }

    /// Asks the VM to stop with `code`; later requests keep the first code.
    pub fn request(&self, code: i32) {
        if !self.set.swap(true, Ordering::SeqCst) {
            self.code.store(code, Ordering::SeqCst);
        }
        let _ = self.evt.write(1);
    }

    pub fn requested(&self) -> bool {
        self.set.load(Ordering::SeqCst)
    }

    pub fn code(&self) -> i32 {
        self.code.load(Ordering::SeqCst)
    }

    /// Records the first guest port I/O, the moment a payload's runtime reached `main`.
    pub fn note_io(&self) {
        if self.first_io_us.load(Ordering::Relaxed) < 0 {
            let us = self.started.elapsed().as_micros().min(i32::MAX as u128) as i32;
            let _ = self
                .first_io_us
                .compare_exchange(-1, us, Ordering::SeqCst, Ordering::SeqCst);
        }
    }

    /// Microseconds from vmm start to the guest's first port I/O.
    pub fn first_io_us(&self) -> Option<u32> {
        u32::try_from(self.first_io_us.load(Ordering::SeqCst)).ok()
    }
}

/// Port 0xF4: the low byte written is the vmm's exit code.
pub struct DebugExit(pub Arc<ExitState>);

impl BusDevice for DebugExit {
    fn read(&mut self, _offset: u64, data: &mut [u8]) {
        data.fill(0xff);
    }
    fn write(&mut self, _offset: u64, data: &[u8]) {
        let code = data.first().copied().unwrap_or(0);
        tracing::debug!(code, "guest wrote the debug-exit port");
        self.0.request(i32::from(code));
    }
}

/// Ports 0x60/0x64 through vm-superio's i8042; its reset ends the VM with code 0.
pub struct I8042 {
    inner: vm_superio::I8042Device<ResetTrigger>,
}

pub struct ResetTrigger(Arc<ExitState>);

impl vm_superio::Trigger for ResetTrigger {
    type E = std::io::Error;
    fn trigger(&self) -> std::io::Result<()> {
        tracing::debug!("guest reset the machine through the i8042");
        self.0.request(0);
        Ok(())
    }
}

impl I8042 {
    pub fn new(exit: Arc<ExitState>) -> Self {
        Self {
            inner: vm_superio::I8042Device::new(ResetTrigger(exit)),
        }
    }
}

/// Offsets within the 0x60..0x65 window.
impl BusDevice for I8042 {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        data.fill(0xff);
        if let Some(first) = data.first_mut() {
            *first = self.inner.read(offset as u8);
        }
    }
    fn write(&mut self, offset: u64, data: &[u8]) {
        if let Some(&v) = data.first() {
            let _ = self.inner.write(offset as u8, v);
        }
    }
}

/// Port 0x80: accepted and ignored.
pub struct PostCode;

impl BusDevice for PostCode {
    fn read(&mut self, _offset: u64, data: &mut [u8]) {
        data.fill(0);
    }
    fn write(&mut self, _offset: u64, _data: &[u8]) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_exit_code_wins() {
        let s = Arc::new(ExitState::new(Instant::now()).unwrap());
        let mut d = DebugExit(s.clone());
        d.write(0, &[7, 1, 2, 3]);
        I8042::new(s.clone()).write(4, &[0xfe]);
        assert!(s.requested());
        assert_eq!(s.code(), 7);
        assert_eq!(s.evt.read().unwrap(), 2);
    }

    #[test]
    fn i8042_reset_exits_zero() {
        let s = Arc::new(ExitState::new(Instant::now()).unwrap());
        let mut k = I8042::new(s.clone());
        k.write(4, &[0x20]);
        assert!(!s.requested());
        k.write(4, &[0xfe]);
        assert!(s.requested());
        assert_eq!(s.code(), 0);
    }
}
