//! The machinery BAND and Credit share: one vGPU holds the resource at a time (GPU work is
//! non-preemptive; the holder may run several requests at once), the others queue in an
//! order the policy rotates, and the policy decides on each completion who goes next.

use crate::clock::Nanos;
use crate::state::{Accounts, Config, Share, VgpuId};
use crate::{Grant, SchedError};

/// What distinguishes one credit-based policy from another.
pub(crate) trait Rule: Send {
    const NAME: &'static str;
    /// Whether the vGPU that just finished goes to the tail of the queue.
    fn lower(acc: &Accounts, vgpu: VgpuId, now: Nanos) -> bool;
    /// Whether a vGPU with pending work is eligible in the first pass of selection.
    fn preferred(acc: &Accounts, vgpu: VgpuId) -> bool;
    /// Whether the holder may start another request while it holds the resource.
    fn may_continue(acc: &Accounts, vgpu: VgpuId, now: Nanos) -> bool;
    /// Whether a vGPU just granted may keep the resource for a lease.
    fn may_lease(acc: &Accounts, vgpu: VgpuId, now: Nanos) -> bool;
    /// How strongly `vgpu` should go next (higher first); `None` keeps queue order.
    fn urgency(_acc: &Accounts, _vgpu: VgpuId, _now: Nanos) -> Option<f64> {
        None
    }
    /// Whether `vgpu` is under its share: a lease yields to a waiting vGPU that is.
    fn owed(_acc: &Accounts, _vgpu: VgpuId, _now: Nanos) -> bool {
        false
    }
    /// The holder went idle (nothing running, nothing pending) and `next` would get the
    /// resource now: until when to keep it for the holder instead (time-buffering), or
    /// `None` to pass it on.
    fn keep_for(
        _acc: &Accounts,
        _holder: VgpuId,
        _next: Option<VgpuId>,
        _now: Nanos,
    ) -> Option<Nanos> {
        None
    }
}

/// Why a holder gave the resource up (for the scheduler's trace log).
#[derive(Clone, Copy, Debug)]
enum Released {
    /// Its work ended and the rule kept nothing for its next request.
    Done,
    /// It held the resource idle and another vGPU's request came that the rule serves first.
    ForWaiter,
    /// It held the resource idle and its next request did not come within the hold.
    HoldRanOut,
}

pub(crate) struct Exclusive<R: Rule> {
    acc: Accounts,
    /// Queue order: the head is asked first (ties of urgency, and Credit's order).
    order: Vec<VgpuId>,
    current: Option<VgpuId>,
    /// The holder keeps the resource until then, idle or not.
    hold_until: Option<Nanos>,
    /// The holder is idle under its hold: (since when, charged up to when). Time it keeps
    /// the resource from others that wait is charged to it as if it had used it, past a
    /// grace of an eighth of its typical burst (a gap that short is the cost of any
    /// hand-over between non-preemptive requests, not a reservation).
    held_idle: Option<(Nanos, Nanos)>,
    _rule: std::marker::PhantomData<R>,
}

/// How long a holder that nobody else waits for keeps the resource (and its lease) at a
/// time before the next check: renewed while nobody else asks.
const LONE_HOLD: Nanos = 50 * 1_000_000;

impl<R: Rule> Exclusive<R> {
    pub fn new(config: Config) -> Self {
        Self {
            acc: Accounts::new(config),
            order: Vec::new(),
            current: None,
            hold_until: None,
            held_idle: None,
            _rule: Default::default(),
        }
    }

    fn grant_all(&mut self, vgpu: VgpuId, now: Nanos) -> Vec<Grant> {
        let pending = self.acc.get(vgpu).map(|a| a.pending).unwrap_or(0);
        if pending == 0 {
            return Vec::new();
        }
        self.held_idle = None;
        if self.acc.config.lease > 0
            && R::may_lease(&self.acc, vgpu, now)
            && !self.others_owed(vgpu, now)
        {
            let until = now + self.acc.config.lease;
            self.hold_until = Some(self.hold_until.map_or(until, |h| h.max(until)));
        }
        self.acc.start(vgpu, pending, now);
        vec![Grant {
            vgpu,
            count: pending,
        }]
    }

