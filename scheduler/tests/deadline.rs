//! Kernel deadlines in virtual time: a vGPU whose kernels overrun loses the resource after
//! its deadline, pays for its late work, and cannot hold a neighbour beyond deadline plus
//! one period; well-behaved vGPUs keep their shares.

use vgpu_scheduler::clock::{MS, US};
use vgpu_scheduler::gpu::{GpuScheduler, PolicyKind, QueueMode, Resource};
use vgpu_scheduler::simulate::{run, Burst, Report, Workload};
use vgpu_scheduler::{Config, Grant, Policy, Share, DEFAULT_DEADLINE};

fn workload(vgpu: u32, share: f64, burst: Burst) -> Workload {
    Workload {
        vgpu,
        compute_share: Share::new(share),
        copy_share: Share::new(share),
        resource: Resource::Compute,
        burst,
        think: 20 * US,
        streams: 1,
    }
}

fn sim(sched: GpuScheduler, w: &[Workload], ms: u64) -> Report {
    run(sched, w, ms * MS, 1_000 * MS, 11)
}

#[test]
fn an_overrunning_vgpu_cannot_hold_its_neighbour_past_deadline_plus_a_period() {
    let config = Config::default();
    let bound = config.deadline + config.period;
    for kind in [PolicyKind::Band, PolicyKind::Credit, PolicyKind::Fifo] {
        // vGPU 1 runs 9 s kernels back to back (the longest spin a guest may ask for is
        // 10 s); vGPU 2 runs 1 ms kernels and checks its latency.
        let w = [
            workload(1, 0.5, Burst::Fixed(9_000 * MS)),
            workload(2, 0.5, Burst::Uniform(500 * US, 2 * MS)),
        ];
        let sched = GpuScheduler::new(kind, QueueMode::Mrq, config);
        let r = sim(sched, &w, 20_000);
        let wait = r.max_wait.get(&2).copied().unwrap_or(0);
        let done = r.completed.get(&2).copied().unwrap_or(0);
        eprintln!(
            "{kind:?}: neighbour's longest wait {:.1} ms, {done} kernels done; \
             overrunning vGPU busy {:.1} s",
            wait as f64 / MS as f64,
            r.busy.get(&(1, Resource::Compute)).copied().unwrap_or(0) as f64 / 1e9,
        );
        assert!(
            wait <= bound,
            "{kind:?}: the neighbour waited {wait} ns, more than deadline + period ({bound} ns)"
        );
        // The neighbour runs most of the time: the late kernel shares the GPU with it.
        assert!(
            done > 5_000,
            "{kind:?}: the neighbour completed only {done}"
        );
    }
}

#[test]
fn a_shorter_deadline_for_one_vgpu_bounds_its_neighbours_tighter() {
    let config = Config::default();
    let mut sched = GpuScheduler::new(PolicyKind::Band, QueueMode::Mrq, config);
    sched
        .add(1, Share::new(0.5), Share::new(0.5), 0)
        .expect("add 1");
    sched
        .add(2, Share::new(0.5), Share::new(0.5), 0)
        .expect("add 2");
    sched.set_deadline(1, 200 * MS).expect("deadline");
    assert!(sched.set_deadline(9, MS).is_err(), "unknown vGPU");
    let w = [
        workload(1, 0.5, Burst::Fixed(3_000 * MS)),
        workload(2, 0.5, Burst::Fixed(MS)),
    ];
    // `run` adds the vGPUs itself; they are there already with the deadline set.
    let r = sim(sched, &w, 8_000);
    let wait = r.max_wait.get(&2).copied().unwrap_or(0);
    eprintln!("neighbour's longest wait {:.1} ms", wait as f64 / MS as f64);
    assert!(wait <= 200 * MS + config.period, "waited {wait} ns");
}

