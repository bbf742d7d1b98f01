//! Dynamic placement and rebalancing end to end: three busy guests start on one
//! sim GPU of two; the rebalancer sees GPU 0 overloaded (demand above capacity for a
//! window), live-migrates a vGPU to GPU 1, logs why, and every guest's results stay
//! correct.

use std::time::{Duration, Instant};

use vgpu_api::api::{RebalanceEvent, RebalancerStatus, Vgpu, VmState};
use vgpu_tests::daemon::{gpu_load, wait_running, TestDaemon};
use vgpu_tests::require_kvm;

const MIB: u64 = 1 << 20;

fn console(c: &vgpu_api::client::Client, id: u32) -> String {
    String::from_utf8_lossy(&c.console(id, 0).unwrap_or_default()).into_owned()
}

fn last_checksum(out: &str) -> String {
    out.lines()
        .rev()
        .find_map(|l| l.strip_prefix("GPU-LOAD OK "))
        .unwrap_or_default()
        .to_string()
}

#[test]
fn an_imbalanced_start_converges_and_every_result_stays_correct() {
    require_kvm!();
    let d = TestDaemon::start(
        "rebalance",
        &[
            "--sim-gpus",
            "2",
            "--sim-memory",
            "512M",
            "--rebalance",
            "balance",
            "--rebalance-interval-ms",
            "100",
            "--rebalance-window-ms",
            "1000",
        ],
    );
    let c = &d.client;
    let arg = "rounds=600 n=16384 spin_us=5000 check=50";
    let vms: Vec<_> = (0..3)
        .map(|_| c.create_vm(&gpu_load(arg, 0, 0.3, 32 * MIB)).expect("vm"))
        .collect();
    for vm in &vms {
        wait_running(c, vm.id);
    }
    let vgpus: Vec<u32> = vms.iter().map(|v| v.vgpu.expect("vgpu")).collect();
    // The rebalancer moves one of them to GPU 1 once GPU 0 stays overloaded.
    let start = Instant::now();
    let moved = loop {
        let on1: Vec<u32> = vgpus
            .iter()
            .copied()
            .filter(|&v| c.vgpu(v).is_ok_and(|x| x.gpu == 1))
            .collect();
        if !on1.is_empty() {
            break on1;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "no vGPU moved off the overloaded GPU 0: {:#?}\nevents: {:#?}",
            c.call::<RebalancerStatus>("GET", "/v1/rebalancer", None),
            c.call::<Vec<RebalanceEvent>>("GET", "/v1/rebalancer/events", None)
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    eprintln!(
        "moved {moved:?} after {:.1} s",
        start.elapsed().as_secs_f64()
    );
    let events: Vec<RebalanceEvent> = c
        .call("GET", "/v1/rebalancer/events", None)
        .expect("events");
    let mv = events
        .iter()
        .find(|e| e.kind == "balance")
        .unwrap_or_else(|| panic!("no balance decision logged: {events:#?}"));
    assert_eq!((mv.gpu, mv.target_gpu), (Some(0), Some(1)), "{mv:?}");
    assert!(mv.reason.contains("overloaded"), "{mv:?}");
    assert!(mv.migration.is_some(), "{mv:?}");
    assert!(
        events
            .iter()
            .any(|e| e.kind == "overloaded" && e.gpu == Some(0)),
        "{events:#?}"
    );
    // Demand is measured per vGPU and per GPU.
    let st: RebalancerStatus = c.call("GET", "/v1/rebalancer", None).expect("status");
    assert_eq!(st.mode, "balance");
    assert!(st.migrations >= 1);
    assert!(st.vgpus.len() >= 3, "{st:#?}");
    assert!(
        st.vgpus.iter().any(|v| v.compute_busy > 0.05),
        "busy time measured: {st:#?}"
    );
    let metrics = c.metrics().expect("metrics");
    assert!(
        metrics.contains("vgpud_rebalance_migrations_total"),
        "{metrics}"
    );
    assert!(metrics.contains("vgpud_gpu_demand_ratio"), "{metrics}");
    // Placement by measured load: a small new vGPU with gpu "auto" goes to the GPU that
    // is not overloaded (GPU 0 still holds two busy guests).
    let body = br#"{"gpu": "auto", "memory_bytes": 16777216, "compute_share": 0.05}"#;
    let v: Vgpu = c
        .call("POST", "/v1/vgpus", Some(body))
        .expect("auto placement");
    assert_eq!(v.gpu, 1, "{v:?} {:#?}", c.gpus());
    c.delete_vgpu(v.id).expect("delete");
    let bad = br#"{"gpu": "fastest", "memory_bytes": 16777216, "compute_share": 0.05}"#;
    let e = c
        .call::<Vgpu>("POST", "/v1/vgpus", Some(bad))
        .expect_err("not a GPU");
    assert_eq!(e.status(), Some(400), "{e}");
    // Every guest finishes with the right result.
    let mut sums = Vec::new();
    for vm in &vms {
        let done = c.wait_vm(vm.id, Duration::from_secs(120)).expect("wait");
        let out = console(c, vm.id);
        assert_eq!(done.state, VmState::Exited { code: 0 }, "{out}");
        assert!(out.contains("GPU-LOAD OK rounds=600"), "{out}");
        sums.push(last_checksum(&out));
    }
    assert!(sums.iter().all(|s| *s == sums[0]), "{sums:?}");
    // No ping-pong: each vGPU moved at most once.
    let migrations = c.migrations().expect("migrations");
    for v in &vgpus {
        let n = migrations.iter().filter(|m| m.vgpu == *v).count();
        assert!(n <= 1, "vGPU {v} moved {n} times: {migrations:#?}");
    }
    assert!(
        migrations.iter().all(|m| m.state == "completed"),
        "{migrations:#?}"
    );
}
