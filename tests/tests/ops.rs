//! End to end through vgpud: the operator's ends (a second vgpud on a state directory in
//! use, per-vGPU kernel deadlines, the grant path's counters in the stats).

use std::process::Stdio;

use vgpu_tests::daemon::{vgpud_command, TestDaemon};

#[test]
fn second_vgpud_on_the_same_state_dir_names_the_first() {
    let d = TestDaemon::start("second", &["--sim-gpus", "1"]);
    let other = d.dir.join("other.sock");
    let out = vgpud_command(&[
        "--socket",
        &other.display().to_string(),
        "--state-dir",
        &d.dir.display().to_string(),
        "--sim-gpus",
        "1",
    ])
    .stdout(Stdio::null())
    .stderr(Stdio::piped())
    .output()
    .expect("second vgpud");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the second daemon started: {err}");
    assert!(err.contains("already running"), "{err}");
    assert!(err.contains(&d.dir.display().to_string()), "{err}");
    assert!(err.contains(&d.socket.display().to_string()), "{err}");
    assert!(err.contains(&d.pid().to_string()), "{err}");
    assert!(!other.exists(), "the second daemon bound its socket");
    assert!(d.client.gpus().is_ok(), "the first daemon stopped serving");
}
