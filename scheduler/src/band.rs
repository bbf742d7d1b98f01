//! BAND (Gdev Figure 2): a vGPU loses the resource only when its budget is spent *and* it
//! is over its share, and the resource waits a short time before going to a vGPU that is
//! over its share, so a short-burst vGPU's next request can arrive and take it first.
//!
//! The budget is the vGPU's balance (`Account::balance`): its share of the time the
//! resource was used, minus what it used or had reserved, carried across periods. The
//! pending vGPU that is owed the most goes next; the wait is made only for the vGPU that
//! just went idle, only while its debt is within the hand-over margin and the next one is
//! not owed past it, and only if its requests usually come back within the wait
//! (docs/scheduler.md).

use crate::clock::Nanos;
use crate::exclusive::{exclusive_policy, Exclusive, Rule};
use crate::state::{Accounts, VgpuId};

pub struct BandRule;

impl Rule for BandRule {
    const NAME: &'static str = "band";

    fn lower(acc: &Accounts, vgpu: VgpuId, now: Nanos) -> bool {
        !acc.owed(vgpu) && acc.over_share(vgpu, now)
    }

    fn preferred(_acc: &Accounts, _vgpu: VgpuId) -> bool {
        true
    }

    fn may_continue(acc: &Accounts, vgpu: VgpuId, now: Nanos) -> bool {
        // The holder keeps launching unless it is spent past the hand-over margin and over
        // its share while a vGPU owed past the margin waits (Gdev's yield in
        // schedule_compute, with the margin: docs/scheduler.md, point 8).
        let owed_waits = acc
            .map
            .iter()
            .any(|(id, a)| *id != vgpu && a.pending > 0 && acc.owed_past_margin(*id));
        !(owed_waits && !acc.within_margin(vgpu) && acc.over_share(vgpu, now))
    }

    fn may_lease(acc: &Accounts, vgpu: VgpuId, _now: Nanos) -> bool {
        acc.balance(vgpu).is_some_and(|b| b >= -acc.margin())
    }

    fn urgency(acc: &Accounts, vgpu: VgpuId, _now: Nanos) -> Option<f64> {
        // The vGPU owed the most goes first. Gdev takes the head of a rotating queue,
        // which with more than two vGPUs lets one that is over its share go ahead of one
        // that is starved.
        acc.balance(vgpu)
    }

    fn owed(acc: &Accounts, vgpu: VgpuId, _now: Nanos) -> bool {
        acc.owed_past_margin(vgpu)
    }

    fn keep_for(acc: &Accounts, holder: VgpuId, next: Option<VgpuId>, now: Nanos) -> Option<Nanos> {
        let config = acc.config;
        let Some(next) = next else {
            // Nobody else waits: holding costs nothing, and spares a closed-loop guest a
            // round trip for its next request (the lease).
            return (config.lease > 0).then_some(now + config.lease);
        };
        // Gdev's time-buffer, made only when it can pay off: the next vGPU is not owed past
        // the hand-over margin, the holder's debt is within it, and the holder's requests
        // usually come back within the wait (a vGPU that is not coming would leave the
        // resource idle).
        let a = acc.get(holder).ok()?;
        let idle_since = a.idle_since?;
        // The wait covers the holder's measured gap (1.5x, at least the configured wait,
        // at most three times it): a guest slowed by its host (nested virtualisation, a
        // loaded or debug build) sends its next short burst later than 500 µs, and a wait
        // that ends first hands every gap to a neighbour's long non-preemptive burst.
        let wait = if a.gap_ewma > 0.0 {
            ((a.gap_ewma * 1.5) as Nanos).clamp(config.wait, config.wait.saturating_mul(3))
        } else {
            config.wait
        };
        let (next_not_owed, within, coming) = (
            !acc.owed_past_margin(next),
            acc.within_margin(holder),
            acc.expected_within(holder, wait, now),
        );
        tracing::trace!(
            holder,
            next,
            next_not_owed,
            within,
            coming,
            gap_us = a.gap_ewma / 1e3,
            "time-buffer: kept for the holder's next request only if all three hold"
        );
        (next_not_owed && within && coming).then_some(idle_since + wait)
    }
}

/// The BAND policy.
pub struct Band(Exclusive<BandRule>);
exclusive_policy!(Band, BandRule);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::{MS, US};
    use crate::state::{Config, Share};
    use crate::Policy;
    use std::collections::BTreeMap;

    /// Eight closed-loop guests with equal shares, 1 ms bursts and 20 µs between a
    /// completion and the next request; the first four start at once, the other four are
    /// added at the same time but ask for nothing until `late_start`. Returns the
    /// policy and how many bursts ran per turn from `from` on.
    fn staggered(late_start: Nanos, from: Nanos, until: Nanos) -> (Band, f64) {
        let mut p = Band::new(Config::default());
        for v in 1..=8 {
            p.add(v, Share::new(0.125), 0).unwrap();
        }
        let mut next_ask: BTreeMap<VgpuId, Nanos> = (1..=8)
            .map(|v| (v, if v <= 4 { 0 } else { late_start }))
            .collect();
        let mut running: Option<(VgpuId, Nanos)> = None;
        let mut granted: Vec<VgpuId> = Vec::new();
        let (mut last, mut bursts, mut turns) = (0, 0u32, 0u32);
        let mut now = 0;
        while now < until {
            let ask = next_ask.iter().map(|(v, t)| (*t, *v)).min();
            let end = running.map(|(_, s)| s + MS);
            let tick = p.next_deadline().unwrap_or(Nanos::MAX);
            now = [
                ask.map_or(Nanos::MAX, |a| a.0),
                end.unwrap_or(Nanos::MAX),
                tick,
            ]
            .into_iter()
            .min()
            .unwrap();
            let grants = if end == Some(now) {
                let (v, s) = running.take().unwrap();
                next_ask.insert(v, now + 20 * US);
                p.complete(v, s, now).unwrap()
            } else if let Some((t, v)) = ask.filter(|a| a.0 == now) {
                next_ask.remove(&v);
                debug_assert_eq!(t, now);
                p.submit(v, now).unwrap()
            } else {
                p.tick(now)
            };
            granted.extend(grants.iter().map(|g| g.vgpu));
            if running.is_none() {
                if let Some(v) = granted.pop() {
                    running = Some((v, now));
                    if now >= from {
                        bursts += 1;
                        turns += u32::from(v != last);
                    }
                    last = v;
                }
            }
            assert!(granted.is_empty(), "one holder at a time");
        }
        (p, f64::from(bursts) / f64::from(turns.max(1)))
    }

    #[test]
    fn guests_that_join_late_leave_the_balances_at_zero_and_the_turns_long() {
        let (p, per_turn) = staggered(100 * MS, 200 * MS, 1_000 * MS);
        let sum: f64 = p.0.accounts().map.values().map(|a| a.balance).sum();
        assert!(sum.abs() < 1_000.0, "balances sum to {sum} ns");
        // The default margin, grown for eight: turns of about four configured margins.
        assert!(per_turn > 8.0, "{per_turn:.2} bursts a turn");
    }
}