#[test]
fn overrun_time_is_charged_once_and_the_resource_goes_back_to_the_neighbour() {
    let config = Config {
        lease: 0,
        ..Config::default()
    };
    let d = config.deadline;
    let mut p = vgpu_scheduler::band::Band::new(config);
    p.add(1, Share::new(0.5), 0).unwrap();
    p.add(2, Share::new(0.5), 0).unwrap();
    assert_eq!(p.submit(1, 0).unwrap(), vec![Grant { vgpu: 1, count: 1 }]);
    assert_eq!(
        p.submit(2, MS).unwrap(),
        vec![],
        "vGPU 1 holds the resource"
    );
    assert_eq!(p.next_deadline(), Some(config.period), "period first");
    assert_eq!(p.tick(d - 1), vec![], "not yet");
    assert_eq!(
        p.next_deadline(),
        Some(d),
        "vGPU 1's deadline comes first now"
    );
    assert_eq!(
        p.tick(d),
        vec![Grant { vgpu: 2, count: 1 }],
        "past the deadline vGPU 2 gets the resource"
    );
    assert_eq!(p.overruns(1), Some(1));
    assert_eq!(p.busy_total(1), Some(d), "charged for the time it held it");
    // The late kernel keeps running and keeps paying as time passes.
    p.tick(d + 500 * MS);
    assert_eq!(p.busy_total(1), Some(d + 500 * MS));
    // vGPU 1 submits more while its late kernel runs: it is last in line.
    assert_eq!(p.submit(1, d + 600 * MS).unwrap(), vec![]);
    // The late completion charges only what was not charged yet.
    assert_eq!(p.complete(1, 0, 3 * d).unwrap(), vec![]);
    assert_eq!(p.busy_total(1), Some(3 * d), "charged once: [0, 3d)");
    // vGPU 2's kernel ends: vGPU 1, its late kernel done, is served again (at once or
    // after the time-buffer kept for vGPU 2).
    let mut g = p.complete(2, d, 3 * d + MS).unwrap();
    if g.is_empty() {
        g = p.tick(3 * d + 10 * MS);
    }
    assert_eq!(g, vec![Grant { vgpu: 1, count: 1 }]);
    assert_eq!(
        p.set_deadline(3, MS),
        Err(vgpu_scheduler::SchedError::UnknownVgpu(3))
    );
}

#[test]
fn band_shares_hold_for_well_behaved_vgpus_beside_an_overrunning_one() {
    // Two well-behaved vGPUs at 60 % and 30 % and one at 10 % whose kernels run 5 s:
    // the well-behaved pair still splits its time 2:1 within 2 pp, in every window.
    let w = [
        workload(1, 0.6, Burst::Uniform(100 * US, MS)),
        workload(2, 0.3, Burst::Uniform(MS, 10 * MS)),
        workload(3, 0.1, Burst::Fixed(5_000 * MS)),
    ];
    let r = sim(
        GpuScheduler::new(PolicyKind::Band, QueueMode::Mrq, Config::default()),
        &w,
        20_000,
    );
    let busy = |v| r.busy.get(&(v, Resource::Compute)).copied().unwrap_or(0) as f64;
    let split = busy(1) / (busy(1) + busy(2));
    eprintln!(
        "well-behaved split {split:.4} (wanted 0.6667); overrunning vGPU busy {:.1} s of 20",
        busy(3) / 1e9
    );
    assert!((split - 2.0 / 3.0).abs() < 0.02, "split {split}");
    let c = Config::default();
    for v in [1, 2] {
        let wait = r.max_wait.get(&v).copied().unwrap_or(0);
        assert!(
            wait <= DEFAULT_DEADLINE + c.period + c.switch_margin,
            "vGPU {v} waited {wait} ns"
        );
    }
}

#[test]
fn well_behaved_shares_hold_within_2_pp_with_deadlines_on() {
    // Kernels up to 10 ms never come near a 50 ms deadline: nothing changes for them.
    let config = Config {
        deadline: 50 * MS,
        ..Config::default()
    };
    let w = [
        workload(1, 0.7, Burst::Fixed(200 * US)),
        workload(2, 0.3, Burst::Uniform(MS, 10 * MS)),
    ];
    let r = sim(
        GpuScheduler::new(PolicyKind::Band, QueueMode::Mrq, config),
        &w,
        3_000,
    );
    let got = r.share_of_busy(1, Resource::Compute);
    eprintln!("70/30 with a 50 ms deadline: got {got:.4}");
    assert!((got - 0.7).abs() < 0.02, "got {got}");
    assert!(r.max_window_error(1, Resource::Compute, 0.7) < 0.02);
}

