//! The accounts' unit tests.

use super::*;

#[test]
fn the_summary_lists_every_balance_with_its_requests() {
    let mut acc = Accounts::new(Config::default());
    acc.add(1, Share::new(0.5), 0).unwrap();
    acc.add(2, Share::new(0.5), 0).unwrap();
    acc.arrive(2, 0).unwrap();
    // vGPU 1 used 1 ms while vGPU 2 waited: it owes half of it, vGPU 2 is owed half.
    acc.charge(1, 1_000_000, 1_000_000);
    assert_eq!(acc.summary(), "1:-500/0/0 2:500/1/0");
}

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
fn one_freak_burst_owes_at_most_one_period() {
    let mut acc = Accounts::new(Config::default());
    let period = acc.config.period;
    acc.add(1, Share::new(0.2), 0).unwrap();
    acc.add(2, Share::new(0.8), 0).unwrap();
    acc.arrive(2, 0).unwrap();
    // A 10-period copy: the worker was descheduled while it held the GPU.
    acc.start_unasked(1, 1, 0).unwrap();
    acc.finish(1, 0, 10 * period).unwrap();
    let b = acc.balance(1).unwrap();
    assert_eq!(b, -(period as f64), "the debt is capped at one period");
    // Paid back, while it waits, at its share of what the others use: 150 ms of vGPU
    // 2's time.
    acc.arrive(1, 10 * period).unwrap();
    acc.start(2, 1, 10 * period);
    acc.finish(2, 10 * period, 10 * period + 150 * MS).unwrap();
    assert!(acc.balance(1).unwrap().abs() < 1.0, "{:?}", acc.balance(1));
}

#[test]
fn balances_split_used_time_by_share_and_sum_to_zero() {
    let mut acc = Accounts::new(Config::default());
    for (v, s) in [(1, 0.6), (2, 0.3), (3, 0.1)] {
        acc.add(v, Share::new(s), 0).unwrap();
        ask_once(&mut acc, v, 0);
    }
    acc.arrive(3, 0).unwrap();
    acc.start(3, 1, 0);
    acc.finish(3, 0, 10 * MS).unwrap();
    assert!(
        (acc.balance(3).unwrap() + 9.0 * MS as f64).abs() < 1.0,
        "{}",
        acc.balance(3).unwrap()
    );
    assert!(
        (acc.balance(1).unwrap() - 6.0 * MS as f64).abs() < 1.0,
        "{}",
        acc.balance(1).unwrap()
    );
    assert!(
        (acc.balance(2).unwrap() - 3.0 * MS as f64).abs() < 1.0,
        "{}",
        acc.balance(2).unwrap()
    );
    assert!(
        (acc.balance(1).unwrap() + acc.balance(2).unwrap() + acc.balance(3).unwrap()).abs() < 1.0
    );
    // vGPU 2 goes away for a period: it stops earning and keeps no credit, and vGPU
    // 1 earns what its share was (the split is over the active shares).
    acc.arrive(1, 10 * MS).unwrap();
    acc.start(1, 1, 10 * MS);
    acc.finish(1, 10 * MS, 11 * MS).unwrap();
    acc.roll(50 * MS);
    assert_eq!(acc.balance(2).unwrap(), 0.0, "no banking while inactive");
    assert!(
        acc.map.values().map(|a| a.balance).sum::<f64>().abs() < 1.0,
        "what vGPU 2 was owed is written off the others' debts"
    );
    acc.arrive(3, 50 * MS).unwrap();
    acc.start(3, 1, 50 * MS);
    acc.arrive(1, 50 * MS).unwrap();
    let before = (acc.balance(1).unwrap(), acc.balance(3).unwrap());
    acc.finish(3, 50 * MS, 57 * MS).unwrap();
    assert!(
        (acc.balance(1).unwrap() - before.0 - 6.0 * MS as f64).abs() < 1.0,
        "{}",
        acc.balance(1).unwrap() - before.0
    );
    assert!((acc.balance(3).unwrap() - before.1 + 6.0 * MS as f64).abs() < 1.0);
}

