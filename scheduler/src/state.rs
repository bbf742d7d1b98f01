//! Per-vGPU accounting shared by the credit-based policies: credit (budget) per period,
//! busy time, utilization over a sliding window of one period.

use std::collections::BTreeMap;

use crate::clock::{Nanos, MS, US};
use crate::SchedError;

/// A vGPU's identifier, as vgpud numbers them.
pub type VgpuId = u32;

/// What a vGPU was promised on one resource.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Share {
    /// Fraction of the resource's time, in [0, 1] (0: best effort, only what others leave).
    pub fraction: f64,
    /// Higher runs first among vGPUs in the same state.
    pub priority: i32,
}

impl Share {
    pub fn new(fraction: f64) -> Self {
        Self {
            fraction,
            priority: 0,
        }
    }
}

/// Scheduler parameters (Gdev §6 defaults: 30 ms period, 500 µs wait).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Config {
    /// Budget period: every period each vGPU's credit grows by `period * share`.
    pub period: Nanos,
    /// BAND's time-buffering wait.
    pub wait: Nanos,
    /// How long the holder of a resource keeps it after a grant while it is within its
    /// share, even between its requests (0: pass the resource on at every idle moment).
    /// A closed-loop guest needs time to submit its next request; without the hold the
    /// resource changes hands in every such gap and the guest can never use its share.
    /// The grant path turns the hold into a lease: the worker starts requests without a
    /// round trip until it ends.
    pub lease: Nanos,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            period: 30 * MS,
            wait: 500 * US,
            lease: MS,
        }
    }
}

#[derive(Clone, Debug)]
pub(crate) struct Account {
    pub share: Share,
    /// Budget left in ns; negative once overspent.
    pub credit: i64,
    busy_cur: Nanos,
    busy_prev: Nanos,
    pub busy_total: Nanos,
    /// Typical busy interval (EWMA, ns): how much one grant adds to the window.
    pub burst_ewma: f64,
    /// Completions seen before the lease start they belong to (the daemon reads a
    /// worker's lease counter and its completion ring at different moments, so a request
    /// started and finished in between shows its completion first).
    pub early: u32,
    /// Requests waiting for a grant.
    pub pending: u32,
    /// Requests granted and not yet complete.
    pub running: u32,
    /// Busy time is accounted up to here: a vGPU's overlapping requests count once (the
    /// union of their intervals, Gdev's makespan), and each completion charges what has
    /// not been charged yet, so a vGPU that never drains still pays as it goes.
    charged_until: Nanos,
}

/// All vGPUs' accounts on one resource.
#[derive(Clone, Debug)]
pub(crate) struct Accounts {
    pub config: Config,
    pub map: BTreeMap<VgpuId, Account>,
    period_start: Nanos,
}

impl Accounts {
    pub fn new(config: Config) -> Self {
        Self {
            config,
            map: BTreeMap::new(),
            period_start: 0,
        }
    }

    pub fn add(&mut self, vgpu: VgpuId, share: Share, now: Nanos) -> Result<(), SchedError> {
        if self.map.contains_key(&vgpu) {
            return Err(SchedError::Duplicate(vgpu));
        }
        self.check_share(vgpu, share.fraction)?;
        self.roll(now);
        self.map.insert(
            vgpu,
            Account {
                share,
                // A new vGPU starts with one period's budget, as if it had just been
                // replenished.
                credit: (self.config.period as f64 * share.fraction) as i64,
                busy_cur: 0,
                busy_prev: 0,
                busy_total: 0,
                burst_ewma: 0.0,
                early: 0,
                pending: 0,
                running: 0,
                charged_until: 0,
            },
        );
        Ok(())
    }

    pub fn check_share(&self, vgpu: VgpuId, fraction: f64) -> Result<(), SchedError> {
        let others: f64 = self
            .map
            .iter()
            .filter(|(id, _)| **id != vgpu)
            .map(|(_, a)| a.share.fraction)
            .sum();
        let total = others + fraction;
        if !(0.0..=1.0).contains(&fraction) || total > 1.0 + 1e-9 {
            return Err(SchedError::BadShare {
                vgpu,
                share: fraction,
                total,
            });
        }
        Ok(())
    }

    pub fn set_share(&mut self, vgpu: VgpuId, share: Share) -> Result<(), SchedError> {
        self.check_share(vgpu, share.fraction)?;
        let a = self
            .map
            .get_mut(&vgpu)
            .ok_or(SchedError::UnknownVgpu(vgpu))?;
        a.share = share;
        Ok(())
    }

    pub fn get(&self, vgpu: VgpuId) -> Result<&Account, SchedError> {
        self.map.get(&vgpu).ok_or(SchedError::UnknownVgpu(vgpu))
    }

    pub fn get_mut(&mut self, vgpu: VgpuId) -> Result<&mut Account, SchedError> {
        self.map.get_mut(&vgpu).ok_or(SchedError::UnknownVgpu(vgpu))
    }

