//! Live migration end to end: a running guest's vGPU moves between sim GPUs
//! through the REST API while the guest computes; results stay bit-identical.

use std::time::Duration;

use vgpu_api::api::{MigrateRequest, VgpuCreate, VmCreate, VmState};
use vgpu_api::client::{Client, ClientError};
use vgpu_tests::daemon::{gpu_load, wait_running, TestDaemon};
use vgpu_tests::require_kvm;

const MIB: u64 = 1 << 20;

fn console(c: &Client, id: u32) -> String {
    String::from_utf8_lossy(&c.console(id, 0).unwrap_or_default()).into_owned()
}

fn migrate(c: &Client, vgpu: u32, target: u32, mode: &str) -> vgpu_api::api::Migration {
    let m = c
        .migrate_vgpu(
            vgpu,
            &MigrateRequest {
                target_gpu: Some(target),
                mode: Some(mode.into()),
                max_downtime_ms: Some(20),
            },
        )
        .expect("migrate");
    assert_eq!(m.state, "running");
    let done = c
        .wait_migration(m.id, Duration::from_secs(60), |_| {})
        .expect("wait");
    assert_eq!(done.state, "completed", "{done:?}");
    done
}

fn last_checksum(out: &str) -> String {
    out.lines()
        .rev()
        .find_map(|l| l.strip_prefix("GPU-LOAD OK "))
        .unwrap_or_default()
        .to_string()
}

/// `VGPU_TEST_BACKEND=cuda` runs the test on the GPU machine's real GPUs (between GPU 0
/// and the last GPU; onto GPU 0 itself where there is one).
fn on_cuda() -> bool {
    std::env::var("VGPU_TEST_BACKEND").is_ok_and(|b| b == "cuda")
}

#[test]
fn back_and_forth_twenty_times_and_the_result_is_bit_identical() {
    require_kvm!();
    let args: &[&str] = if on_cuda() {
        &["--backend", "cuda"]
    } else {
        &["--sim-gpus", "2", "--sim-memory", "512M"]
    };
    let d = TestDaemon::start("migrate-20", args);
    let c = &d.client;
    let last = u32::try_from(c.gpus().expect("gpus").len().saturating_sub(1)).unwrap_or(0);
    let arg = "rounds=2000 n=262144 spin_us=1000 check=50";
    // A cuda share holds the context's reserve (273 MiB on the H200) beside the guest's.
    let share = if on_cuda() { 1 << 30 } else { 64 * MIB };
    let moved = c.create_vm(&gpu_load(arg, 0, 0.4, share)).expect("vm");
    let still = c
        .create_vm(&gpu_load(arg, last, 0.4, share))
        .expect("reference vm");
    wait_running(c, moved.id);
    wait_running(c, still.id);
    let v = moved.vgpu.expect("vgpu");
    let mut downtimes = Vec::new();
    for i in 0..20 {
        let target = if i % 2 == 0 { last } else { 0 };
        let mode = if i % 4 == 3 { "stop_copy" } else { "precopy" };
        let m = migrate(c, v, target, mode);
        assert_eq!(c.vgpu(v).expect("vgpu").gpu, target);
        downtimes.push(m.downtime_ms.unwrap_or(f64::NAN));
    }
    assert!(
        c.vm(moved.id).expect("vm").state == VmState::Running,
        "the guest was still computing during all 20 migrations; make it run longer"
    );
    eprintln!("downtimes (ms): {downtimes:.2?}");
    for id in [moved.id, still.id] {
        let vm = c.wait_vm(id, Duration::from_secs(240)).expect("wait");
        assert_eq!(vm.state, VmState::Exited { code: 0 }, "{}", console(c, id));
    }
    let (a, b) = (console(c, moved.id), console(c, still.id));
    assert!(a.contains("GPU-LOAD OK rounds=2000"), "{a}");
    assert_eq!(
        last_checksum(&a),
        last_checksum(&b),
        "migrated vs unmigrated result"
    );
    assert_eq!(c.migrations().expect("list").len(), 20);
}

