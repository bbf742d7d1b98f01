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
    /// Whether to wait (time-buffering) before handing the resource to `next`.
    fn wait_for(acc: &Accounts, finished: VgpuId, next: VgpuId, now: Nanos) -> bool;
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
    /// Whether an arrival while the resource is free may take it at once. During a
    /// time-buffering wait the policy may want only the arrival it is waiting for.
    fn may_take_free(_acc: &Accounts, _vgpu: VgpuId, _now: Nanos, _waiting: bool) -> bool {
        true
    }
}

pub(crate) struct Exclusive<R: Rule> {
    acc: Accounts,
    /// Queue order: the head is asked first.
    order: Vec<VgpuId>,
    current: Option<VgpuId>,
    wait_until: Option<Nanos>,
    /// The holder keeps the resource until then, idle or not.
    hold_until: Option<Nanos>,
    _rule: std::marker::PhantomData<R>,
}

impl<R: Rule> Exclusive<R> {
    pub fn new(config: Config) -> Self {
        Self {
            acc: Accounts::new(config),
            order: Vec::new(),
            current: None,
            wait_until: None,
            hold_until: None,
            _rule: Default::default(),
        }
    }

    fn grant_all(&mut self, vgpu: VgpuId, now: Nanos) -> Vec<Grant> {
        let pending = self.acc.get(vgpu).map(|a| a.pending).unwrap_or(0);
        if pending == 0 {
            return Vec::new();
        }
        if self.acc.config.lease > 0
            && R::may_lease(&self.acc, vgpu, now)
            && !self.others_owed(vgpu, now)
        {
            let until = now + self.acc.config.lease;
            self.hold_until = Some(self.hold_until.map_or(until, |h| h.max(until)));
        }
        self.acc.start(vgpu, pending);
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
        let has_work = |v: &VgpuId| self.acc.get(*v).is_ok_and(|a| a.pending > 0);
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

    /// Hands the free resource to the next vGPU, possibly after a wait.
    fn pass_on(&mut self, finished: Option<VgpuId>, now: Nanos) -> Vec<Grant> {
        self.current = None;
        self.hold_until = None;
        let Some(next) = self.select(now) else {
            return Vec::new();
        };
        if let Some(f) = finished {
            if next != f && R::wait_for(&self.acc, f, next, now) {
                // Time-buffering: an arrival during the wait takes the resource at once.
                self.wait_until = Some(now + self.acc.config.wait);
                return Vec::new();
            }
        }
        self.current = Some(next);
        self.grant_all(next, now)
    }

    pub fn add(&mut self, vgpu: VgpuId, share: Share, now: Nanos) -> Result<(), SchedError> {
        self.acc.add(vgpu, share, now)?;
        self.insert_by_priority(vgpu);
        Ok(())
    }

    pub fn remove(&mut self, vgpu: VgpuId, now: Nanos) -> Vec<Grant> {
        self.acc.map.remove(&vgpu);
        self.order.retain(|v| *v != vgpu);
        if self.current == Some(vgpu) {
            return self.pass_on(None, now);
        }
        Vec::new()
    }

    pub fn set_share(&mut self, vgpu: VgpuId, share: Share) -> Result<(), SchedError> {
        self.acc.set_share(vgpu, share)?;
        self.insert_by_priority(vgpu);
        Ok(())
    }

    pub fn submit(&mut self, vgpu: VgpuId, now: Nanos) -> Result<Vec<Grant>, SchedError> {
        self.acc.roll(now);
        self.acc.get_mut(vgpu)?.pending += 1;
        match self.current {
            None if R::may_take_free(&self.acc, vgpu, now, self.wait_until.is_some()) => {
                self.wait_until = None;
                self.current = Some(vgpu);
                Ok(self.grant_all(vgpu, now))
            }
            None => Ok(Vec::new()),
            Some(c)
                if c == vgpu && (self.holding(now) || R::may_continue(&self.acc, vgpu, now)) =>
            {
                Ok(self.grant_all(vgpu, now))
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
        let idle = self.acc.finish(vgpu, started, now)?;
        if self.current != Some(vgpu) {
            // A completion from a vGPU that lost the resource (removed and re-added, or
            // granted before a share change): accounted, nothing else to do.
            return Ok(Vec::new());
        }
        if idle
            && self.acc.config.lease > 0
            && R::may_lease(&self.acc, vgpu, now)
            && !self.others_owed(vgpu, now)
        {
            // The holder went idle within its share: keep the resource for it through the
            // gap until its next request (a closed-loop guest always has one).
            let until = now + self.acc.config.lease;
            self.hold_until = Some(self.hold_until.map_or(until, |h| h.max(until)));
        }
        if !idle || (self.holding(now) && !self.others_owed(vgpu, now)) {
            // Still running, or idle within its lease: the holder keeps the resource (the
            // tick at the lease's end passes it on if nothing more came).
            return Ok(Vec::new());
        }
        Ok(self.release(vgpu, now))
    }

    /// Whether another vGPU waits while under its share: then an idle holder must let go,
    /// or a holder that can never reach its own share (its guest is slower than its
    /// share) would keep the resource from one that is owed it. A vGPU's guarantee comes
    /// before its neighbour's convenience.
    fn others_owed(&self, vgpu: VgpuId, now: Nanos) -> bool {
        self.acc.map.iter().any(|(id, a)| {
            *id != vgpu && a.pending > 0 && !self.acc.over_share_after_grant(*id, now)
        })
    }

    fn holding(&self, now: Nanos) -> bool {
        self.hold_until.is_some_and(|h| now < h)
    }

    /// The holder is done: lower it if the policy says so and pass the resource on.
    fn release(&mut self, vgpu: VgpuId, now: Nanos) -> Vec<Grant> {
        if R::lower(&self.acc, vgpu, now) {
            self.order.retain(|v| *v != vgpu);
            self.order.push(vgpu);
        }
        self.pass_on(Some(vgpu), now)
    }

    pub fn tick(&mut self, now: Nanos) -> Vec<Grant> {
        self.acc.roll(now);
        if let (Some(h), Some(c)) = (self.hold_until, self.current) {
            if h <= now {
                self.hold_until = None;
                if self.acc.get(c).is_ok_and(|a| a.running == 0) {
                    return self.release(c, now);
                }
            }
        }
        match self.wait_until {
            Some(t) if t <= now => {
                self.wait_until = None;
                if self.current.is_none() {
                    // The wait passed with no arrival: no burst is coming, give it to the
                    // selected vGPU after all (Gdev: one chance).
                    return self.pass_on(None, now);
                }
                Vec::new()
            }
            _ => Vec::new(),
        }
    }

    pub fn next_deadline(&self) -> Option<Nanos> {
        let period = self.acc.next_period();
        let d = self.wait_until.map_or(period, |w| w.min(period));
        Some(self.hold_until.map_or(d, |h| h.min(d)))
    }

    pub fn start_leased(&mut self, vgpu: VgpuId, count: u32, now: Nanos) -> Result<(), SchedError> {
        self.acc.start_unasked(vgpu, count, now)?;
        let running = self.acc.get(vgpu).map_or(0, |a| a.running);
        if self.current.is_none() && running > 0 {
            // Only a worker whose lease was open can start unasked; the books follow what
            // really runs. Starts already matched by their completions (read first, see
            // `Account::early`) run no more: taking the free resource for them would hold
            // it with no completion to come that releases it.
            self.current = Some(vgpu);
        }
        Ok(())
    }

    /// Until when `vgpu` may start requests without asking (it holds a lease).
    pub fn lease(&self, vgpu: VgpuId, now: Nanos) -> Option<Nanos> {
        (self.current == Some(vgpu))
            .then_some(self.hold_until)
            .flatten()
            .filter(|h| *h > now)
    }

    pub fn utilization(&self, vgpu: VgpuId, now: Nanos) -> Option<f64> {
        self.acc.utilization(vgpu, now)
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
        }
    };
}
pub(crate) use exclusive_policy;
