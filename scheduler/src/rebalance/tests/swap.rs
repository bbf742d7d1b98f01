//! Swaps: two legs when no single move fits.

use super::*;

#[test]
fn a_swap_when_no_single_move_fits_the_shares() {
    // GPU 0: two busy vGPUs (0.7 each, 20% shares). GPU 1: its shares are full (20% +
    // 80%), with a light vGPU 3 (0.1) and vGPU 4 (0.2). No single move fits GPU 1's
    // shares; swapping vGPU 3 with a busy one does, each leg on its own.
    let mut r = Rebalancer::new(cfg(Mode::Balance));
    let mut gs = gpus(2);
    let mut vs = vec![
        v(1, 0, 200, GIB, 0.7),
        v(2, 0, 200, GIB, 0.7),
        v(3, 1, 200, GIB, 0.1),
        v(4, 1, 800, GIB, 0.2),
    ];
    let demand = |_: Nanos, id: VgpuId| match id {
        1 | 2 => 0.7,
        3 => 0.1,
        _ => 0.2,
    };
    let d = run(&mut r, &mut gs, &mut vs, 0, 60, demand);
    assert_eq!(d.len(), 2, "{d:#?}");
    assert_eq!((d[0].vgpu, d[0].from, d[0].to), (3, 1, 0), "{d:#?}");
    assert!(d[1].vgpu <= 2 && (d[1].from, d[1].to) == (0, 1), "{d:#?}");
    assert!(d[0].reason.contains("swap"), "{}", d[0].reason);
    assert!(r.loads().iter().all(|l| l.load <= 1.0 && !l.overloaded));
    // And it stays.
    let more = run(&mut r, &mut gs, &mut vs, 60_000 * MS, 60, demand);
    assert!(more.is_empty(), "{more:#?}");
}

#[test]
fn a_refused_first_leg_drops_the_swap() {
    let mut r = Rebalancer::new(cfg(Mode::Balance));
    let mut gs = gpus(2);
    let vs = vec![
        v(1, 0, 200, GIB, 0.7),
        v(2, 0, 200, GIB, 0.7),
        v(3, 1, 200, GIB, 0.1),
        v(4, 1, 800, GIB, 0.2),
    ];
    commit_all(&mut gs, &vs);
    let mut first = None;
    let mut now = 0;
    while first.is_none() && now < 10_000 * MS {
        now += 250 * MS;
        first = r.observe(now, &gs, &vs).decisions.into_iter().next();
    }
    let first = first.expect("a swap's first leg");
    assert!(first.reason.contains("first leg"), "{}", first.reason);
    assert!(r.pending.is_some());
    // vgpud's migration of the first leg is refused: the second leg is forgotten and
    // other moves are no longer held back.
    r.failed(&first);
    assert!(r.pending.is_none());
}

#[test]
fn swaps_do_not_ping_pong_under_oscillating_load() {
    // As above, but which pair is busy swings every 3 s for two minutes.
    let mut r = Rebalancer::new(cfg(Mode::Balance));
    let mut gs = gpus(2);
    let mut vs = vec![
        v(1, 0, 200, GIB, 0.7),
        v(2, 0, 200, GIB, 0.7),
        v(3, 1, 200, GIB, 0.1),
        v(4, 1, 800, GIB, 0.2),
    ];
    let d = run(&mut r, &mut gs, &mut vs, 0, 120, |t, id| {
        let phase = (t / (3000 * MS)) % 2 == 0;
        match (phase, id) {
            (true, 1 | 2) | (false, 3 | 4) => 0.7,
            _ => 0.1,
        }
    });
    assert!(d.iter().any(|x| x.reason.contains("swap")), "{d:#?}");
    assert_no_return(&d, r.config().return_cooldown);
    assert!(d.len() <= 8, "{} moves: {d:#?}", d.len());
}
