//! Per-vGPU accounting shared by the credit-based policies: credit (Xen's budget) per
//! period, BAND's balance carried across periods, busy time, utilization over a sliding
//! window of one period.

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

/// Scheduler parameters (Gdev §6 defaults: 30 ms period, 500 µs wait; a 2 s kernel deadline).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Config {
    /// Budget period: Credit refills each vGPU's credit by `period * share` every period;
    /// for BAND it bounds a balance (one period either way), is the utilization window,
    /// and a vGPU idle for a whole period is inactive.
    pub period: Nanos,
    /// BAND's time-buffering wait: how long the resource stays idle for the holder's next
    /// request when the next vGPU is over its share (only for a holder whose requests
    /// usually come back within it).
    pub wait: Nanos,
    /// How long the holder of a resource keeps it after a grant while it is within its
    /// share, even between its requests (0: pass the resource on at every idle moment).
    /// A closed-loop guest needs time to submit its next request; without the hold the
    /// resource changes hands in every such gap and the guest can never use its share.
    /// The grant path turns the hold into a lease: the worker starts requests without a
    /// round trip until it ends.
    pub lease: Nanos,
    /// Kernel deadline, the default for every vGPU (each may have its own): a holder with
    /// work running that shows no progress (no completion since its last grant or
    /// completion) for this long loses the resource, pays for the time it held it and
    /// keeps paying while its late work runs. The GPU cannot preempt a kernel, so the
    /// late kernel keeps running beside the neighbours that get the resource back. 2 s:
    /// far longer than any kernel a well-behaved guest runs under a 30 ms period, and far
    /// below the guests' 30 s request timeout, so a neighbour waits at most the deadline
    /// plus one period and a hand-over margin for its turn and never times out.
    pub deadline: Nanos,
    /// BAND's hand-over margin: the holder keeps the resource (through its idle gaps, its
    /// lease, its next requests) until a waiting vGPU is owed more than this, or until its
    /// own debt passes it. Every hand-over between two vGPUs' contexts costs the GPU a
    /// context switch and its L2 cache; without a margin, vGPUs with equal shares that are
    /// both busy trade the GPU at nearly every request. The long-run split stays exact (a
    /// balance is only allowed this far from zero before the resource moves); a window
    /// shorter than a few margins sees it swing by about this much. This is the margin of
    /// two vGPUs; with N active it grows by 2(N-1)/N, so turns stay as long as more
    /// vGPUs join (docs/scheduler.md, point 8). 0: hand over as soon as a waiting vGPU is owed
    /// anything.
    pub switch_margin: Nanos,
}

/// The default kernel deadline (see [`Config::deadline`]).
pub const DEFAULT_DEADLINE: Nanos = 2_000 * MS;

impl Config {
    /// The defaults, usable in constants.
    pub const DEFAULT: Config = Config {
        period: 30 * MS,
        wait: 500 * US,
        lease: MS,
        deadline: DEFAULT_DEADLINE,
        switch_margin: 4 * MS,
    };
}

impl Default for Config {
    fn default() -> Self {
        Self::DEFAULT
    }
}