    /// Start of the next period.
    pub fn next_period(&self) -> Nanos {
        self.period_start + self.config.period
    }

    /// Crosses every period boundary up to `now`: replenishes credit and shifts the
    /// utilization window. Credit is clamped to one period's worth either way, so an idle
    /// vGPU cannot bank budget and a burst's debt is forgiven after a period (Gdev's
    /// inactive threshold, as a clamp).
    pub fn roll(&mut self, now: Nanos) {
        let period = self.config.period;
        if now < self.period_start + period {
            return;
        }
        let elapsed = (now - self.period_start) / period;
        for a in self.map.values_mut() {
            let refill = (period as f64 * a.share.fraction) as i64;
            let cap = period as i64;
            let periods = elapsed.min(2) as i64;
            a.credit = (a.credit + refill * periods).clamp(-cap, cap);
            a.busy_prev = if elapsed == 1 { a.busy_cur } else { 0 };
            a.busy_cur = 0;
        }
        self.period_start += elapsed * period;
    }

    /// Records `count` requests that started without a grant (under a lease).
    pub fn start_unasked(
        &mut self,
        vgpu: VgpuId,
        count: u32,
        now: Nanos,
    ) -> Result<(), SchedError> {
        self.roll(now);
        let a = self.get_mut(vgpu)?;
        let absorbed = count.min(a.early);
        a.early -= absorbed;
        a.running = a.running.saturating_add(count - absorbed);
        Ok(())
    }

    /// Marks `count` pending requests of `vgpu` as running.
    pub fn start(&mut self, vgpu: VgpuId, count: u32) {
        if let Some(a) = self.map.get_mut(&vgpu) {
            let n = count.min(a.pending);
            a.pending -= n;
            a.running += n;
        }
    }

    /// Accounts a completed request; true when the vGPU has nothing running any more.
    pub fn finish(&mut self, vgpu: VgpuId, started: Nanos, now: Nanos) -> Result<bool, SchedError> {
        self.roll(now);
        let period_start = self.period_start;
        let a = self
            .map
            .get_mut(&vgpu)
            .ok_or(SchedError::UnknownVgpu(vgpu))?;
        if a.running == 0 {
            // Its lease start comes next; count the completion now, match it then. A
            // worker can only get ahead by what it started under its lease, so this stays
            // small.
            if a.early >= 1024 {
                return Err(SchedError::NothingRunning(vgpu));
            }
            a.early += 1;
        } else {
            a.running -= 1;
        }
        let start = started.max(a.charged_until).min(now);
        a.charged_until = a.charged_until.max(now);
        let busy = now - start;
        let in_cur = now - start.max(period_start);
        a.busy_cur += in_cur;
        a.busy_prev += busy - in_cur;
        a.busy_total += busy;
        a.credit -= busy as i64;
        a.burst_ewma = if a.burst_ewma == 0.0 {
            busy as f64
        } else {
            a.burst_ewma * 0.875 + busy as f64 * 0.125
        };
        Ok(a.running == 0)
    }

    /// Utilization over the last `period`: the previous period weighted by how much of it
    /// still lies in the window, plus the current one.
    pub fn utilization(&self, vgpu: VgpuId, now: Nanos) -> Option<f64> {
        let a = self.map.get(&vgpu)?;
        let period = self.config.period as f64;
        let into = now
            .saturating_sub(self.period_start)
            .min(self.config.period) as f64;
        let prev_weight = (period - into) / period;
        Some(((a.busy_prev as f64 * prev_weight + a.busy_cur as f64) / period).min(1.0))
    }

    /// Over its share and out of budget: BAND's and Credit's test for lowering a vGPU.
    pub fn over_budget(&self, vgpu: VgpuId) -> bool {
        self.map.get(&vgpu).is_some_and(|a| a.credit <= 0)
    }

    /// Whether granting `vgpu` now would leave it over its share, counting half of its
    /// typical burst: with non-preemptive bursts a grant moves utilization by a whole burst
    /// at once, and deciding at the burst's midpoint centres the oscillation on the share
    /// instead of above it.
    pub fn over_share_after_grant(&self, vgpu: VgpuId, now: Nanos) -> bool {
        self.headroom_after_grant(vgpu, now)
            .is_some_and(|h| h < 0.0)
    }

    /// Share minus utilization after half of the vGPU's typical burst: how far below its
    /// share a grant would leave it (negative: over).
    pub fn headroom_after_grant(&self, vgpu: VgpuId, now: Nanos) -> Option<f64> {
        let a = self.map.get(&vgpu)?;
        let u = self.utilization(vgpu, now)?;
        // At most half the share: one freak burst (a worker thread descheduled while it
        // held the GPU) must not keep a vGPU "over its share" forever, since its estimate
        // only improves when it runs again.
        let burst = (a.burst_ewma / (2.0 * self.config.period as f64)).min(a.share.fraction / 2.0);
        Some(a.share.fraction - (u + burst))
    }

