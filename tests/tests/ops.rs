//! End to end through vgpud: the operator's ends (a second vgpud on a state directory in
//! use, per-vGPU kernel deadlines, the grant path's counters in the stats).

use std::io::{Read, Write};
use std::process::Stdio;
use std::time::{Duration, Instant};

use vgpu_api::api::{VgpuCreate, VgpuPatch};
use vgpu_tests::daemon::{vgpud_command, TestDaemon};

fn spec(kernel_deadline_ms: Option<u32>) -> VgpuCreate {
    VgpuCreate {
        gpu: Some(0),
        kernel_deadline_ms,
        ..VgpuCreate::new(16 << 20, 0.1)
    }
}

#[test]
fn a_vgpu_kernel_deadline_is_set_shown_changed_checked_and_kept() {
    let mut d = TestDaemon::start("deadline", &["--sim-gpus", "1"]);
    let c = d.client.clone();
    let a = c.create_vgpu(&spec(Some(200))).expect("create");
    assert_eq!(a.kernel_deadline_ms, Some(200));
    let plain = c.create_vgpu(&spec(None)).expect("create");
    assert_eq!(plain.kernel_deadline_ms, None);

    for bad in [0, 9, 60_001] {
        let e = c.create_vgpu(&spec(Some(bad))).expect_err("out of range");
        assert_eq!(e.status(), Some(400), "{e}");
        assert_eq!(
            e.body().and_then(|b| b.field.as_deref()),
            Some("kernel_deadline_ms")
        );
    }

    let patch = VgpuPatch {
        kernel_deadline_ms: Some(500),
        ..VgpuPatch::default()
    };
    let v = c.patch_vgpu(a.id, &patch).expect("patch");
    assert_eq!(v.kernel_deadline_ms, Some(500));
    assert_eq!(c.vgpu(a.id).expect("get").kernel_deadline_ms, Some(500));
    assert!(
        d.log_text().contains("kernel deadline set"),
        "{}",
        d.log_text()
    );
    let e = c
        .patch_vgpu(
            a.id,
            &VgpuPatch {
                kernel_deadline_ms: Some(5),
                ..VgpuPatch::default()
            },
        )
        .expect_err("out of range");
    assert_eq!(e.status(), Some(400), "{e}");
    assert_eq!(c.vgpu(a.id).expect("get").kernel_deadline_ms, Some(500));

    // The grant path's counters are in the stats.
    let s = c.vgpu_stats(a.id).expect("stats");
    assert_eq!(
        (s.compute_overruns, s.copy_overruns, s.violations),
        (0, 0, 0)
    );
    let raw = c
        .raw("GET", &format!("/v1/vgpus/{}/stats", a.id), None)
        .expect("stats");
    let text = String::from_utf8_lossy(&raw.body);
    assert!(text.contains("\"compute_overruns\":0"), "{text}");
    let m = c.metrics().expect("metrics");
    assert!(m.contains("vgpud_vgpu_compute_overruns_total{"), "{m}");
    assert!(m.contains("vgpud_vgpu_grant_violations_total{"), "{m}");

    // Kept across a restart.
    assert!(d.stop(), "vgpud did not stop");
    d.restart(None);
    let c = d.client.clone();
    assert_eq!(c.vgpu(a.id).expect("get").kernel_deadline_ms, Some(500));
    assert_eq!(c.vgpu(plain.id).expect("get").kernel_deadline_ms, None);
}

#[test]
fn a_client_stalled_in_its_headers_is_disconnected() {
    let d = TestDaemon::start(
        "stall",
        &["--sim-gpus", "1", "--header-read-timeout-s", "1"],
    );
    let mut s = std::os::unix::net::UnixStream::connect(&d.socket).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(15)))
        .expect("timeout");
    s.write_all(b"GET /v1/gp").expect("write");
    let t0 = Instant::now();
    let mut buf = [0u8; 512];
    loop {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) => panic!("the connection stayed open: {e} after {:?}", t0.elapsed()),
        }
    }
    let took = t0.elapsed();
    assert!(took < Duration::from_secs(5), "closed only after {took:?}");
    assert!(d.client.gpus().is_ok(), "vgpud stopped serving");
}

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

/// Runs vgpuctl on `socket`: exit code, stdout, stderr.
fn ctl(socket: &std::path::Path, args: &[&str]) -> (Option<i32>, String, String) {
    let out = std::process::Command::new(vgpu_tests::bins::binary("vgpuctl"))
        .arg("--socket")
        .arg(socket)
        .args(args)
        .env_remove("VGPUD_URL")
        .env_remove("VGPUD_TOKEN_FILE")
        .output()
        .expect("vgpuctl");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn vgpuctl_names_labels_and_kernel_deadlines() {
    let d = TestDaemon::start("ctlnames", &["--sim-gpus", "1"]);
    let ctl = |args: &[&str]| ctl(&d.socket, args);
    let (code, out, err) = ctl(&[
        "--json",
        "vgpu",
        "create",
        "--memory",
        "16M",
        "--compute",
        "10%",
        "--name",
        "train-a",
        "--label",
        "team=vision",
        "--label",
        "tier=gold",
        "--kernel-deadline-ms",
        "250",
    ]);
    assert_eq!(code, Some(0), "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("json");
    assert_eq!(v["name"], "train-a");
    assert_eq!(v["labels"]["tier"], "gold");
    assert_eq!(v["kernel_deadline_ms"], 250);

    // Listed with its name; addressed by it.
    let (code, out, _) = ctl(&["vgpu", "list"]);
    assert_eq!(code, Some(0));
    assert!(out.contains("NAME") && out.contains("train-a"), "{out}");
    let (code, out, err) = ctl(&[
        "--json",
        "vgpu",
        "set",
        "train-a",
        "--kernel-deadline-ms",
        "900",
        "--label",
        "team=audio",
    ]);
    assert_eq!(code, Some(0), "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("json");
    assert_eq!(v["kernel_deadline_ms"], 900);
    assert_eq!(v["labels"], serde_json::json!({"team": "audio"}));
    let (code, out, err) = ctl(&["vgpu", "stats", "train-a"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.contains("OVERRUNS") && out.contains("VIOLATIONS"),
        "{out}"
    );
    let (code, _, err) = ctl(&["vgpu", "show", "nobody"]);
    assert_eq!(code, Some(1));
    assert!(err.contains("no vGPU or VM is named"), "{err}");
    let (code, _, err) = ctl(&["vgpu", "set", "train-a", "--kernel-deadline-ms", "5"]);
    assert_eq!(code, Some(2), "{err}");
    let (code, _, err) = ctl(&["vgpu", "delete", "train-a"]);
    assert_eq!(code, Some(0), "{err}");
}