#[derive(Clone, Debug)]
pub(crate) struct Account {
    pub share: Share,
    /// Budget left in ns; negative once overspent (Xen's Credit: refilled every period by
    /// `period * share`, clamped to one period either way).
    pub credit: i64,
    /// BAND's budget, ns: what the vGPU is owed (positive) or owes (negative) of the time
    /// the resource was used. It earns its share of every nanosecond the resource is used
    /// (by anyone active) and pays for the time it used or had reserved, so over a run it
    /// converges to exactly its share; unlike `credit` it is carried across periods (within
    /// one period either way), which a 10 ms burst at a 10 % share needs: that burst is
    /// paid back over 100 ms, three periods.
    pub balance: f64,
    /// When it last had nothing running and nothing pending (None: busy or waiting).
    pub idle_since: Option<Nanos>,
    /// Typical busy interval (EWMA, ns).
    pub burst_ewma: f64,
    /// Typical time between going idle and its next request (EWMA, ns; 0: not seen yet):
    /// whether a wait for it is likely to be answered.
    pub gap_ewma: f64,
    /// Last submit, start or completion (None: it has asked for nothing since it was
    /// added): a vGPU idle for a whole period, or not yet started, is inactive (earns
    /// nothing, keeps no positive balance).
    last_active: Option<Nanos>,
    busy_cur: Nanos,
    busy_prev: Nanos,
    pub busy_total: Nanos,
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
    /// This vGPU's kernel deadline (see [`Config::deadline`]).
    pub deadline: Nanos,
    /// When it last showed progress: a grant that found nothing of it running, a lease
    /// start, or a completion. Its work running past `progress_at + deadline` overruns.
    pub progress_at: Nanos,
    /// When its current busy stretch began (running went from none to some).
    busy_since: Nanos,
    /// It lost the resource to its deadline and work of it still runs: charged as it
    /// runs, and last in line while anyone else waits.
    pub overrun: bool,
    /// Deadlines it overran since it was added.
    pub overruns: u64,
    /// Counted in `Accounts::active`.
    counted: bool,
}

/// All vGPUs' accounts on one resource.
#[derive(Clone, Debug)]
pub(crate) struct Accounts {
    pub config: Config,
    pub map: BTreeMap<VgpuId, Account>,
    period_start: Nanos,
    /// Active vGPUs (it scales the hand-over margin): counted at each period boundary
    /// and removal, and one more when an inactive vGPU asks, so a request costs no count.
    active: usize,
}

