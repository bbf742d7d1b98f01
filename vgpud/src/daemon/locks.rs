//! Every blocking mutex of the daemon, ranked, and the check that keeps them in order.
//!
//! Lock order (a thread holding one lock takes only locks further down the list):
//! 0. an API connection's permit (`http/serve.rs`, a semaphore held for the connection's
//!    life, so every request runs under it);
//! 1. the state file writer (`saver::Persistence`'s writer, an async mutex held across a
//!    save);
//! 2. one GPU's reservation slot (`gpu_memory::GpuMemory::serial`, an async mutex held
//!    across a whole reservation, which reads the state and replans the pool meanwhile);
//! 3. [`Rank::PoolEvents`]: a pool worker's event route (`spares::Route`), held while one of its worker's
//!    events is handled (the handler takes the locks below);
//! 4. [`Rank::State`]: the state lock (`state::State`);
//! 5. [`Rank::Rebalance`]: the rebalancer's state (`rebalancer::State`);
//! 6. [`Rank::Shm`]: the shared-memory registry (`shm::Registry`);
//! 7. [`Rank::Planner`]: one GPU's memory planner (`gpu_memory::GpuMemory`);
//! 8. leaves, under which nothing is taken: [`Rank::HostMigration`] (each table of
//!    `host_registry::Registry`), [`Rank::PoolSpares`] (`spares::Spares`),
//!    [`Rank::PoolOwner`] (a pool worker's owner, `spares::Route`), [`Rank::LinkFds`] (the descriptors a
//!    control channel received, `link.rs`), and each GPU's grant server
//!    (`vgpu_grant::GrantServer`, its own crate's lock).
//!
//! The two async mutexes are held across awaits, so other tasks run on the same thread
//! meanwhile: the per-thread check below covers the blocking mutexes, which no task holds
//! across an await (their guards are not `Send`). In debug builds every
//! [`Ranked::lock`] checks, before it blocks, that the thread holds no lock of the same
//! or a later rank, and panics naming both when it does: a lock-order violation shows in
//! the tests as that panic instead of a deadlock in production.

use std::ops::{Deref, DerefMut};
use std::sync::{Mutex, MutexGuard};

/// A blocking mutex's place in the lock order (earlier ranks are taken first).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Rank {
    PoolEvents = 3,
    State = 4,
    Rebalance = 5,
    Shm = 6,
    Planner = 7,
    HostMigration = 8,
    PoolSpares = 9,
    PoolOwner = 10,
    LinkFds = 11,
}

/// A mutex with its rank in the lock order. Poison-tolerant like `vgpu_sync::lock`.
pub(super) struct Ranked<T> {
    /// Read by debug builds' lock-order check only.
    #[cfg_attr(not(debug_assertions), allow(dead_code))]
    rank: Rank,
    mutex: Mutex<T>,
}

/// A held [`Ranked`] lock; the rank is let go with it.
pub(super) struct Guard<'a, T> {
    guard: MutexGuard<'a, T>,
    #[cfg(debug_assertions)]
    rank: Rank,
}

impl<T> Ranked<T> {
    pub(super) const fn new(rank: Rank, value: T) -> Self {
        Self {
            rank,
            mutex: Mutex::new(value),
        }
    }

    /// Locks it (checking the lock order first in debug builds).
    pub(super) fn lock(&self) -> Guard<'_, T> {
        #[cfg(debug_assertions)]
        note_taken(self.rank);
        Guard {
            guard: vgpu_sync::lock(&self.mutex),
            #[cfg(debug_assertions)]
            rank: self.rank,
        }
    }
}

impl<T: Default> Ranked<T> {
    pub(super) fn with_default(rank: Rank) -> Self {
        Self::new(rank, T::default())
    }
}

impl<T> Deref for Guard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.guard
    }
}

impl<T> DerefMut for Guard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.guard
    }
}

#[cfg(debug_assertions)]
impl<T> Drop for Guard<'_, T> {
    fn drop(&mut self) {
        note_released(self.rank);
    }
}

#[cfg(debug_assertions)]
thread_local! {
    /// The ranks this thread holds, in the order it took them.
    static HELD: std::cell::RefCell<Vec<Rank>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Notes `rank` as held, after checking that nothing held comes at or after it.
#[cfg(debug_assertions)]
fn note_taken(rank: Rank) {
    HELD.with(|h| {
        let mut h = h.borrow_mut();
        if let Some(&last) = h.iter().max() {
            assert!(
                last < rank,
                "lock order violated: taking {rank:?} while holding {last:?} \
                 (see the order in vgpud/src/daemon/locks.rs)"
            );
        }
        h.push(rank);
    });
}

#[cfg(debug_assertions)]
fn note_released(rank: Rank) {
    HELD.with(|h| {
        let mut h = h.borrow_mut();
        if let Some(i) = h.iter().rposition(|r| *r == rank) {
            h.remove(i);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locks_taken_in_order_nest() {
        let (state, shm, leaf) = (
            Ranked::new(Rank::State, 1),
            Ranked::new(Rank::Shm, 2),
            Ranked::new(Rank::LinkFds, 3),
        );
        let a = state.lock();
        let b = shm.lock();
        let c = leaf.lock();
        assert_eq!(*a + *b + *c, 6);
        drop((c, b));
        // Let go and taken again: still in order.
        assert_eq!(*shm.lock(), 2);
    }

    #[cfg(debug_assertions)]
    #[test]
    fn a_lock_taken_out_of_order_is_caught_before_it_blocks() {
        let state = std::sync::Arc::new(Ranked::new(Rank::State, ()));
        let shm = std::sync::Arc::new(Ranked::new(Rank::Shm, ()));
        let (s, m) = (state.clone(), shm.clone());
        let caught = std::thread::spawn(move || {
            let _shm = m.lock();
            let _state = s.lock();
        })
        .join();
        let msg = caught.expect_err("the out-of-order lock panics");
        let msg = msg.downcast_ref::<String>().cloned().unwrap_or_default();
        assert!(msg.contains("taking State while holding Shm"), "{msg}");
        // The panicking thread held Shm; this thread holds nothing and may take both.
        let _a = state.lock();
        let _b = shm.lock();
    }

    #[cfg(debug_assertions)]
    #[test]
    fn two_leaves_are_not_held_together() {
        let (a, b) = (
            Ranked::new(Rank::HostMigration, ()),
            Ranked::new(Rank::HostMigration, ()),
        );
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _a = a.lock();
            let _b = b.lock();
        }));
        assert!(r.is_err(), "a second lock of the same rank is refused");
    }
}
