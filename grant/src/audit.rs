//! What the daemon checks on a worker's grant page instead of trusting it (docs/architecture.md,
//! invariant 9): every request the worker may have running is one the daemon granted or saw
//! start under a lease, and every completion's times must lie inside that request's window
//! on the daemon's own clock. A claim outside it is ignored (the daemon charges from its own
//! clock) and counted; repeated cheating detaches the worker, which only hurts its vGPU.

use std::collections::VecDeque;

use vgpu_scheduler::Nanos;

use crate::shm::Completion;

/// Most requests a worker may have announced and not completed on one resource. The
/// device serves each queue from one thread that holds at most one grant at a time (at most
/// 64 queues), so a real worker stays far below; 4096 is also the completion ring's size
/// (a queue of 1024 descriptors on four queues, had a device ever taken them all at once).
/// A worker that claims more is detached.
pub const MAX_IN_FLIGHT: u64 = 4096;

/// Implausible completions a worker may report before it is detached. A correct worker
/// never sends one; a few are forgiven so that no single odd reading ends a VM.
pub const MAX_VIOLATIONS: u32 = 8;

/// Why a completion's claim was not believed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Violation {
    /// Nothing granted or leased on that resource is outstanding.
    #[error("a completion for a request the daemon did not grant")]
    NotGranted,
    /// The resource index names no resource.
    #[error("a completion for resource {0}, which does not exist")]
    NoSuchResource(u32),
    /// The claimed start precedes the grant (or the lease it started under).
    #[error("a completion that started {0} ns before its grant")]
    StartedBeforeGrant(Nanos),
    /// The claimed finish lies after the moment the daemon read it.
    #[error("a completion that finished {0} ns in the future")]
    FinishedInFuture(Nanos),
    /// The claimed finish precedes the claimed start.
    #[error("a completion that finished before it started")]
    Reversed,
}

/// One worker's open requests on one resource, as the daemon saw them begin.
#[derive(Debug, Default)]
pub(crate) struct Books {
    /// Requests granted or started under a lease and not completed yet: the earliest
    /// moment each may have started (on the daemon's clock) and how many share it,
    /// oldest first.
    open: VecDeque<(Nanos, u64)>,
    open_total: u64,
    /// When the daemon last read the lease count: a lease start it sees later began after.
    lease_read_at: Nanos,
}

impl Books {
    pub fn new(now: Nanos) -> Self {
        Self {
            open: VecDeque::new(),
            open_total: 0,
            lease_read_at: now,
        }
    }

    /// Requests granted or started and not completed.
    pub fn open(&self) -> u64 {
        self.open_total
    }

    fn push(&mut self, at: Nanos, count: u64) {
        if count == 0 {
            return;
        }
        match self.open.back_mut() {
            Some((t, n)) if *t == at => *n = n.saturating_add(count),
            _ => self.open.push_back((at, count)),
        }
        // Saturating: a worker's impossible count must not overflow the daemon's books
        // (the in-flight check detaches it).
        self.open_total = self.open_total.saturating_add(count);
    }

    /// The daemon granted `count` requests at `at` (read before the grant word moved).
    pub fn granted(&mut self, count: u64, at: Nanos) {
        self.push(at, count);
    }

    /// The daemon read the lease count at `now` and found `count` new starts: they
    /// began after its previous read.
    pub fn leased(&mut self, count: u64, now: Nanos) {
        let floor = self.lease_read_at;
        self.push(floor, count);
        self.lease_read_at = now;
    }

