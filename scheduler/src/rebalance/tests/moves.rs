//! Balance moves: scoring, the admission rule, convergence and no ping-pong.

use super::*;

#[test]
fn the_candidate_that_helps_most_per_byte_moves() {
    let mut r = Rebalancer::new(cfg(Mode::Balance));
    let mut gs = gpus(2);
    // 3 and 4 help as much as each other (0.5 demand); 3 holds 8 GiB, 4 holds 1 GiB.
    // 5 is tiny (0.02): moving it does not help enough. 6 is big and busy but the
    // move would overload GPU 1.
    let mut vs = vec![
        v(3, 0, 200, 8 * GIB, 0.5),
        v(4, 0, 200, GIB, 0.5),
        v(5, 0, 100, 0, 0.02),
        v(6, 0, 200, GIB, 0.95),
        v(7, 1, 200, GIB, 0.3),
    ];
    let d = run(&mut r, &mut gs, &mut vs, 0, 3, |_, id| match id {
        3 | 4 => 0.5,
        5 => 0.02,
        6 => 0.95,
        _ => 0.3,
    });
    // The first move (later ones may follow while GPU 0 stays overloaded).
    assert!(!d.is_empty(), "{d:?}");
    assert_eq!(d[0].vgpu, 4, "{d:?}");
    assert!(d[0].to_load_after <= 0.9 + 1e-9);
}

#[test]
fn a_move_never_oversubscribes_shares_or_memory() {
    let mut r = Rebalancer::new(cfg(Mode::Balance));
    let mut gs = gpus(2);
    gs[1].memory = 2 * GIB;
    // GPU 1 has 80% of its compute committed and 1 GiB memory left: vGPU 1 (30%)
    // cannot go; vGPU 2 (10%, 4 GiB share) cannot either (memory).
    let mut big = v(2, 0, 100, GIB, 0.8);
    big.memory = 4 * GIB;
    let mut vs = vec![v(1, 0, 300, GIB, 0.8), big, v(9, 1, 800, GIB, 0.0)];
    let d = run(&mut r, &mut gs, &mut vs, 0, 10, |_, id| {
        if id == 9 {
            0.0
        } else {
            0.8
        }
    });
    assert!(d.is_empty(), "{d:?}");
    assert!(r.loads()[0].overloaded);
}

#[test]
fn a_move_that_ends_an_overload_is_made_however_small() {
    // GPU 0: vGPU 1 at 0.97 beside a light vGPU 2 at 0.04: load 1.01, just over
    // capacity, for good. Moving vGPU 1 would overload GPU 1; moving vGPU 2 lowers the
    // peak by only 0.04 (< min_gain) but ends the overload, so it moves, once.
    let mut r = Rebalancer::new(cfg(Mode::Balance));
    let mut gs = gpus(2);
    let mut vs = vec![
        v(1, 0, 200, GIB, 0.97),
        v(2, 0, 200, GIB, 0.04),
        v(3, 1, 200, GIB, 0.5),
    ];
    let demand = |_: Nanos, id: VgpuId| match id {
        1 => 0.97,
        2 => 0.04,
        _ => 0.5,
    };
    let d = run(&mut r, &mut gs, &mut vs, 0, 60, demand);
    assert_eq!(d.len(), 1, "{d:#?}");
    assert_eq!((d[0].vgpu, d[0].from, d[0].to), (2, 0, 1), "{d:#?}");
    assert!(d[0].benefit < r.config().min_gain, "{d:#?}");
    assert!(
        d[0].from_load_after <= 1.0 && d[0].to_load_after <= 1.0,
        "{d:#?}"
    );
    assert!(r.loads().iter().all(|l| l.load <= 1.0), "{:?}", r.loads());
}

#[test]
fn imbalance_converges_and_stays() {
    let mut r = Rebalancer::new(cfg(Mode::Balance));
    let mut gs = gpus(4);
    let mut vs: Vec<VgpuView> = (1..=6).map(|i| v(i, 0, 150, GIB, 0.4)).collect();
    let d = run(&mut r, &mut gs, &mut vs, 0, 120, |_, _| 0.4);
    // 6 × 0.4 = 2.4 on GPU 0; a target takes two at most (0.8 <= 0.9): four moves
    // bring GPU 0 to 0.8 and nothing stays overloaded.
    let loads = r.loads();
    assert!(loads.iter().all(|l| l.load <= 0.9 + 1e-9), "{loads:?}");
    assert_eq!(d.len(), 4, "{d:#?}");
    // And then nothing more happens.
    let more = run(&mut r, &mut gs, &mut vs, 120_000 * MS, 60, |_, _| 0.4);
    assert!(more.is_empty(), "{more:#?}");
}

