//! End to end through vgpud: VMs launched concurrently. Sixteen `POST /v1/vms` at once,
//! each with its own inline vGPU, all succeed, all compute right, and every vGPU is
//! released afterwards.

use std::time::{Duration, Instant};

use vgpu_api::api::{VgpuState, VmState};
use vgpu_tests::daemon::{gpu_load, TestDaemon};
use vgpu_tests::require_kvm;

/// VMs launched at once.
const VMS: u32 = 16;

#[test]
fn sixteen_concurrent_launches_all_succeed_and_compute_right() {
    require_kvm!();
    let d = TestDaemon::start(
        "launch16",
        &[
            "--sim-gpus",
            "2",
            "--sim-memory",
            "2G",
            "--sim-threads",
            "1",
        ],
    );
    let c = &d.client;
    let start = Instant::now();
    let launched: Vec<(u32, Duration)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..VMS)
            .map(|n| {
                s.spawn(move || {
                    let t = Instant::now();
                    let req = gpu_load("rounds=3 spin_us=1000 check=1", n % 2, 0.05, 64 << 20);
                    let vm = c
                        .create_vm(&req)
                        .unwrap_or_else(|e| panic!("launch {n}: {e}"));
                    (vm.id, t.elapsed())
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("launch thread"))
            .collect()
    });
    let all = start.elapsed();
    let slowest = launched.iter().map(|(_, t)| *t).max().unwrap_or_default();
    eprintln!("{VMS} concurrent launches: all answered in {all:?}, slowest {slowest:?}");
    let mut ids: Vec<u32> = launched.iter().map(|(id, _)| *id).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(
        ids.len(),
        VMS as usize,
        "every launch got its own VM: {ids:?}"
    );

    for &id in &ids {
        let vm = c.wait_vm(id, Duration::from_secs(180)).expect("wait");
        let out = String::from_utf8_lossy(&c.console(id, 0).expect("console")).into_owned();
        assert_eq!(vm.state, VmState::Exited { code: 0 }, "VM {id}: {out}");
        assert!(out.contains("GPU-LOAD OK rounds=3"), "VM {id}: {out}");
    }
    // Every inline vGPU lets go of its share once its VM ended.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let held: Vec<_> = c
            .vgpus()
            .expect("vgpus")
            .into_iter()
            .filter(|v| !matches!(v.state, VgpuState::Released))
            .map(|v| (v.id, v.state))
            .collect();
        if held.is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "vGPUs not released: {held:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
    for id in ids {
        c.delete_vm(id).expect("delete");
    }
}
