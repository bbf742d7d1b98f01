//! Measurement and the overload detector: windows, severe and recurring overloads.

use super::*;

#[test]
fn off_measures_but_never_moves() {
    let mut r = Rebalancer::new(cfg(Mode::Off));
    let mut gs = gpus(2);
    let mut vs = vec![v(1, 0, 300, GIB, 0.9), v(2, 0, 300, GIB, 0.9)];
    let d = run(&mut r, &mut gs, &mut vs, 0, 10, |_, _| 0.9);
    assert!(d.is_empty());
    assert!(r.loads()[0].overloaded);
    assert!((r.loads()[0].load - 1.8).abs() < 0.01, "{:?}", r.loads());
    assert!(r.loads()[1].idle);
}

#[test]
fn overload_is_detected_only_after_a_window() {
    let mut r = Rebalancer::new(cfg(Mode::Balance));
    let mut gs = gpus(2);
    // A mild overload (1.1, below `severe`) waits for the whole window.
    let mut vs = vec![v(1, 0, 300, GIB, 0.55), v(2, 0, 300, GIB, 0.55)];
    // 1.5 s of overload: shorter than the 2 s window.
    let d = run(&mut r, &mut gs, &mut vs, 0, 1, |_, _| 0.55);
    assert!(d.is_empty(), "{d:?}");
    assert!(!r.loads()[0].overloaded);
    let d = run(&mut r, &mut gs, &mut vs, 1000 * MS, 2, |_, _| 0.55);
    assert_eq!(d.len(), 1, "{d:?}");
    assert_eq!((d[0].from, d[0].to, d[0].kind), (0, 1, Kind::Balance));
    assert!(d[0].reason.contains("overloaded"), "{}", d[0].reason);
    assert!(d[0].at >= 2000 * MS, "acted after the window: {}", d[0].at);
}

#[test]
fn a_severe_overload_is_acted_on_within_the_severe_window() {
    // Load 1.6 (above `severe`, 1.3): acted on after `severe_window` (1 s), not after
    // the whole 2 s window.
    let mut r = Rebalancer::new(cfg(Mode::Balance));
    let mut gs = gpus(2);
    let mut vs = vec![v(1, 0, 300, GIB, 0.8), v(2, 0, 300, GIB, 0.8)];
    let d = run(&mut r, &mut gs, &mut vs, 0, 3, |_, _| 0.8);
    assert_eq!(d.len(), 1, "{d:?}");
    assert_eq!((d[0].from, d[0].to), (0, 1));
    let c = r.config();
    assert!(
        d[0].at <= c.severe_window + 500 * MS && d[0].at < c.window,
        "acted at {} ms",
        d[0].at / MS
    );
    // A spike above `severe` shorter than `severe_window` moves nothing.
    let mut r = Rebalancer::new(cfg(Mode::Balance));
    let mut vs = vec![v(1, 0, 300, GIB, 0.3), v(2, 0, 300, GIB, 0.3)];
    let d = run(&mut r, &mut gs, &mut vs, 0, 20, |t, _| {
        // 0.5 s at full demand (load 2) every 2 s, 0.3 otherwise.
        if t % (2000 * MS) < 500 * MS {
            1.0
        } else {
            0.3
        }
    });
    assert!(d.is_empty(), "{d:#?}");
}

#[test]
fn recurring_bursts_shorter_than_the_window_move_a_vgpu_once() {
    // GPU 0: vGPU 1 bursts to 0.9 for 1.25 s every 3 s (0.05 otherwise) beside a
    // steady vGPU 2 at 0.6; GPU 1 holds a nearly idle vGPU 3. Each overload lasts less
    // than the window (and less than `severe_window` above `severe`), so the old rules
    // never moved anything; the pattern repeats, so the recurring rule moves one vGPU,
    // to where it fits even at the peaks, once.
    let mut r = Rebalancer::new(cfg(Mode::Balance));
    let mut gs = gpus(2);
    let mut vs = vec![
        v(1, 0, 200, GIB, 0.05),
        v(2, 0, 200, GIB, 0.6),
        v(3, 1, 200, GIB, 0.05),
    ];
    let demand = |t: Nanos, id: VgpuId| match id {
        1 if t % (3000 * MS) < 1250 * MS => 0.9,
        1 | 3 => 0.05,
        _ => 0.6,
    };
    let d = run(&mut r, &mut gs, &mut vs, 0, 120, demand);
    assert_eq!(d.len(), 1, "{d:#?}");
    assert_eq!((d[0].from, d[0].to), (0, 1), "{d:#?}");
    assert!(d[0].reason.contains("again and again"), "{}", d[0].reason);
    assert!(d[0].to_load_after <= 1.0, "{d:#?}");
    // Gone: the bursts no longer overload anything.
    let more = run(&mut r, &mut gs, &mut vs, 120_000 * MS, 60, demand);
    assert!(more.is_empty(), "{more:#?}");
    assert!(r.loads().iter().all(|l| !l.overloaded), "{:?}", r.loads());
}