    /// Places `vgpu` behind every vGPU of equal or higher priority.
    fn insert_by_priority(&mut self, vgpu: VgpuId) {
        self.order.retain(|v| *v != vgpu);
        let prio = self.acc.get(vgpu).map(|a| a.share.priority).unwrap_or(0);
        let at = self
            .order
            .iter()
            .position(|v| self.acc.get(*v).map(|a| a.share.priority).unwrap_or(0) < prio)
            .unwrap_or(self.order.len());
        self.order.insert(at, vgpu);
    }

    fn select(&self, now: Nanos) -> Option<VgpuId> {
        // A vGPU whose late work still runs goes last: it gets the resource only when
        // nobody else waits.
        let any_work = |v: &VgpuId| self.acc.get(*v).is_ok_and(|a| a.pending > 0);
        let others = self
            .order
            .iter()
            .any(|v| any_work(v) && !self.acc.is_overrunning(*v));
        let has_work = |v: &VgpuId| any_work(v) && !(others && self.acc.is_overrunning(*v));
        let keyed = self
            .order
            .iter()
            .copied()
            .filter(has_work)
            .filter_map(|v| R::urgency(&self.acc, v, now).map(|u| (v, u)))
            // Ties keep queue order: max_by returns the last maximum, so compare reversed.
            .fold(None, |best: Option<(VgpuId, f64)>, (v, u)| match best {
                Some((_, bu)) if bu >= u => best,
                _ => Some((v, u)),
            });
        if let Some((v, _)) = keyed {
            return Some(v);
        }
        self.order
            .iter()
            .copied()
            .find(|v| has_work(v) && R::preferred(&self.acc, *v))
            .or_else(|| self.order.iter().copied().find(|v| has_work(v)))
    }

    /// Hands the free resource to the next vGPU.
    fn pass_on(&mut self, now: Nanos) -> Vec<Grant> {
        self.current = None;
        self.hold_until = None;
        self.held_idle = None;
        let Some(next) = self.select(now) else {
            return Vec::new();
        };
        self.current = Some(next);
        self.grant_all(next, now)
    }

    /// Charges an idle holder for the time since the last event if others waited
    /// meanwhile (pending only changes at events, so this is exact). Called first in
    /// every event.
    fn settle_hold(&mut self, now: Nanos) {
        let (Some(c), Some((since, until))) = (self.current, self.held_idle) else {
            return;
        };
        let others_wait = self.others_wait(c);
        let grace = self.acc.get(c).map_or(0, |a| (a.burst_ewma / 8.0) as Nanos);
        let from = until.max(since + grace);
        if others_wait && now > from {
            self.acc.charge(c, now - from, now);
        }
        self.held_idle = Some((since, until.max(now)));
    }

    pub fn add(&mut self, vgpu: VgpuId, share: Share, now: Nanos) -> Result<(), SchedError> {
        self.acc.add(vgpu, share, now)?;
        self.insert_by_priority(vgpu);
        Ok(())
    }

    /// Charges late work and the idle hold up to `now`: first in every event.
    fn settle(&mut self, now: Nanos) {
        self.settle_hold(now);
        self.acc.settle_overruns(now);
    }

    pub fn remove(&mut self, vgpu: VgpuId, now: Nanos) -> Vec<Grant> {
        self.settle(now);
        self.acc.remove(vgpu, now);
        self.order.retain(|v| *v != vgpu);
        if self.current == Some(vgpu) {
            return self.pass_on(now);
        }
        Vec::new()
    }

    pub fn set_share(&mut self, vgpu: VgpuId, share: Share) -> Result<(), SchedError> {
        self.acc.set_share(vgpu, share)?;
        self.insert_by_priority(vgpu);
        Ok(())
    }

