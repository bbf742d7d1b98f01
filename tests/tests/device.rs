//! First GPU work from a guest on the sim backend: guest -> virtqueue ->
//! vhost-user -> vgpu-worker -> sim GPU -> back, with payload guests under KVM.

use std::time::Duration;

use vgpu_tests::bins::payload;
use vgpu_tests::require_kvm;
use vgpu_tests::run::run_payload;
use vgpu_tests::worker::Worker;

const DEADLINE: Duration = Duration::from_secs(180);

/// Runs payload `name` with `arg` against a fresh sim worker with `queues` queues; checks
/// its success line and returns its console output.
fn on_sim(name: &str, queues: u16, arg: &str, ok_line: &str) -> String {
    let w = Worker::sim(name, "256M", queues);
    let out = run_payload(
        &payload(name),
        &["--vgpu", &w.vgpu_arg(), "--payload-arg", arg],
        DEADLINE,
    );
    let log = w.output();
    assert_eq!(out.code, Some(0), "{name}: {out:?}\nworker:\n{log}");
    assert!(out.stdout.contains(ok_line), "{name}: {out:?}");
    assert!(
        !log.contains("panicked"),
        "{name}: the worker panicked:\n{log}"
    );
    out.stdout
}

#[test]
fn vecadd_computes_every_element() {
    require_kvm!();
    let out = on_sim("vecadd", 2, "n=100003 iters=200", "VECADD OK");
    assert!(out.contains("BENCH vgpu_request_roundtrip"), "{out}");
}

#[test]
fn streams_run_independently() {
    require_kvm!();
    on_sim("streams", 4, "streams=4", "STREAMS OK");
}

#[test]
fn hostile_requests_each_get_an_error_and_the_queue_survives() {
    require_kvm!();
    let out = on_sim("hostile", 2, "", "HOSTILE OK");
    assert!(
        out.lines().filter(|l| l.starts_with("hostile: ")).count() >= 40,
        "{out}"
    );
}
