//! A payload guest drives a vhost-user device served by an in-test echo backend: the guest
//! fills descriptors, kicks, and sees the used ring advance with the right bytes.

use std::time::Duration;

use vgpu_tests::bins::payload;
use vgpu_tests::echo::EchoServer;
use vgpu_tests::require_kvm;
use vgpu_tests::run::run_payload;

#[test]
fn guest_round_trips_through_the_echo_backend() {
    require_kvm!();
    let dir = std::env::temp_dir().join(format!("vgpu-echo-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let sock = dir.join("echo.sock");
    let server = EchoServer::start(&sock).unwrap();
    let arg = format!("socket={}", sock.display());
    let out = run_payload(
        &payload("vhost-echo"),
        &["--vgpu", &arg, "--payload-arg", "iters=200"],
        Duration::from_secs(120),
    );
    assert_eq!(out.code, Some(0), "{out:?}");
    assert!(out.stdout.contains("ECHO OK"), "{out:?}");
    let served = server.join();
    assert!(served >= 64 + 200, "the backend served {served} chains");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn vm_survives_its_backend_dying_and_sees_needs_reset() {
    require_kvm!();
    let dir = std::env::temp_dir().join(format!("vgpu-dying-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let sock = dir.join("worker.sock");
    let mut worker = std::process::Command::new(vgpu_tests::bins::binary("vgpu-worker"))
        .args([
            "--socket",
            sock.to_str().unwrap(),
            "--vgpu-id",
            "0",
            "--memory",
            "64M",
            "--queues",
            "1",
        ])
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let t0 = std::time::Instant::now();
    while !sock.exists() && t0.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let p = payload("vhost-echo");
    let arg = format!("socket={}", sock.display());
    let vm = vgpu_tests::run::spawn_vmm(&[
        "--payload",
        p.to_str().unwrap(),
        "--vgpu",
        &arg,
        "--payload-arg",
        "until-reset",
    ]);
    std::thread::sleep(Duration::from_secs(2));
    worker.kill().unwrap();
    worker.wait().unwrap();
    let out = vgpu_tests::run::finish(vm, Duration::from_secs(60));
    assert_eq!(out.code, Some(0), "{out:?}");
    assert!(out.stdout.contains("vhost-echo: serving"), "{out:?}");
    assert!(out.stdout.contains("DEVICE_NEEDS_RESET"), "{out:?}");
    std::fs::remove_dir_all(&dir).ok();
}