    /// A completion read at `now` (the daemon's clock, read after the ring): the
    /// interval to charge, `(started, finished)`, or `None` when there is nothing to
    /// complete. A violation is returned alongside when the claim was not believed;
    /// the interval is then the daemon's own, from the request's window start to `now`.
    pub fn complete(
        &mut self,
        c: &Completion,
        now: Nanos,
    ) -> (Option<(Nanos, Nanos)>, Option<Violation>) {
        // Completions may come out of grant order (several streams): the request that
        // ended is taken to be the newest one that may have started by its claimed start,
        // which leaves the older windows to the older requests. Newest by its window,
        // not by its place in the books: lease starts go in with the previous read's
        // time, after grants made since, so the books are not in window order, and the
        // last admissible entry could be an older window a later completion needs. A
        // claim no window admits takes the oldest.
        let at = self
            .open
            .iter()
            .enumerate()
            .filter(|(_, (t, _))| *t <= c.started)
            .max_by_key(|(_, (t, _))| *t)
            .map_or(0, |(i, _)| i);
        let Some((floor, n)) = self.open.get_mut(at) else {
            return (None, Some(Violation::NotGranted));
        };
        let floor = *floor;
        *n -= 1;
        if *n == 0 {
            self.open.remove(at);
        }
        self.open_total -= 1;
        let violation = if c.finished > now {
            Some(Violation::FinishedInFuture(c.finished - now))
        } else if c.started < floor {
            Some(Violation::StartedBeforeGrant(floor - c.started))
        } else if c.finished < c.started {
            Some(Violation::Reversed)
        } else {
            None
        };
        match violation {
            None => (Some((c.started, c.finished)), None),
            Some(v) => (Some((floor, now)), Some(v)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(started: Nanos, finished: Nanos) -> Completion {
        Completion {
            resource: 0,
            _pad: 0,
            started,
            finished,
        }
    }

    #[test]
    fn claims_inside_the_window_are_believed_and_others_are_not() {
        let mut b = Books::new(0);
        assert_eq!(
            b.complete(&c(1, 2), 10),
            (None, Some(Violation::NotGranted))
        );
        b.granted(2, 100);
        assert_eq!(b.complete(&c(150, 180), 200), (Some((150, 180)), None));
        assert_eq!(
            b.complete(&c(50, 180), 200),
            (Some((100, 200)), Some(Violation::StartedBeforeGrant(50)))
        );
        assert_eq!(b.open(), 0);
        b.granted(1, 300);
        assert_eq!(
            b.complete(&c(310, 900), 400),
            (Some((300, 400)), Some(Violation::FinishedInFuture(500)))
        );
        b.granted(1, 500);
        assert_eq!(
            b.complete(&c(560, 550), 600),
            (Some((500, 600)), Some(Violation::Reversed))
        );
    }

    #[test]
    fn a_lease_start_is_bounded_by_the_previous_read() {
        let mut b = Books::new(0);
        b.leased(0, 100);
        b.leased(3, 200);
        assert_eq!(b.open(), 3);
        // Started after the read at 100: believed.
        assert_eq!(b.complete(&c(120, 150), 300).1, None);
        assert_eq!(
            b.complete(&c(90, 150), 300).1,
            Some(Violation::StartedBeforeGrant(10))
        );
        b.granted(1, 400);
        assert_eq!(b.open(), 2);
    }

    #[test]
    fn a_lease_window_booked_after_a_later_grant_is_kept_for_its_own_request() {
        let mut b = Books::new(0);
        b.leased(0, 100);
        // Granted at 200; then the lease read at 300 finds one start, which began after
        // the read at 100: the books hold the windows 200 and 100, in that order.
        b.granted(1, 200);
        b.leased(1, 300);
        // The granted request ends first, then the one started under the lease at 150.
        assert_eq!(b.complete(&c(210, 250), 400).1, None);
        assert_eq!(b.complete(&c(150, 260), 400).1, None);
        assert_eq!(b.open(), 0);
    }

    #[test]
    fn completions_out_of_grant_order_are_believed() {
        let mut b = Books::new(0);
        b.granted(1, 100);
        b.granted(1, 200);
        // The later grant's request ends first, then the earlier one's.
        assert_eq!(b.complete(&c(210, 250), 300).1, None);
        assert_eq!(b.complete(&c(110, 280), 300).1, None);
        assert_eq!(b.open(), 0);
    }
}