    pub fn over_share(&self, vgpu: VgpuId, now: Nanos) -> bool {
        match (self.map.get(&vgpu), self.utilization(vgpu, now)) {
            (Some(a), Some(u)) => u > a.share.fraction,
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_completion_before_its_lease_start_is_matched() {
        let mut acc = Accounts::new(Config::default());
        acc.add(1, Share::new(0.5), 0).unwrap();
        assert!(acc.finish(1, 0, 10).unwrap(), "nothing else runs");
        acc.start_unasked(1, 1, 20).unwrap();
        assert_eq!(
            acc.get(1).unwrap().running,
            0,
            "the start met its completion"
        );
        acc.start_unasked(1, 1, 30).unwrap();
        assert_eq!(acc.get(1).unwrap().running, 1);
    }

    #[test]
    fn one_freak_burst_does_not_keep_a_vgpu_over_its_share() {
        let mut acc = Accounts::new(Config::default());
        let period = acc.config.period;
        acc.add(1, Share::new(0.2), 0).unwrap();
        // A 10-period copy: the worker was descheduled while it held the GPU.
        acc.start_unasked(1, 1, 0).unwrap();
        acc.finish(1, 0, 10 * period).unwrap();
        assert!(
            acc.over_share_after_grant(1, 10 * period),
            "just now it is over"
        );
        // Two idle periods later its utilization has decayed; it must be eligible again.
        let later = 12 * period + 1;
        acc.roll(later);
        assert!(
            !acc.over_share_after_grant(1, later),
            "headroom {:?}",
            acc.headroom_after_grant(1, later)
        );
    }

    #[test]
    fn shares_must_fit() {
        let mut acc = Accounts::new(Config::default());
        acc.add(1, Share::new(0.7), 0).unwrap();
        assert!(matches!(
            acc.add(2, Share::new(0.4), 0),
            Err(SchedError::BadShare { .. })
        ));
        acc.add(2, Share::new(0.3), 0).unwrap();
        assert!(matches!(
            acc.add(2, Share::new(0.1), 0),
            Err(SchedError::Duplicate(2))
        ));
        assert!(matches!(
            acc.set_share(1, Share::new(0.8)),
            Err(SchedError::BadShare { .. })
        ));
        acc.set_share(1, Share::new(0.6)).unwrap();
        for bad in [-0.1, 1.5, f64::NAN] {
            assert!(acc.check_share(9, bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn credit_and_utilization_follow_busy_time() {
        let mut acc = Accounts::new(Config::default());
        acc.add(1, Share::new(0.5), 0).unwrap();
        assert_eq!(acc.get(1).unwrap().credit, 15 * MS as i64);
        acc.get_mut(1).unwrap().pending = 1;
        acc.start(1, 1);
        assert!(acc.finish(1, 0, 20 * MS).unwrap());
        assert_eq!(acc.get(1).unwrap().credit, -5 * MS as i64);
        assert!(acc.over_budget(1));
        let u = acc.utilization(1, 20 * MS).unwrap();
        assert!((u - 20.0 / 30.0).abs() < 1e-9, "{u}");
        // Next period: refilled by 15 ms, and the window still sees the old busy time.
        acc.roll(30 * MS);
        assert_eq!(acc.get(1).unwrap().credit, 10 * MS as i64);
        assert!((acc.utilization(1, 30 * MS).unwrap() - 20.0 / 30.0).abs() < 1e-9);
        // Half a period later half of it has slid out of the window.
        assert!((acc.utilization(1, 45 * MS).unwrap() - 10.0 / 30.0).abs() < 1e-9);
        // Long idle: credit is capped at one period and the window is empty.
        acc.roll(300 * MS);
        assert_eq!(acc.get(1).unwrap().credit, 30 * MS as i64);
        assert_eq!(acc.utilization(1, 300 * MS).unwrap(), 0.0);
    }

    #[test]
    fn concurrent_requests_count_once() {
        let mut acc = Accounts::new(Config::default());
        acc.add(1, Share::new(1.0), 0).unwrap();
        acc.get_mut(1).unwrap().pending = 2;
        acc.start(1, 2);
        assert!(!acc.finish(1, MS, 4 * MS).unwrap());
        assert!(acc.finish(1, 2 * MS, 5 * MS).unwrap());
        // [1, 4) and [2, 5) overlap: 4 ms busy, not 6.
        assert_eq!(acc.get(1).unwrap().busy_total, 4 * MS);
        // One more completion than starts: kept for the lease start it belongs to.
        assert!(acc.finish(1, 0, 6 * MS).unwrap());
        assert_eq!(acc.get(1).unwrap().early, 1);
        assert!(matches!(
            acc.finish(7, 0, 6 * MS),
            Err(SchedError::UnknownVgpu(7))
        ));
    }
}