#[test]
fn swapped_out_memory_migrates_intact() {
    require_kvm!();
    let d = TestDaemon::start("migrate-swap", &["--sim-gpus", "2", "--sim-memory", "96M"]);
    let c = &d.client;
    let vm = |seed: u32| VmCreate {
        payload: Some(vgpu_tests::bins::payload("memcheck").display().to_string()),
        payload_arg: format!("buffers=4 size_mib=16 rounds=4 seed={seed} pause_ms=300"),
        memory_bytes: 64 << 20,
        vgpu: Some(VgpuCreate {
            gpu: Some(0),
            oversubscribe: true,
            ..VgpuCreate::new(65 * MIB, 0.2)
        }),
        ..Default::default()
    };
    let a = c.create_vm(&vm(1)).expect("a");
    let b = c.create_vm(&vm(2)).expect("b");
    let va = a.vgpu.expect("vgpu");
    // Wait until the two have pushed each other's memory out.
    let start = std::time::Instant::now();
    loop {
        let s = c.vgpu_stats(va).expect("stats");
        if s.memory_swapped_bytes > 0 {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "never swapped: {s:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let m = migrate(c, va, 1, "precopy");
    eprintln!("{m:?}");
    for id in [a.id, b.id] {
        let vm = c.wait_vm(id, Duration::from_secs(240)).expect("wait");
        let out = console(c, id);
        assert_eq!(vm.state, VmState::Exited { code: 0 }, "{out}");
        assert!(out.contains("MEMCHECK OK buffers=4 rounds=4"), "{out}");
    }
}

#[test]
fn a_full_target_refuses_and_the_vgpu_keeps_working() {
    require_kvm!();
    let d = TestDaemon::start("migrate-full", &["--sim-gpus", "2", "--sim-memory", "256M"]);
    let c = &d.client;
    let vm = c
        .create_vm(&gpu_load(
            "rounds=300 spin_us=1000 check=50",
            0,
            0.4,
            64 * MIB,
        ))
        .expect("vm");
    wait_running(c, vm.id);
    let v = vm.vgpu.expect("vgpu");
    // GPU 1's memory is all promised to another vGPU.
    c.create_vgpu(&VgpuCreate {
        gpu: Some(1),
        ..VgpuCreate::new(256 * MIB, 0.1)
    })
    .expect("filler");
    let req = |target: Option<u32>, mode: Option<&str>| MigrateRequest {
        target_gpu: target,
        mode: mode.map(str::to_string),
        max_downtime_ms: None,
    };
    match c.migrate_vgpu(v, &req(Some(1), None)) {
        Err(ClientError::Api {
            status: 409, body, ..
        }) => {
            assert!(body.error.contains("stays on GPU 0"), "{body:?}")
        }
        other => panic!("expected 409, got {other:?}"),
    }
    for (r, status) in [
        (req(Some(9), None), 400),
        (req(Some(1), Some("teleport")), 400),
    ] {
        match c.migrate_vgpu(v, &r) {
            Err(ClientError::Api { status: s, .. }) => assert_eq!(s, status, "{r:?}"),
            other => panic!("expected {status}, got {other:?}"),
        }
    }
    assert!(matches!(
        c.migrate_vgpu(999, &req(Some(1), None)),
        Err(ClientError::Api { status: 404, .. })
    ));
    assert!(matches!(
        c.migration(999),
        Err(ClientError::Api { status: 404, .. })
    ));
    assert_eq!(c.vgpu(v).expect("vgpu").gpu, 0);
    let done = c.wait_vm(vm.id, Duration::from_secs(120)).expect("wait");
    assert_eq!(
        done.state,
        VmState::Exited { code: 0 },
        "{}",
        console(c, vm.id)
    );
}