impl Accounts {
    pub fn new(config: Config) -> Self {
        Self {
            config,
            map: BTreeMap::new(),
            period_start: 0,
            active: 0,
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
                balance: 0.0,
                idle_since: None,
                burst_ewma: 0.0,
                gap_ewma: 0.0,
                // It earns from its first request: a guest still booting or loading its
                // program is kept from nothing.
                last_active: None,
                busy_cur: 0,
                busy_prev: 0,
                busy_total: 0,
                early: 0,
                pending: 0,
                running: 0,
                charged_until: 0,
                deadline: self.config.deadline,
                progress_at: now,
                busy_since: now,
                overrun: false,
                overruns: 0,
                counted: false,
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
        let mut forfeited = 0.0;
        for a in self.map.values_mut() {
            let refill = (period as f64 * a.share.fraction) as i64;
            let cap = period as i64;
            let periods = elapsed.min(2) as i64;
            a.credit = (a.credit + refill * periods).clamp(-cap, cap);
            a.busy_prev = if elapsed == 1 { a.busy_cur } else { 0 };
            a.busy_cur = 0;
            if !Self::is_active(a, now, period) && a.balance > 0.0 {
                // No banking while away; a debt stays until it is paid.
                forfeited += a.balance;
                a.balance = 0.0;
            }
        }
        self.period_start += elapsed * period;
        // What the absent were owed, the active owed them: it is written off their debts.
        self.spread(forfeited, now);
        // A vGPU goes quiet at period granularity, as its balance is dropped.
        self.count_active(now);
    }

    /// Removes `vgpu`'s account. What it was owed or owed goes to the active vGPUs, by
    /// share: it can no longer be paid.
    pub fn remove(&mut self, vgpu: VgpuId, now: Nanos) -> Option<Account> {
        self.roll(now);
        let a = self.map.remove(&vgpu)?;
        self.spread(a.balance, now);
        self.count_active(now);
        Some(a)
    }

    /// Counts the active vGPUs (the hand-over margin grows with them).
    fn count_active(&mut self, now: Nanos) {
        let period = self.config.period;
        let mut n = 0;
        for a in self.map.values_mut() {
            a.counted = Self::is_active(a, now, period);
            n += usize::from(a.counted);
        }
        self.active = n;
    }

    /// Hands `amount` (ns, either sign), a balance that left the books (a vGPU gone, or
    /// owed while away), to the vGPUs that stay: the active ones by share or, with none
    /// active, the balances of the other sign in proportion to their size (what the
    /// absent were owed, their debtors owed them). Otherwise every balance would sit that
    /// far off zero for good, and BAND's margins, measured from zero, would hand the
    /// resource over that much sooner or later than they should.
    fn spread(&mut self, amount: f64, now: Nanos) {
        if amount == 0.0 {
            return;
        }
        let period = self.config.period;
        let cap = period as f64;
        let shares: f64 = self
            .map
            .values()
            .filter(|a| Self::is_active(a, now, period))
            .map(|a| a.share.fraction)
            .sum();
        if shares > 0.0 {
            for a in self.map.values_mut() {
                if Self::is_active(a, now, period) {
                    a.balance = (a.balance + amount * a.share.fraction / shares).clamp(-cap, cap);
                }
            }
            return;
        }
        // Nobody active: it cancels what the others hold of the other sign, up to all of it.
        let opposite = |b: f64| b * amount < 0.0;
        let held: f64 = self
            .map
            .values()
            .filter(|a| opposite(a.balance))
            .map(|a| a.balance.abs())
            .sum();
        let scale = (amount.abs() / held.max(f64::MIN_POSITIVE)).min(1.0);
        for a in self.map.values_mut() {
            if opposite(a.balance) {
                a.balance -= a.balance * scale;
            }
        }
    }

    fn is_active(a: &Account, now: Nanos, period: Nanos) -> bool {
        a.pending > 0
            || a.running > 0
            || a.last_active
                .is_some_and(|t| now.saturating_sub(t) < period)
    }

    /// Whether a vGPU earns its share of others' use: it is active and not overrunning
    /// (late work runs whether or not it gets the resource, so it was kept from nothing).
    fn earns(a: &Account, now: Nanos, period: Nanos) -> bool {
        Self::is_active(a, now, period) && !(a.overrun && a.running > 0)
    }

    /// `vgpu` used (or had reserved) the resource for `used` ns: it pays for them, and
    /// every active vGPU earns its share of them, shares normalised over the active ones
    /// (so a share left unused by an idle vGPU goes to the others in proportion). The
    /// balances of active vGPUs sum to zero, which is what makes the long-run split exact.
    pub fn charge(&mut self, vgpu: VgpuId, used: Nanos, now: Nanos) {
        if used == 0 || !self.map.contains_key(&vgpu) {
            return;
        }
        let period = self.config.period;
        let cap = period as f64;
        let active_share: f64 = self
            .map
            .iter()
            .filter(|(id, a)| **id == vgpu || Self::earns(a, now, period))
            .map(|(_, a)| a.share.fraction)
            .sum();
        let used = used as f64;
        for (id, a) in self.map.iter_mut() {
            let mut b = a.balance;
            if *id == vgpu {
                b -= used;
            }
            if active_share > 0.0 && (*id == vgpu || Self::earns(a, now, period)) {
                b += used * a.share.fraction / active_share;
            }
            a.balance = b.clamp(-cap, cap);
        }
    }

    /// A request of `vgpu` arrives.
    pub fn arrive(&mut self, vgpu: VgpuId, now: Nanos) -> Result<(), SchedError> {
        self.roll(now);
        // A gap longer than six waits (twice the longest wait) is a pause, not a guest preparing its next
        // request: it counts as "too long to wait for", no more, so one pause does not
        // keep the estimate high for long.
        let longest = 6.0 * self.config.wait.max(1) as f64;
        let a = self.get_mut(vgpu)?;
        let joins = !std::mem::replace(&mut a.counted, true);
        a.pending += 1;
        a.last_active = Some(now);
        if let Some(t) = a.idle_since.take() {
            let gap = (now.saturating_sub(t) as f64).min(longest);
            a.gap_ewma = if a.gap_ewma == 0.0 {
                gap.max(1.0)
            } else {
                a.gap_ewma * 0.875 + gap * 0.125
            };
        }
        if joins {
            self.active += 1;
        }
        Ok(())
    }

    /// BAND's "under its share": owed time (a positive balance).
    pub fn owed(&self, vgpu: VgpuId) -> bool {
        self.map.get(&vgpu).is_some_and(|a| a.balance > 0.0)
    }

    /// BAND's hand-over margin now, ns: the configured one, grown with the number N of
    /// active vGPUs by 2(N-1)/N (from N = 2). A vGPU's balance swings by (N-1)/N of a
    /// turn over a rotation, so a fixed margin would shorten every turn as vGPUs join
    /// (2 vGPUs: four margins; 8: 2.3) and pay a context switch that much more often;
    /// scaled, a turn of equal shares lasts about four margins whatever N.
    pub fn margin(&self) -> f64 {
        let n = self.active.max(2) as f64;
        self.config.switch_margin as f64 * 2.0 * (n - 1.0) / n
    }

    /// Whether `vgpu` is owed more than the hand-over margin: a waiting vGPU that is
    /// takes the resource from a holder (BAND).
    pub fn owed_past_margin(&self, vgpu: VgpuId) -> bool {
        let m = self.margin();
        self.map.get(&vgpu).is_some_and(|a| a.balance > m)
    }

    /// Whether `vgpu`'s debt is still within the hand-over margin: as a holder, it keeps
    /// the resource against vGPUs not owed past the margin (BAND).
    pub fn within_margin(&self, vgpu: VgpuId) -> bool {
        let m = self.margin();
        self.map.get(&vgpu).is_some_and(|a| a.balance > -m)
    }

    /// Every vGPU's balance (µs), requests pending and running, for trace logs:
    /// `vgpu:balance/pending/running` separated by spaces.
    pub fn summary(&self) -> String {
        use std::fmt::Write;
        let mut s = String::new();
        for (id, a) in &self.map {
            let _ = write!(
                s,
                "{id}:{:.0}/{}/{} ",
                a.balance / 1e3,
                a.pending,
                a.running
            );
        }
        s.pop();
        s
    }

    pub fn balance(&self, vgpu: VgpuId) -> Option<f64> {
        self.map.get(&vgpu).map(|a| a.balance)
    }

    /// Whether `vgpu`, idle now, is likely to submit again within `wait`: it went idle
    /// less than `wait` ago and its typical gap is shorter than the wait (or not known
    /// yet). Waiting for anyone else would idle the resource for nothing.
    pub fn expected_within(&self, vgpu: VgpuId, wait: Nanos, now: Nanos) -> bool {
        self.map.get(&vgpu).is_some_and(|a| {
            a.pending == 0
                && a.running == 0
                && a.idle_since.is_some_and(|t| now.saturating_sub(t) < wait)
                && a.gap_ewma <= wait as f64
        })
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
        let n = count - absorbed;
        if n > 0 && a.running == 0 {
            a.busy_since = now;
        }
        a.running = a.running.saturating_add(n);
        if count > 0 {
            a.last_active = Some(now);
            a.idle_since = None;
            a.progress_at = now;
        }
        Ok(())
    }

    /// Marks `count` pending requests of `vgpu` as running (granted at `now`).
    pub fn start(&mut self, vgpu: VgpuId, count: u32, now: Nanos) {
        if let Some(a) = self.map.get_mut(&vgpu) {
            let n = count.min(a.pending);
            if n > 0 && a.running == 0 {
                a.busy_since = now;
                a.progress_at = now;
            }
            a.pending -= n;
            a.running += n;
            if n > 0 {
                a.idle_since = None;
            }
        }
    }

    /// Sets `vgpu`'s kernel deadline (0 is taken as the configured default).
    pub fn set_deadline(&mut self, vgpu: VgpuId, deadline: Nanos) -> Result<(), SchedError> {
        let default = self.config.deadline;
        let a = self.get_mut(vgpu)?;
        a.deadline = if deadline == 0 { default } else { deadline };
        Ok(())
    }

    /// When `vgpu`'s running work overruns its deadline unless it shows progress first
    /// (None: nothing of it runs).
    pub fn overrun_at(&self, vgpu: VgpuId) -> Option<Nanos> {
        let a = self.map.get(&vgpu)?;
        (a.running > 0).then(|| a.progress_at.saturating_add(a.deadline))
    }

    /// Whether `vgpu`'s running work is past its deadline.
    pub fn overdue(&self, vgpu: VgpuId, now: Nanos) -> bool {
        self.overrun_at(vgpu).is_some_and(|d| now >= d)
    }

    /// `vgpu` overran its deadline and loses the resource: it pays for the time it held
    /// it so far and is marked, so it keeps paying while its late work runs.
    pub fn overrun(&mut self, vgpu: VgpuId, now: Nanos) {
        self.roll(now);
        self.charge_running(vgpu, now, true);
        if let Some(a) = self.map.get_mut(&vgpu) {
            a.overrun = true;
            a.overruns += 1;
        }
    }

    /// Whether `vgpu` lost the resource to its deadline and still has work running.
    pub fn is_overrunning(&self, vgpu: VgpuId) -> bool {
        self.map
            .get(&vgpu)
            .is_some_and(|a| a.overrun && a.running > 0)
    }

    /// Charges every overrunning vGPU the time its late work ran since it last paid. Late
    /// work runs beside the vGPU that holds the resource now (the GPU time-slices them),
    /// so it kept nobody waiting: the late vGPU pays (its balance, credit, busy time and
    /// utilization), and nobody earns from it, which would leave every neighbour owed
    /// and BAND unable to tell them apart.
    pub fn settle_overruns(&mut self, now: Nanos) {
        let late: Vec<VgpuId> = self
            .map
            .iter()
            .filter(|(_, a)| a.overrun && a.running > 0)
            .map(|(id, _)| *id)
            .collect();
        for v in late {
            self.charge_running(v, now, false);
        }
    }

    /// Charges `vgpu` for its running work up to `now` (what was not charged yet); the
    /// others earn their shares of it only if `shared_out` (it held the resource).
    fn charge_running(&mut self, vgpu: VgpuId, now: Nanos, shared_out: bool) {
        let period_start = self.period_start;
        let Some(a) = self.map.get_mut(&vgpu) else {
            return;
        };
        if a.running == 0 {
            return;
        }
        let start = a.busy_since.max(a.charged_until).min(now);
        a.charged_until = a.charged_until.max(now);
        let busy = now - start;
        Self::book(a, start, now, period_start);
        a.last_active = Some(now);
        if shared_out {
            self.charge(vgpu, busy, now);
        } else {
            self.debit(vgpu, busy);
        }
    }

    /// `vgpu` pays for `used` ns that nobody else was kept from (late work).
    fn debit(&mut self, vgpu: VgpuId, used: Nanos) {
        let cap = self.config.period as f64;
        if let Some(a) = self.map.get_mut(&vgpu) {
            a.balance = (a.balance - used as f64).clamp(-cap, cap);
        }
    }

    /// Books the busy interval [start, now) into `a`'s utilization window, totals and
    /// credit.
    fn book(a: &mut Account, start: Nanos, now: Nanos, period_start: Nanos) {
        let busy = now - start;
        // Its callers roll the period to `now` first; saturating all the same, as a
        // booking must never wrap.
        let in_cur = now.saturating_sub(start.max(period_start));
        a.busy_cur += in_cur;
        a.busy_prev += busy - in_cur;
        a.busy_total += busy;
        a.credit -= busy as i64;
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
        Self::book(a, start, now, period_start);
        a.progress_at = now;
        let late = a.overrun;
        if a.running == 0 {
            a.overrun = false;
        }
        a.burst_ewma = if a.burst_ewma == 0.0 {
            busy as f64
        } else {
            a.burst_ewma * 0.875 + busy as f64 * 0.125
        };
        a.last_active = Some(now);
        let idle = a.running == 0;
        if idle && a.pending == 0 {
            a.idle_since = Some(now);
        }
        if late {
            self.debit(vgpu, busy);
        } else {
            self.charge(vgpu, busy, now);
        }
        Ok(idle)
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

    pub fn over_share(&self, vgpu: VgpuId, now: Nanos) -> bool {
        match (self.map.get(&vgpu), self.utilization(vgpu, now)) {
            (Some(a), Some(u)) => u > a.share.fraction,
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests;
