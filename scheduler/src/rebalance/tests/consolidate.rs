//! Consolidation under light load and placement of new vGPUs.

use super::*;

#[test]
fn consolidation_empties_light_gpus_and_reports_them_idle() {
    let mut r = Rebalancer::new(cfg(Mode::Consolidate));
    let mut gs = gpus(4);
    let mut vs: Vec<VgpuView> = (0..4).map(|i| v(i + 1, i, 200, GIB, 0.1)).collect();
    let d = run(&mut r, &mut gs, &mut vs, 0, 60, |_, _| 0.1);
    assert!(d.iter().all(|x| x.kind == Kind::Consolidate), "{d:#?}");
    let idle: Vec<GpuIndex> = r
        .loads()
        .iter()
        .filter(|l| l.idle)
        .map(|l| l.index)
        .collect();
    assert_eq!(idle.len(), 3, "4 × 0.1 fits one GPU: {:?}", r.loads());
    assert!(r.loads().iter().all(|l| l.load <= 0.7 + 1e-9));
    // Stable afterwards.
    let more = run(&mut r, &mut gs, &mut vs, 60_000 * MS, 60, |_, _| 0.1);
    assert!(more.is_empty(), "{more:#?}");
    // Load rises: the packed GPU overloads and balancing spreads it again.
    let spread = run(&mut r, &mut gs, &mut vs, 120_000 * MS, 60, |_, _| 0.5);
    assert!(!spread.is_empty());
    assert!(spread.iter().all(|x| x.kind == Kind::Balance));
    assert!(r.loads().iter().all(|l| !l.overloaded), "{:?}", r.loads());
}

#[test]
fn placement_weighs_load_and_free_memory() {
    let c = cfg(Mode::Balance);
    let cands = [
        PlaceCandidate {
            gpu: 0,
            load: 0.9,
            add: 0.1,
            free_memory_after: 0.9,
            occupied: true,
        },
        PlaceCandidate {
            gpu: 1,
            load: 0.2,
            add: 0.1,
            free_memory_after: 0.1,
            occupied: true,
        },
        PlaceCandidate {
            gpu: 2,
            load: 0.3,
            add: 0.1,
            free_memory_after: 0.8,
            occupied: true,
        },
    ];
    assert_eq!(place(&c, &cands), Some(2));
    assert_eq!(place(&cfg(Mode::Consolidate), &cands), Some(2));
    let packed = [
        PlaceCandidate {
            load: 0.5,
            ..cands[2]
        },
        PlaceCandidate {
            gpu: 3,
            load: 0.0,
            occupied: false,
            ..cands[2]
        },
    ];
    assert_eq!(place(&cfg(Mode::Consolidate), &packed), Some(2));
    assert_eq!(place(&c, &packed), Some(3));
    assert_eq!(place(&c, &[]), None);
}