/// Closed-loop streams of 5 ms kernels on two vGPUs, driven event by event; vGPU 1's
/// first request never reports its completion. The share of the time from 3 s to 10 s
/// that vGPU 2's kernels ran (its busy time: overlapping kernels count once).
fn waiter_busy_beside_a_stuck_request(kind: PolicyKind) -> f64 {
    const STREAMS: usize = 4;
    let kernel = 5 * MS;
    let config = Config::default();
    let mut p = GpuScheduler::new(kind, QueueMode::Mrq, config);
    p.add(1, Share::new(0.3), Share::new(0.3), 0)
        .expect("add 1");
    p.add(2, Share::new(0.7), Share::new(0.7), 0)
        .expect("add 2");
    // Per vGPU and stream: when its kernel ends (None: waiting for a grant, or stuck).
    let mut ends: [[Option<u64>; STREAMS]; 3] = [[None; STREAMS]; 3];
    let mut waiting: [std::collections::VecDeque<usize>; 3] = Default::default();
    let mut stuck = true;
    let mut busy_at_3s = None;
    let mut t = 0u64;
    let mut grants = Vec::new();
    for v in [1u32, 2] {
        for s in 0..STREAMS {
            waiting[v as usize].push_back(s);
            grants.extend(p.submit(v, Resource::Compute, t).expect("submit"));
        }
    }
    let end = 10_000 * MS;
    while t < end {
        for g in std::mem::take(&mut grants) {
            let v = g.grant.vgpu as usize;
            for _ in 0..g.grant.count {
                if let Some(s) = waiting[v].pop_front() {
                    if v == 1 && stuck {
                        // Started, and its completion never comes.
                        stuck = false;
                        ends[v][s] = Some(u64::MAX);
                    } else {
                        ends[v][s] = Some(t + kernel);
                    }
                }
            }
        }
        // The next event: a kernel's end or the scheduler's deadline.
        let next_end = ends
            .iter()
            .flatten()
            .filter_map(|e| *e)
            .filter(|e| *e != u64::MAX)
            .min()
            .unwrap_or(u64::MAX);
        let next = next_end.min(p.next_deadline().unwrap_or(u64::MAX)).min(end);
        t = next.max(t + 1);
        for v in [1usize, 2] {
            for (s, e) in ends[v].iter_mut().enumerate() {
                if e.is_some_and(|e| e <= t) {
                    *e = None;
                    grants.extend(
                        p.complete(v as u32, Resource::Compute, t - kernel, t)
                            .expect("complete"),
                    );
                    // The stream asks again at once (its guest's think time is part of
                    // the kernel's here).
                    waiting[v].push_back(s);
                    grants.extend(p.submit(v as u32, Resource::Compute, t).expect("submit"));
                }
            }
        }
        grants.extend(p.tick(t));
        if t >= 3_000 * MS && busy_at_3s.is_none() {
            busy_at_3s = p.busy_total(2, Resource::Compute);
        }
    }
    let busy = p.busy_total(2, Resource::Compute).unwrap_or(0) - busy_at_3s.unwrap_or(0);
    busy as f64 / (end - 3_000 * MS) as f64
}

#[test]
fn a_request_that_never_completes_cannot_keep_its_neighbour_out() {
    // A lost or withheld completion leaves one request of vGPU 1 running for ever, so
    // it never goes idle. Its neighbour still gets the GPU, and most of it: vGPU 1 lost
    // the resource at its deadline, its late work is charged to it, and it cannot take
    // the GPU back for longer than a deadline at a time.
    for kind in [PolicyKind::Band, PolicyKind::Credit] {
        let f = waiter_busy_beside_a_stuck_request(kind);
        eprintln!("{kind:?}: the neighbour's kernels ran {f:.2} of the time from 3 s to 10 s");
        assert!(f > 0.5, "{kind:?}: the neighbour got {f:.2} of the GPU");
    }
}