    pub fn submit(&mut self, vgpu: VgpuId, now: Nanos) -> Result<Vec<Grant>, SchedError> {
        self.acc.get(vgpu)?;
        self.settle(now);
        self.acc.arrive(vgpu, now)?;
        match self.current {
            None => {
                self.current = Some(vgpu);
                Ok(self.grant_all(vgpu, now))
            }
            Some(c)
                if c == vgpu && (self.holding(now) || R::may_continue(&self.acc, vgpu, now)) =>
            {
                Ok(self.grant_all(vgpu, now))
            }
            Some(c) if c != vgpu && self.acc.get(c).is_ok_and(|a| a.running == 0) => {
                // The holder is idle: keep waiting for it only while the rule still says
                // so now that someone else waits (never past the hold it has).
                let keep = if self.holding(now) && self.acc.get(c).is_ok_and(|a| a.pending == 0) {
                    R::keep_for(&self.acc, c, self.select(now), now)
                } else {
                    None
                };
                match keep {
                    Some(d) if d > now => {
                        self.hold_until = self.hold_until.map(|h| h.min(d));
                        Ok(Vec::new())
                    }
                    _ => Ok(self.release(c, now, Released::ForWaiter)),
                }
            }
            Some(_) => Ok(Vec::new()),
        }
    }

    pub fn complete(
        &mut self,
        vgpu: VgpuId,
        started: Nanos,
        now: Nanos,
    ) -> Result<Vec<Grant>, SchedError> {
        self.acc.get(vgpu)?;
        self.settle(now);
        let idle = self.acc.finish(vgpu, started, now)?;
        if self.current != Some(vgpu) {
            // A completion from a vGPU that lost the resource (removed and re-added, or
            // granted before a share change): accounted, nothing else to do.
            return Ok(Vec::new());
        }
        if !idle {
            return Ok(Vec::new());
        }
        if self.acc.get(vgpu).is_ok_and(|a| a.pending == 0) {
            // Nothing more of its own waits: keep the resource for its next request if the
            // rule says so (time-buffering; a closed-loop guest always has one coming).
            match R::keep_for(&self.acc, vgpu, self.select(now), now) {
                Some(d) if d > now => {
                    self.hold_until = Some(d);
                    self.held_idle = Some((now, now));
                    return Ok(Vec::new());
                }
                _ => {}
            }
        }
        Ok(self.release(vgpu, now, Released::Done))
    }

    /// Whether another vGPU waits while under its share: then a holder must not extend
    /// its lease, or a holder that can never reach its own share (its guest is slower than
    /// its share) would keep the resource from one that is owed it.
    fn others_owed(&self, vgpu: VgpuId, now: Nanos) -> bool {
        self.acc
            .map
            .iter()
            .any(|(id, a)| *id != vgpu && a.pending > 0 && R::owed(&self.acc, *id, now))
    }

    fn holding(&self, now: Nanos) -> bool {
        self.hold_until.is_some_and(|h| now < h)
    }

    /// The holder is done: lower it if the policy says so and pass the resource on.
    fn release(&mut self, vgpu: VgpuId, now: Nanos, why: Released) -> Vec<Grant> {
        // The fields, the summary too, are only built when the trace level is on.
        tracing::trace!(
            policy = R::NAME,
            vgpu,
            ?why,
            balances = %self.acc.summary(),
            "the resource changes hands"
        );
        if R::lower(&self.acc, vgpu, now) {
            self.order.retain(|v| *v != vgpu);
            self.order.push(vgpu);
        }
        self.pass_on(now)
    }

