//! Tracks operations in flight so `synchronize` can wait for every operation that started
//! before it, without starving behind operations that start after it.

use std::sync::{Condvar, Mutex, MutexGuard};

use crate::sync::{lock, wait};

#[derive(Debug, Default)]
struct State {
    epoch: u64,
    active: [u64; 2],
    /// Drains waiting on `idle`: an operation that ends wakes them only when there are any
    /// (a condition variable's notify is a system call even with nobody waiting, and every
    /// launch and copy ends one operation).
    waiting: u32,
}

/// Epoch-based in-flight counter: operations join the current epoch; a drain moves the
/// epoch on and waits for the old one to empty.
#[derive(Debug, Default)]
pub struct InFlight {
    state: Mutex<State>,
    idle: Condvar,
}

/// Held for the duration of one operation.
#[derive(Debug)]
pub struct OpGuard<'a> {
    owner: &'a InFlight,
    slot: usize,
}

impl InFlight {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding this lock cannot leave the counters inconsistent (every
        // update is a single statement), so a poisoned lock is still usable.
        lock(&self.state)
    }

    /// Marks an operation started; it ends when the guard drops.
    pub fn begin(&self) -> OpGuard<'_> {
        let mut s = self.lock();
        let slot = (s.epoch & 1) as usize;
        s.active[slot] += 1;
        OpGuard { owner: self, slot }
    }

    /// Waits until every operation that began before this call has ended.
    pub fn drain(&self) {
        let mut s = self.lock();
        s.waiting += 1;
        // The previous epoch must be empty before it can be reused (another drain may be
        // waiting for it).
        while s.active[((s.epoch + 1) & 1) as usize] != 0 {
            s = wait(&self.idle, s);
        }
        let old = (s.epoch & 1) as usize;
        s.epoch += 1;
        while s.active[old] != 0 {
            s = wait(&self.idle, s);
        }
        s.waiting -= 1;
    }

    /// Operations in flight now.
    #[cfg(test)]
    pub fn active(&self) -> u64 {
        let s = self.lock();
        s.active[0] + s.active[1]
    }
}

impl Drop for OpGuard<'_> {
    fn drop(&mut self) {
        let mut s = self.owner.lock();
        s.active[self.slot] = s.active[self.slot].saturating_sub(1);
        // Checked under the lock a drain holds until it waits: none is missed.
        if s.active[self.slot] == 0 && s.waiting > 0 {
            self.owner.idle.notify_all();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    #[test]
    fn drain_waits_for_earlier_ops_only() {
        let f = InFlight::default();
        let done = AtomicBool::new(false);
        std::thread::scope(|s| {
            let g = f.begin();
            s.spawn(|| {
                f.drain();
                assert!(
                    done.load(Ordering::SeqCst),
                    "drain returned before the op ended"
                );
            });
            std::thread::sleep(Duration::from_millis(30));
            // An op that starts after the drain must not block it.
            let late = f.begin();
            done.store(true, Ordering::SeqCst);
            drop(g);
            std::thread::sleep(Duration::from_millis(10));
            drop(late);
        });
        assert_eq!(f.active(), 0);
        f.drain(); // nothing in flight: returns at once
    }
}
