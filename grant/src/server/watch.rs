//! What the GPU's thread reads without being rung for: the pages of lone holders whose
//! leases are quiet, the pages of workers whose running requests others wait for (at least
//! every [`WATCH`]), and a holder's ring around its announced end when a hand-over is due
//! (docs/scheduler.md, "The grant path").

use std::sync::atomic::Ordering;

use vgpu_scheduler::gpu::Resource;
use vgpu_scheduler::{Nanos, VgpuId};

use super::{close_leases, resource_index, serve_or_expel, Shared, State, Worker};
use crate::shm::LEASE_QUIET;
use crate::{futex, time};

/// A hand-over between vGPUs costs two wake-ups after the holder's work ends (the
/// completion wakes this thread, the grant wakes the next vGPU's waiter). When the
/// holder's worker said when its request should end (`Page::ends_at`) and another vGPU
/// waits, this thread wakes `HANDOVER_EARLY` before that, wakes the next waiter (which
/// then spins for its grant) and polls the holder's ring until the completion comes, at
/// most `HANDOVER_LATE` past the estimate: the CPU time of one short spin per hand-over
/// for the two wake-ups.
const HANDOVER_EARLY: Nanos = 40_000;
const HANDOVER_LATE: Nanos = 100_000;
/// Estimates further ahead than this are not believed (a kernel deadline is shorter).
const HANDOVER_AHEAD: Nanos = 120_000_000_000;

/// How often the daemon reads, unasked, the page of a worker whose requests run while
/// another vGPU waits for the resource: a worker that does not ring for its completions
/// (taken over, or forging its lease's quiet bit) holds the resource at most this much
/// longer than it uses it.
const WATCH: Nanos = 1_000_000;

/// Per resource, how many workers have a request waiting for a grant.
fn waiting(st: &State) -> [usize; 2] {
    let mut waiting = [0usize; 2];
    for w in st.workers.values() {
        for (n, p) in waiting.iter_mut().zip(&w.pending) {
            *n += usize::from(*p > 0);
        }
    }
    waiting
}

/// Whether a vGPU other than worker `w`'s waits for resource `i`.
fn others_wait(w: &Worker, waiting: &[usize; 2], i: usize) -> bool {
    waiting[i] > usize::from(w.pending[i] > 0)
}

/// Whether worker `w` has requests running on resource `i` while another vGPU waits for it.
fn holds_up(w: &Worker, waiting: &[usize; 2], i: usize) -> bool {
    w.books[i].open() > 0 && others_wait(w, waiting, i)
}

/// Whether worker `w` has requests running on a resource another vGPU waits for.
fn holds_up_others(w: &Worker, waiting: &[usize; 2]) -> bool {
    (0..2).any(|i| holds_up(w, waiting, i))
}

/// Reads the page of every worker that holds a quiet lease (what it started and completed
/// since the last read rang no doorbell), and of every worker whose running requests
/// another vGPU waits for (its completions are due, rung for or not). Whether there was
/// any.
pub(super) fn catch_up(shared: &Shared, st: &mut State, now: Nanos) -> bool {
    let waiting = waiting(st);
    let due: Vec<VgpuId> = st
        .workers
        .iter()
        .filter(|(_, w)| w.quiet.iter().any(|q| *q) || holds_up_others(w, &waiting))
        .map(|(&v, _)| v)
        .collect();
    let any = !due.is_empty();
    for vgpu in due {
        serve_or_expel(shared, st, vgpu, now);
    }
    any
}

/// When to wake to read the pages of workers others wait for (see [`WATCH`]).
pub(super) fn next_watch(st: &State, now: Nanos) -> Option<Nanos> {
    let waiting = waiting(st);
    st.workers
        .values()
        .any(|w| holds_up_others(w, &waiting))
        .then(|| now.saturating_add(WATCH))
}

/// Sets the quiet bit on each lease whose holder is alone on its resource (no other vGPU
/// has a request waiting for it) and clears it where another waits: from the clear on,
/// the holder rings for every start and completion again, and what it did quietly before
/// is read once more after the clear, so the scheduler knows all of it before it decides
/// between the two.
pub(super) fn update_quiet(shared: &Shared, st: &mut State, now: Nanos) {
    let waiting = waiting(st);
    let mut loud = Vec::new();
    let State { sched, workers, .. } = &mut *st;
    for (&vgpu, w) in workers.iter_mut() {
        for (i, r) in [Resource::Compute, Resource::Copy].into_iter().enumerate() {
            let want = !others_wait(w, &waiting, i) && sched.lease(vgpu, r, now).is_some();
            if want == w.quiet[i] {
                continue;
            }
            let word = w.page.lease(r);
            if want {
                word.fetch_or(LEASE_QUIET, Ordering::AcqRel);
            } else {
                word.fetch_and(!LEASE_QUIET, Ordering::AcqRel);
                loud.push(vgpu);
            }
            w.quiet[i] = want;
        }
    }
    if loud.is_empty() {
        return;
    }
    // Pairs with the worker's fence between pushing a completion and reading the bit.
    std::sync::atomic::fence(Ordering::SeqCst);
    loud.dedup();
    for vgpu in loud {
        serve_or_expel(shared, st, vgpu, now);
    }
    // A completion read just now may have passed the resource on: the old holder's lease
    // closes in this wake-up, as after any other release.
    close_leases(st, now);
}

/// The hand-over to be ready for: the worker whose running request on a resource is
/// expected to end first while another vGPU waits for that resource, with the estimate.
fn next_handover(st: &State, now: Nanos) -> Option<(VgpuId, Resource, Nanos)> {
    let waiting = waiting(st);
    let mut best: Option<(VgpuId, Resource, Nanos)> = None;
    for (&vgpu, w) in &st.workers {
        for (i, r) in [Resource::Compute, Resource::Copy].into_iter().enumerate() {
            if !holds_up(w, &waiting, i) {
                continue;
            }
            let ends = w.page.ends_at(r).load(Ordering::Relaxed);
            if ends == 0
                || w.starts[i] == w.polled[i]
                || ends.saturating_add(HANDOVER_LATE) < now
                || ends > now.saturating_add(HANDOVER_AHEAD)
            {
                continue;
            }
            if best.is_none_or(|(_, _, b)| ends < b) {
                best = Some((vgpu, r, ends));
            }
        }
    }
    best
}

/// When the hand-over ahead is due, wakes the vGPU next in line and polls the holder's
/// ring until its completion comes (or the estimate is `HANDOVER_LATE` past), then
/// serves it at once. Returns when to come back for the next one.
pub(super) fn handover(shared: &Shared, st: &mut State) -> Option<Nanos> {
    if !shared.handover_poll {
        return None;
    }
    let now = time::now();
    let (vgpu, r, ends) = next_handover(st, now)?;
    let due = ends.saturating_sub(HANDOVER_EARLY);
    if due > now {
        return Some(due);
    }
    let i = resource_index(r);
    let w = st.workers.get_mut(&vgpu)?;
    w.polled[i] = w.starts[i];
    if let Some(next) = st.sched.next_in_line(r, now) {
        if let Some(n) = st.workers.get(&next) {
            // No grant moves: it wakes, finds none, and spins for the one about to come.
            futex::wake_all(n.page.granted(r));
        }
    }
    let w = st.workers.get(&vgpu)?;
    let until = ends.saturating_add(HANDOVER_LATE);
    while !w.page.has_completions() && time::now() < until {
        std::hint::spin_loop();
    }
    if w.page.has_completions() {
        let now = time::now();
        serve_or_expel(shared, st, vgpu, now);
        close_leases(st, now);
    }
    // The next hand-over may already be due.
    None
}