    pub fn tick(&mut self, now: Nanos) -> Vec<Grant> {
        self.settle(now);
        self.acc.roll(now);
        if let Some(c) = self.current {
            if self.acc.overdue(c, now) {
                // Its work ran past the deadline without a completion: the GPU cannot
                // preempt it, but the scheduler takes the resource back. It pays for
                // the time it held it (and, as `settle` goes on, for its late work),
                // goes to the tail, and the others get the resource again.
                self.acc.overrun(c, now);
                self.order.retain(|v| *v != c);
                self.order.push(c);
                return self.pass_on(now);
            }
        }
        if let (Some(h), Some(c)) = (self.hold_until, self.current) {
            if h <= now {
                self.hold_until = None;
                if let Some(renewed) = self.lone_renewal(c, now) {
                    // Nobody else wants the resource: the holder keeps it, its lease renewed
                    // in place, so its next request starts without a round trip, also
                    // right after a long request it is running now ends.
                    self.hold_until = Some(renewed);
                } else if self.acc.get(c).is_ok_and(|a| a.running == 0) {
                    // The wait passed with no request from the holder: no burst is coming,
                    // give the resource to the next vGPU after all (Gdev: one chance).
                    return self.release(c, now, Released::HoldRanOut);
                }
            }
        }
        Vec::new()
    }

    /// Whether a vGPU other than `c` waits for the resource.
    fn others_wait(&self, c: VgpuId) -> bool {
        self.acc.map.iter().any(|(id, a)| *id != c && a.pending > 0)
    }

    /// Until when holder `c`'s hold is renewed in place when it runs out: only while no
    /// other vGPU waits for the resource (and leases are on). An idle holder keeps it for
    /// [`LONE_HOLD`]: the first request of another vGPU takes it back at once (`submit`).
    /// A holder whose work still runs keeps it for one lease at a time: another vGPU's
    /// request cannot take the resource before that work ends, and then finds the holder
    /// asking again within a lease, as after any grant.
    fn lone_renewal(&self, c: VgpuId, now: Nanos) -> Option<Nanos> {
        let lease = self.acc.config.lease;
        if lease == 0 || self.others_wait(c) {
            return None;
        }
        let running = self.acc.get(c).map_or(0, |a| a.running);
        Some(now + if running == 0 { LONE_HOLD } else { lease })
    }

    pub fn next_deadline(&self) -> Option<Nanos> {
        let period = self.acc.next_period();
        let mut d = self.hold_until.map_or(period, |h| h.min(period));
        if let Some(o) = self.current.and_then(|c| self.acc.overrun_at(c)) {
            d = d.min(o);
        }
        Some(d)
    }

    pub fn set_deadline(&mut self, vgpu: VgpuId, deadline: Nanos) -> Result<(), SchedError> {
        self.acc.set_deadline(vgpu, deadline)
    }

    pub fn overruns(&self, vgpu: VgpuId) -> Option<u64> {
        self.acc.map.get(&vgpu).map(|a| a.overruns)
    }

    pub fn start_leased(&mut self, vgpu: VgpuId, count: u32, now: Nanos) -> Result<(), SchedError> {
        self.acc.get(vgpu)?;
        self.settle(now);
        self.acc.start_unasked(vgpu, count, now)?;
        let running = self.acc.get(vgpu).map_or(0, |a| a.running);
        if self.current.is_none() && running > 0 {
            // Only a worker whose lease was open can start unasked; the books follow what
            // really runs. Starts already matched by their completions (read first, see
            // `Account::early`) run no more: taking the free resource for them would hold
            // it with no completion to come that releases it.
            self.current = Some(vgpu);
        }
        if self.current == Some(vgpu) && count > 0 {
            self.held_idle = None;
        }
        Ok(())
    }

    /// The waiting vGPU that would be granted next if the holder released now.
    pub fn next_in_line(&self, now: Nanos) -> Option<VgpuId> {
        self.select(now).filter(|v| Some(*v) != self.current)
    }

