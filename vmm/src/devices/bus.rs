//! A fixed address map from guest port or MMIO addresses to devices. Built before the vCPUs
//! start and read-only afterwards, so vCPU threads share it without a lock on the map.

use std::sync::{Arc, Mutex};

/// A device that answers guest reads and writes in its window.
pub trait BusDevice: Send {
    /// A read of `data.len()` bytes at `offset` into the device's window.
    fn read(&mut self, offset: u64, data: &mut [u8]);
    /// A write of `data` at `offset` into the device's window.
    fn write(&mut self, offset: u64, data: &[u8]);
}

/// Why a device could not be placed on a bus.
#[derive(Debug, thiserror::Error)]
pub enum BusError {
    /// Two devices claim overlapping windows.
    #[error("device window {base:#x}+{len:#x} overlaps another device")]
    Overlap { base: u64, len: u64 },
    /// The window is empty or wraps.
    #[error("device window {base:#x}+{len:#x} is empty or wraps around")]
    BadWindow { base: u64, len: u64 },
}

struct Entry {
    base: u64,
    len: u64,
    device: Arc<Mutex<dyn BusDevice>>,
}

/// An address space of devices.
#[derive(Default)]
pub struct Bus {
    entries: Vec<Entry>,
}

impl Bus {
    /// Places `device` at `base..base+len`.
    pub fn insert(
        &mut self,
        device: Arc<Mutex<dyn BusDevice>>,
        base: u64,
        len: u64,
    ) -> Result<(), BusError> {
        let end = base
            .checked_add(len)
            .filter(|_| len > 0)
            .ok_or(BusError::BadWindow { base, len })?;
        if self
            .entries
            .iter()
            .any(|e| base < e.base + e.len && e.base < end)
        {
            return Err(BusError::Overlap { base, len });
        }
        self.entries.push(Entry { base, len, device });
        self.entries.sort_by_key(|e| e.base);
        Ok(())
    }

    fn find(&self, addr: u64, size: usize) -> Option<(&Entry, u64)> {
        let idx = self
            .entries
            .partition_point(|e| e.base <= addr)
            .checked_sub(1)?;
        let e = &self.entries[idx];
        let offset = addr - e.base;
        (offset.checked_add(size as u64)? <= e.len).then_some((e, offset))
    }

    /// Dispatches a read; false when no device answers (the caller fills all-ones).
    pub fn read(&self, addr: u64, data: &mut [u8]) -> bool {
        match self.find(addr, data.len()) {
            Some((e, offset)) => {
                lock(&e.device).read(offset, data);
                true
            }
            None => false,
        }
    }

    /// Dispatches a write; false when no device answers.
    pub fn write(&self, addr: u64, data: &[u8]) -> bool {
        match self.find(addr, data.len()) {
            Some((e, offset)) => {
                lock(&e.device).write(offset, data);
                true
            }
            None => false,
        }
    }
}

/// Locks a device, recovering from a poisoned lock: a panic elsewhere must not take every
/// vCPU down with it, and device state stays consistent per access.
pub fn lock<T: ?Sized>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Default)]
    struct Reg(Vec<(u64, Vec<u8>)>);
    impl BusDevice for Reg {
        fn read(&mut self, offset: u64, data: &mut [u8]) {
            data.fill(offset as u8);
        }
        fn write(&mut self, offset: u64, data: &[u8]) {
            self.0.push((offset, data.to_vec()));
        }
    }

    #[test]
    fn dispatches_by_window() {
        let a = Arc::new(Mutex::new(Reg::default()));
        let mut bus = Bus::default();
        bus.insert(a.clone(), 0x3f8, 8).unwrap();
        let mut buf = [0u8; 1];
        assert!(bus.read(0x3fa, &mut buf));
        assert_eq!(buf, [2]);
        assert!(bus.write(0x3ff, &[7]));
        assert!(!bus.write(0x400, &[7]));
        assert!(
            !bus.read(0x3ff, &mut [0u8; 2]),
            "an access crossing the window end is refused"
        );
        assert_eq!(a.lock().unwrap().0, vec![(7, vec![7])]);
    }

    #[test]
    fn refuses_overlaps_and_bad_windows() {
        let mut bus = Bus::default();
        bus.insert(Arc::new(Mutex::new(Reg::default())), 0x100, 0x10)
            .unwrap();
        assert!(matches!(
            bus.insert(Arc::new(Mutex::new(Reg::default())), 0x10f, 4),
            Err(BusError::Overlap { .. })
        ));
        assert!(matches!(
            bus.insert(Arc::new(Mutex::new(Reg::default())), u64::MAX, 4),
            Err(BusError::BadWindow { .. })
        ));
        assert!(matches!(
            bus.insert(Arc::new(Mutex::new(Reg::default())), 0x0, 0),
            Err(BusError::BadWindow { .. })
        ));
    }
}
