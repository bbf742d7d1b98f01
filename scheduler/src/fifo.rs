//! Arrival order, no budgets: the resource goes to whoever asked first. The overhead
//! baseline: BAND's throughput is measured against it.

use std::collections::VecDeque;

use crate::clock::Nanos;
use crate::state::{Accounts, Config, Share, VgpuId};
use crate::{Grant, Policy, SchedError};

pub struct Fifo {
    acc: Accounts,
    queue: VecDeque<VgpuId>,
    current: Option<VgpuId>,
}

impl Fifo {
    pub fn new(config: Config) -> Self {
        Self {
            acc: Accounts::new(config),
            queue: VecDeque::new(),
            current: None,
        }
    }

    /// Grants the run of requests at the head of the queue that belong to one vGPU.
    fn pass_on(&mut self, now: Nanos) -> Vec<Grant> {
        self.current = None;
        let Some(&vgpu) = self.queue.front() else {
            return Vec::new();
        };
        let mut count = 0;
        while self.queue.front() == Some(&vgpu) {
            self.queue.pop_front();
            count += 1;
        }
        self.current = Some(vgpu);
        self.acc.start(vgpu, count, now);
        vec![Grant { vgpu, count }]
    }
}

impl Policy for Fifo {
    fn name(&self) -> &'static str {
        "fifo"
    }

    fn add(&mut self, vgpu: VgpuId, share: Share, now: Nanos) -> Result<(), SchedError> {
        self.acc.add(vgpu, share, now)
    }

    fn remove(&mut self, vgpu: VgpuId, now: Nanos) -> Vec<Grant> {
        self.acc.remove(vgpu, now);
        self.queue.retain(|v| *v != vgpu);
        if self.current == Some(vgpu) {
            return self.pass_on(now);
        }
        Vec::new()
    }

    fn set_share(&mut self, vgpu: VgpuId, share: Share) -> Result<(), SchedError> {
        self.acc.set_share(vgpu, share)
    }

    fn submit(&mut self, vgpu: VgpuId, now: Nanos) -> Result<Vec<Grant>, SchedError> {
        self.acc.roll(now);
        self.acc.settle_overruns(now);
        self.acc.get_mut(vgpu)?.pending += 1;
        self.queue.push_back(vgpu);
        if self.current.is_none() || (self.current == Some(vgpu) && self.queue.len() == 1) {
            return Ok(self.pass_on(now));
        }
        Ok(Vec::new())
    }

    fn complete(
        &mut self,
        vgpu: VgpuId,
        started: Nanos,
        now: Nanos,
    ) -> Result<Vec<Grant>, SchedError> {
        self.acc.settle_overruns(now);
        let idle = self.acc.finish(vgpu, started, now)?;
        if idle && self.current == Some(vgpu) {
            return Ok(self.pass_on(now));
        }
        Ok(Vec::new())
    }

    fn start_leased(&mut self, vgpu: VgpuId, count: u32, now: Nanos) -> Result<(), SchedError> {
        self.acc.start_unasked(vgpu, count, now)
    }

    fn tick(&mut self, now: Nanos) -> Vec<Grant> {
        self.acc.roll(now);
        self.acc.settle_overruns(now);
        match self.current {
            // Past its deadline: the next in line goes (the late work keeps running).
            Some(c) if self.acc.overdue(c, now) => {
                self.acc.overrun(c, now);
                self.pass_on(now)
            }
            _ => Vec::new(),
        }
    }

    fn next_deadline(&self) -> Option<Nanos> {
        let period = self.acc.next_period();
        Some(
            self.current
                .and_then(|c| self.acc.overrun_at(c))
                .map_or(period, |o| o.min(period)),
        )
    }

    fn set_deadline(&mut self, vgpu: VgpuId, deadline: Nanos) -> Result<(), SchedError> {
        self.acc.set_deadline(vgpu, deadline)
    }

    fn overruns(&self, vgpu: VgpuId) -> Option<u64> {
        self.acc.map.get(&vgpu).map(|a| a.overruns)
    }

    fn utilization(&self, vgpu: VgpuId, now: Nanos) -> Option<f64> {
        self.acc.utilization(vgpu, now)
    }

    fn busy_total(&self, vgpu: VgpuId) -> Option<Nanos> {
        self.acc.map.get(&vgpu).map(|a| a.busy_total)
    }
}