    /// Until when `vgpu` may start requests without asking (it holds a lease).
    pub fn lease(&self, vgpu: VgpuId, now: Nanos) -> Option<Nanos> {
        // A holder past its deadline has no lease: it is closed before `tick` hands the
        // resource on.
        if self.current != Some(vgpu) || self.acc.overdue(vgpu, now) {
            return None;
        }
        match self.hold_until {
            Some(h) if h > now => Some(h),
            // Its hold just ran out and `tick` will renew it (nobody else waits): the lease
            // stays open meanwhile rather than closing for a moment.
            Some(_) => self.lone_renewal(vgpu, now),
            _ => None,
        }
    }

    pub fn utilization(&self, vgpu: VgpuId, now: Nanos) -> Option<f64> {
        self.acc.utilization(vgpu, now)
    }

    /// The accounts, for the policies' unit tests.
    #[cfg(test)]
    pub(crate) fn accounts(&self) -> &Accounts {
        &self.acc
    }

    pub fn busy_total(&self, vgpu: VgpuId) -> Option<Nanos> {
        self.acc.map.get(&vgpu).map(|a| a.busy_total)
    }
}

/// Implements `Policy` for a wrapper around `Exclusive<R>`.
macro_rules! exclusive_policy {
    ($ty:ident, $rule:ty) => {
        impl $ty {
            pub fn new(config: $crate::state::Config) -> Self {
                Self($crate::exclusive::Exclusive::new(config))
            }
        }

        impl $crate::Policy for $ty {
            fn name(&self) -> &'static str {
                <$rule as $crate::exclusive::Rule>::NAME
            }
            fn add(
                &mut self,
                v: $crate::VgpuId,
                s: $crate::Share,
                now: $crate::Nanos,
            ) -> Result<(), $crate::SchedError> {
                self.0.add(v, s, now)
            }
            fn remove(&mut self, v: $crate::VgpuId, now: $crate::Nanos) -> Vec<$crate::Grant> {
                self.0.remove(v, now)
            }
            fn set_share(
                &mut self,
                v: $crate::VgpuId,
                s: $crate::Share,
            ) -> Result<(), $crate::SchedError> {
                self.0.set_share(v, s)
            }
            fn submit(
                &mut self,
                v: $crate::VgpuId,
                now: $crate::Nanos,
            ) -> Result<Vec<$crate::Grant>, $crate::SchedError> {
                self.0.submit(v, now)
            }
            fn complete(
                &mut self,
                v: $crate::VgpuId,
                started: $crate::Nanos,
                now: $crate::Nanos,
            ) -> Result<Vec<$crate::Grant>, $crate::SchedError> {
                self.0.complete(v, started, now)
            }
            fn tick(&mut self, now: $crate::Nanos) -> Vec<$crate::Grant> {
                self.0.tick(now)
            }
            fn next_deadline(&self) -> Option<$crate::Nanos> {
                self.0.next_deadline()
            }
            fn utilization(&self, v: $crate::VgpuId, now: $crate::Nanos) -> Option<f64> {
                self.0.utilization(v, now)
            }
            fn busy_total(&self, v: $crate::VgpuId) -> Option<$crate::Nanos> {
                self.0.busy_total(v)
            }
            fn lease(&self, v: $crate::VgpuId, now: $crate::Nanos) -> Option<$crate::Nanos> {
                self.0.lease(v, now)
            }
            fn start_leased(
                &mut self,
                v: $crate::VgpuId,
                count: u32,
                now: $crate::Nanos,
            ) -> Result<(), $crate::SchedError> {
                self.0.start_leased(v, count, now)
            }
            fn set_deadline(
                &mut self,
                v: $crate::VgpuId,
                deadline: $crate::Nanos,
            ) -> Result<(), $crate::SchedError> {
                self.0.set_deadline(v, deadline)
            }
            fn overruns(&self, v: $crate::VgpuId) -> Option<u64> {
                self.0.overruns(v)
            }
            fn next_in_line(&self, now: $crate::Nanos) -> Option<$crate::VgpuId> {
                self.0.next_in_line(now)
            }
        }
    };
}
pub(crate) use exclusive_policy;