#[test]
fn no_ping_pong_under_oscillating_load() {
    // Two GPUs; the load swings between them every 3 s (longer than the window, so
    // each swing is a real overload): 4 vGPUs, two per GPU, the pair on the "hot" GPU
    // demands 0.7 each, the other pair 0.1.
    let mut r = Rebalancer::new(cfg(Mode::Balance));
    let mut gs = gpus(2);
    let mut vs = vec![
        v(1, 0, 200, GIB, 0.7),
        v(2, 0, 200, GIB, 0.7),
        v(3, 1, 200, GIB, 0.1),
        v(4, 1, 200, GIB, 0.1),
    ];
    let d = run(&mut r, &mut gs, &mut vs, 0, 120, |t, id| {
        let phase = (t / (3000 * MS)) % 2 == 0;
        let hot = if phase { id <= 2 } else { id > 2 };
        if hot {
            0.7
        } else {
            0.1
        }
    });
    // Never back to the GPU it left within the return cool-down.
    let mut left: BTreeMap<VgpuId, (GpuIndex, Nanos)> = BTreeMap::new();
    for x in &d {
        if let Some((g, at)) = left.get(&x.vgpu) {
            assert!(
                !(x.to == *g && x.at - at < r.config().return_cooldown),
                "vGPU {} went back to GPU {} after {} ms: {d:#?}",
                x.vgpu,
                g,
                (x.at - at) / MS
            );
        }
        left.insert(x.vgpu, (x.from, x.at));
    }
    // A few moves at most in two minutes of swinging (one per vGPU per return
    // cool-down at the very most).
    assert!(d.len() <= 4, "{} moves: {d:#?}", d.len());
    // Swings faster than the window never move anything.
    let mut r = Rebalancer::new(cfg(Mode::Balance));
    let mut vs2 = vec![
        v(1, 0, 200, GIB, 0.7),
        v(2, 0, 200, GIB, 0.7),
        v(3, 1, 200, GIB, 0.1),
        v(4, 1, 200, GIB, 0.1),
    ];
    let d = run(&mut r, &mut gs, &mut vs2, 0, 60, |t, id| {
        let phase = (t / (1000 * MS)) % 2 == 0;
        if phase == (id <= 2) {
            0.7
        } else {
            0.1
        }
    });
    assert!(d.is_empty(), "{d:#?}");
}

#[test]
fn the_fast_migration_settings_do_not_ping_pong() {
    // The settings `vgpu-bench rebalance` runs where moves are cheap (H200: window
    // 500 ms, smoothing 50 ms; every cool-down scales with the window). Load swinging
    // every 750 ms, longer than the window, moves each vGPU at most once per return
    // cool-down and never back within it, and no two moves come closer than the GPU
    // cool-down.
    let mut fast = RebalanceConfig::with_window(Mode::Balance, 500 * MS);
    fast.smoothing = 50 * MS;
    let swing = |period: Nanos| {
        move |t: Nanos, id: VgpuId| {
            let phase = (t / period) % 2 == 0;
            if phase == (id <= 2) {
                0.7
            } else {
                0.1
            }
        }
    };
    let four = || {
        vec![
            v(1, 0, 200, GIB, 0.7),
            v(2, 0, 200, GIB, 0.7),
            v(3, 1, 200, GIB, 0.1),
            v(4, 1, 200, GIB, 0.1),
        ]
    };
    let mut r = Rebalancer::new(fast);
    let mut gs = gpus(2);
    let mut vs = four();
    let d = run(&mut r, &mut gs, &mut vs, 0, 120, swing(750 * MS));
    assert!(
        !d.is_empty(),
        "a swing longer than the window is an overload"
    );
    assert_no_return(&d, fast.return_cooldown);
    let per_vgpu = 120_000 * MS / fast.return_cooldown + 1;
    for id in 1..=4 {
        let n = d.iter().filter(|x| x.vgpu == id).count() as u64;
        assert!(n <= per_vgpu, "vGPU {id} moved {n} times: {d:#?}");
    }
    for w in d.windows(2) {
        assert!(
            w[1].at - w[0].at >= fast.gpu_cooldown,
            "moves closer than the GPU cool-down: {d:#?}"
        );
    }
    // Swings of one round: with so little smoothing GPU 0 is above `overload` every
    // other round, a recurring overload; it is fixed once (one move or one swap) and
    // nothing moves after that.
    let mut r = Rebalancer::new(fast);
    let mut vs = four();
    let d = run(&mut r, &mut gs, &mut vs, 0, 60, swing(250 * MS));
    assert!(d.len() <= 2, "{d:#?}");
    assert_no_return(&d, fast.return_cooldown);
    let more = run(&mut r, &mut gs, &mut vs, 60_000 * MS, 60, swing(250 * MS));
    assert!(more.is_empty(), "{more:#?}");
}