/// `vgpu` asks for a request that ends at once: it is active from `now`.
fn ask_once(acc: &mut Accounts, vgpu: VgpuId, now: Nanos) {
    acc.arrive(vgpu, now).unwrap();
    acc.start(vgpu, 1, now);
    acc.finish(vgpu, now, now).unwrap();
}

fn sum(acc: &Accounts) -> f64 {
    acc.map.values().map(|a| a.balance).sum()
}

#[test]
fn a_vgpu_earns_from_its_first_request() {
    let mut acc = Accounts::new(Config::default());
    for v in [1, 2, 3] {
        acc.add(v, Share::new(0.25), 0).unwrap();
    }
    ask_once(&mut acc, 1, 0);
    ask_once(&mut acc, 2, 0);
    acc.arrive(2, 0).unwrap();
    acc.charge(1, 4 * MS, 4 * MS);
    assert_eq!(
        acc.balance(3),
        Some(0.0),
        "vGPU 3 has asked for nothing: it was kept from nothing"
    );
    assert!((acc.balance(2).unwrap() - 2.0 * MS as f64).abs() < 1.0);
    assert!(sum(&acc).abs() < 1.0);
}

#[test]
fn a_balance_that_leaves_the_books_leaves_the_others_at_zero() {
    let mut acc = Accounts::new(Config::default());
    for v in [1, 2, 3, 4] {
        acc.add(v, Share::new(0.25), 0).unwrap();
        ask_once(&mut acc, v, 0);
    }
    // vGPU 1 uses 8 ms while the others wait: it owes 6 ms, each of them is owed 2.
    acc.charge(1, 8 * MS, 8 * MS);
    for v in [2, 3, 4] {
        acc.arrive(v, 8 * MS).unwrap();
    }
    assert!((acc.balance(2).unwrap() - 2.0 * MS as f64).abs() < 1.0);
    // vGPU 4 goes: its 2 ms can no longer be paid, so the others' debts shrink.
    acc.remove(4, 8 * MS).unwrap();
    assert!(sum(&acc).abs() < 1.0, "{}", acc.summary());
    assert!((acc.balance(1).unwrap() + 5.333 * MS as f64).abs() < 1e3);
    // vGPU 1 goes with its debt: the others are owed that much less.
    acc.remove(1, 8 * MS).unwrap();
    assert!(sum(&acc).abs() < 1.0, "{}", acc.summary());
    assert!(acc.remove(1, 8 * MS).is_none(), "already gone");
    // vGPU 3 stops asking and is owed when it goes quiet: forfeited, and written off
    // vGPU 2's balance, the only one still active.
    acc.start(2, 1, 8 * MS);
    acc.start(3, 1, 8 * MS);
    acc.finish(3, 8 * MS, 8 * MS).unwrap();
    acc.finish(2, 8 * MS, 9 * MS).unwrap();
    acc.arrive(2, 9 * MS).unwrap();
    acc.roll(60 * MS);
    assert_eq!(acc.balance(3), Some(0.0), "{}", acc.summary());
    assert!(sum(&acc).abs() < 1.0, "{}", acc.summary());
}

#[test]
fn the_margin_grows_with_the_active_vgpus() {
    let mut acc = Accounts::new(Config::default());
    let m = acc.config.switch_margin as f64;
    acc.add(1, Share::new(0.1), 0).unwrap();
    acc.roll(0);
    assert_eq!(acc.margin(), m, "alone");
    for v in 2..=8 {
        acc.add(v, Share::new(0.1), 0).unwrap();
    }
    acc.roll(0);
    assert_eq!(acc.margin(), m, "added, none asked yet");
    ask_once(&mut acc, 1, 0);
    ask_once(&mut acc, 2, 0);
    assert_eq!(acc.margin(), m, "two");
    for v in 3..=8 {
        ask_once(&mut acc, v, 0);
    }
    assert!(
        (acc.margin() - 1.75 * m).abs() < 1.0,
        "eight: {}",
        acc.margin()
    );
    // Six go: the margin of two.
    for v in 3..=8 {
        acc.remove(v, MS).unwrap();
    }
    assert_eq!(acc.margin(), m, "two left");
    // All quiet for a period: back to the configured margin.
    acc.roll(100 * MS);
    assert_eq!(acc.margin(), m);
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
    acc.start(1, 1, 0);
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
    acc.start(1, 2, 0);
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
