//! Queue mapping onto hardware slots: HEFT-ranked priority against round-robin.

use vgpu_scheduler::clock::US;
use vgpu_scheduler::mapping::{
    random_dag, simulate, upward_ranks, wavefront, GraphError, Mapping, Task,
};

#[test]
fn upward_rank_is_the_longest_path_to_the_end() {
    // a(1) -> b(2) -> d(1); a -> c(5) -> d
    let t = |cost, queue, deps: &[usize]| Task {
        cost,
        queue,
        deps: deps.to_vec(),
    };
    let g = vec![t(1, 0, &[]), t(2, 1, &[0]), t(5, 2, &[0]), t(1, 3, &[1, 2])];
    assert_eq!(upward_ranks(&g).unwrap(), vec![7, 3, 6, 1]);
}

#[test]
fn bad_graphs_are_refused() {
    let cyc = vec![
        Task {
            cost: 1,
            queue: 0,
            deps: vec![1],
        },
        Task {
            cost: 1,
            queue: 1,
            deps: vec![0],
        },
    ];
    assert!(matches!(upward_ranks(&cyc), Err(GraphError::Cycle(_))));
    let missing = vec![Task {
        cost: 1,
        queue: 0,
        deps: vec![5],
    }];
    assert!(matches!(
        upward_ranks(&missing),
        Err(GraphError::MissingDep { task: 0, dep: 5 })
    ));
    assert!(matches!(
        simulate(&[], 0, Mapping::Priority),
        Err(GraphError::NoSlots)
    ));
}

#[test]
fn one_slot_runs_everything_back_to_back() {
    let g = random_dag(30, 4, 1);
    let total: u64 = g.iter().map(|t| t.cost).sum();
    assert_eq!(simulate(&g, 1, Mapping::Priority).unwrap(), total);
}

#[test]
fn priority_mapping_beats_round_robin_on_a_wavefront() {
    let g = wavefront(12, 12, 100 * US);
    let prio = simulate(&g, 4, Mapping::Priority).unwrap();
    let rr = simulate(&g, 4, Mapping::RoundRobin { quantum: 100 * US }).unwrap();
    // The critical path (23 anti-diagonals) bounds both from below.
    assert!(prio >= 23 * 100 * US);
    eprintln!(
        "wavefront 12x12 on 4 slots: priority {prio} ns, round-robin {rr} ns ({:.2}x)",
        rr as f64 / prio as f64
    );
    assert!(prio < rr, "priority {prio} vs round-robin {rr}");
}

#[test]
fn priority_mapping_is_no_worse_on_random_dags() {
    for seed in 1..6 {
        let g = random_dag(200, 16, seed);
        let prio = simulate(&g, 4, Mapping::Priority).unwrap();
        let rr = simulate(&g, 4, Mapping::RoundRobin { quantum: 200 * US }).unwrap();
        assert!(
            prio <= rr,
            "seed {seed}: priority {prio} vs round-robin {rr}"
        );
    }
}
