//! The worker pool's own state as the daemon owns it: per GPU the idle pool workers and
//! the backoff after failures, and each pool worker's route (who its events and exit go
//! to). The pool's operations are in `workers/pool.rs`.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::process::ExitStatus;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::link::{self, Link};
use super::locks::{Guard, Rank, Ranked};
use super::procs::Proc;

/// The first and the longest wait before starting a pool worker again after failures.
pub(super) const BACKOFF_MIN: Duration = Duration::from_millis(250);
pub(super) const BACKOFF_MAX: Duration = Duration::from_secs(30);

/// What a pool worker's events and exit go to.
pub(super) enum Owner {
    /// Idle in its GPU's pool.
    Idle,
    /// Being assigned: its exit is noted for the assigner.
    Assigning,
    /// vGPU `id`'s worker now.
    Vgpu(u32),
    /// It exited while being assigned.
    Exited(ExitStatus),
    /// Killed after a failed assignment; its exit means nothing.
    Discarded,
}

pub(super) type Events = Box<dyn Fn(link::Event) + Send>;

/// A pool worker's routing: who its exit and events go to.
pub(super) struct Route {
    pub(super) owner: Ranked<Owner>,
    pub(super) events: Ranked<Option<Events>>,
}

/// One idle pool worker.
pub(super) struct Spare {
    pub(super) slot: u32,
    pub(super) gpu: u32,
    pub(super) proc: Proc,
    pub(super) link: Link,
    pub(super) route: Arc<Route>,
}

/// One GPU's pool.
#[derive(Default)]
pub(super) struct GpuPool {
    pub(super) idle: VecDeque<Spare>,
    pub(super) starting: usize,
    pub(super) failures: u32,
    pub(super) retry_at: Option<Instant>,
    /// A refill is scheduled for `retry_at`.
    pub(super) timer: bool,
}

impl GpuPool {
    /// One more failure: the next start waits (doubling from [`BACKOFF_MIN`] up to
    /// [`BACKOFF_MAX`]); how long.
    pub(super) fn back_off(&mut self) -> Duration {
        self.failures = self.failures.saturating_add(1);
        let exp = self.failures.saturating_sub(1).min(8);
        let wait = (BACKOFF_MIN * 2u32.pow(exp)).min(BACKOFF_MAX);
        self.retry_at = Some(Instant::now() + wait);
        wait
    }
}

#[derive(Default)]
pub(super) struct Pools {
    pub(super) gpus: BTreeMap<u32, GpuPool>,
    /// Slots whose worker (idle or assigned) has not exited yet.
    pub(super) slots: BTreeSet<u32>,
}

/// The pools of every GPU. A leaf lock: nothing else is locked under it.
pub(super) struct Spares(Ranked<Pools>);

impl Default for Spares {
    fn default() -> Self {
        Self(Ranked::with_default(Rank::PoolSpares))
    }
}

impl Spares {
    pub(super) fn lock(&self) -> Guard<'_, Pools> {
        self.0.lock()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failed_starts_back_off_doubling_up_to_the_ceiling() {
        let mut q = GpuPool::default();
        assert_eq!(q.back_off(), BACKOFF_MIN);
        assert_eq!(q.back_off(), BACKOFF_MIN * 2);
        assert_eq!(q.back_off(), BACKOFF_MIN * 4);
        for _ in 0..20 {
            q.back_off();
        }
        assert_eq!(q.back_off(), BACKOFF_MAX);
        assert!(q.retry_at.is_some_and(|t| t > Instant::now()));
    }
}
