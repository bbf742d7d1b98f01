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
