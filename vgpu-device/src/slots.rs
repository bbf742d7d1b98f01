//! Hardware queue slots (seed 002): a GPU runs work from a fixed number of hardware queues;
//! when a vGPU has more ready streams than slots, which stream gets the next free slot
//! decides how fast its task graph finishes. `Priority` hands it to the ready launch with
//! the highest rank (the HEFT upward rank the guest declares in LAUNCH), `Fifo` to the one
//! that waited longest.

use std::collections::BTreeSet;
use std::sync::{Condvar, Mutex, MutexGuard};
use vgpu_backend::sync::{lock, wait};

/// How launches beyond the free slots are ordered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlotPolicy {
    /// Highest rank first (critical path first); arrival order among equal ranks.
    Priority,
    /// Arrival order.
    Fifo,
}

impl std::str::FromStr for SlotPolicy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "priority" => Ok(Self::Priority),
            "fifo" => Ok(Self::Fifo),
            _ => Err(format!("unknown slot policy {s:?}: use priority or fifo")),
        }
    }
}

#[derive(Debug)]
struct State {
    free: u32,
    /// Waiting launches: (negated key, arrival), so the first is the next to run.
    waiting: BTreeSet<(std::cmp::Reverse<u32>, u64)>,
    next_seq: u64,
}

/// A vGPU's hardware queue slots.
#[derive(Debug)]
pub struct HwSlots {
    state: Mutex<State>,
    cv: Condvar,
    policy: SlotPolicy,
}

/// A held slot; dropping it frees the slot.
pub struct Slot<'a>(&'a HwSlots);

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        self.0.lock().free += 1;
        self.0.cv.notify_all();
    }
}

impl HwSlots {
    /// `slots` hardware queues (at least 1).
    pub fn new(slots: u32, policy: SlotPolicy) -> Self {
        Self {
            state: Mutex::new(State {
                free: slots.max(1),
                waiting: BTreeSet::new(),
                next_seq: 0,
            }),
            cv: Condvar::new(),
            policy,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }

    /// Waits for a slot for a launch of `rank`.
    pub fn acquire(&self, rank: u32) -> Slot<'_> {
        let key = match self.policy {
            SlotPolicy::Priority => std::cmp::Reverse(rank),
            SlotPolicy::Fifo => std::cmp::Reverse(0),
        };
        let mut st = self.lock();
        let me = (key, st.next_seq);
        st.next_seq += 1;
        st.waiting.insert(me);
        while !(st.free > 0 && st.waiting.first() == Some(&me)) {
            st = wait(&self.cv, st);
        }
        st.waiting.remove(&me);
        st.free -= 1;
        drop(st);
        // Another waiter may be next in line for a second free slot.
        self.cv.notify_all();
        Slot(self)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;

    fn order(policy: SlotPolicy) -> Vec<u32> {
        let slots = Arc::new(HwSlots::new(1, policy));
        let done = Arc::new(Mutex::new(Vec::new()));
        let held = slots.acquire(0);
        let mut threads = Vec::new();
        for rank in [3u32, 9, 1, 7] {
            let (s, d) = (slots.clone(), done.clone());
            threads.push(std::thread::spawn(move || {
                let _slot = s.acquire(rank);
                d.lock().unwrap().push(rank);
            }));
            // Arrive in this order.
            std::thread::sleep(Duration::from_millis(30));
        }
        drop(held);
        for t in threads {
            t.join().unwrap();
        }
        Arc::try_unwrap(done).unwrap().into_inner().unwrap()
    }

    #[test]
    fn priority_serves_the_highest_rank_first() {
        assert_eq!(order(SlotPolicy::Priority), vec![9, 7, 3, 1]);
    }

    #[test]
    fn fifo_serves_in_arrival_order() {
        assert_eq!(order(SlotPolicy::Fifo), vec![3, 9, 1, 7]);
    }

    #[test]
    fn enough_slots_never_block() {
        let s = HwSlots::new(3, SlotPolicy::Priority);
        let _a = s.acquire(1);
        let _b = s.acquire(2);
        let _c = s.acquire(3);
    }
}
