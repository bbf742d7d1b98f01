//! vgpuctl against every endpoint, and the demo.

use super::*;

#[test]
fn vgpuctl_speaks_for_every_endpoint() {
    let d = TestDaemon::start("vgpuctl", &["--sim-gpus", "1", "--sim-memory", "2G"]);
    let ctl = |args: &[&str]| {
        let out = std::process::Command::new(vgpu_tests::bins::binary("vgpuctl"))
            .arg("--socket")
            .arg(&d.socket)
            .args(args)
            .output()
            .expect("vgpuctl");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, out, err) = ctl(&[
        "vgpu",
        "create",
        "--gpu",
        "0",
        "--memory",
        "512M",
        "--compute",
        "25%",
        "--copy",
        "0.2",
    ]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.contains("25.0%") && out.contains("20.0%") && out.contains("ready"),
        "{out}"
    );
    let (code, out, _) = ctl(&["--json", "vgpu", "list"]);
    assert_eq!(code, Some(0));
    let list: Vec<vgpu_api::api::Vgpu> =
        serde_json::from_str(&out).expect("--json is the API's JSON");
    assert_eq!(list.len(), 1);
    let id = list[0].id.to_string();
    let (code, out, err) = ctl(&["vgpu", "set", &id, "--compute", "0.5", "--priority", "-1"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("50.0%") && out.contains("-1"), "{out}");
    let (code, out, _) = ctl(&["gpus"]);
    assert_eq!(code, Some(0));
    assert!(out.contains("50.0%") && out.contains("512.0 MiB"), "{out}");
    let (code, out, _) = ctl(&["--json", "vgpu", "stats", &id]);
    assert_eq!(code, Some(0));
    let s: vgpu_api::api::VgpuStats = serde_json::from_str(&out).expect("stats JSON");
    assert_eq!(s.compute_share, 0.5);
    let (code, out, _) = ctl(&["top", "--count", "1"]);
    assert_eq!(code, Some(0));
    assert!(out.contains("vgpuctl top") && out.contains("UTIL"), "{out}");
    let (code, out, _) = ctl(&["metrics"]);
    assert_eq!(code, Some(0));
    assert!(out.contains("vgpud_gpu_memory_bytes"), "{out}");
    // Refusals name the field; --json prints the error body.
    let (code, _, err) = ctl(&[
        "--json",
        "vgpu",
        "create",
        "--gpu",
        "0",
        "--memory",
        "1G",
        "--compute",
        "60%",
    ]);
    assert_eq!(code, Some(1));
    assert!(
        err.contains("\"field\":\"compute_share\"") && err.contains("at most 50.0% is left"),
        "{err}"
    );
    let (code, _, err) = ctl(&["vgpu", "migrate", &id, "--target-gpu", "7"]);
    assert_eq!(code, Some(1));
    assert!(err.contains("there is no GPU 7"), "{err}");
    let (code, _, err) = ctl(&[
        "vm",
        "launch",
        "--payload",
        "/nonexistent.elf",
        "--vgpu",
        &id,
    ]);
    assert_eq!(code, Some(1));
    assert!(err.contains("--payload: "), "{err}");
    let (code, _, err) = ctl(&["vm", "show", "42"]);
    assert_eq!(code, Some(1));
    assert!(err.contains("404") && err.contains("no VM 42"), "{err}");
    let (code, out, err) = ctl(&["vgpu", "delete", &id]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("deleted"), "{out}");
    // No daemon: a clear message and exit code 3.
    let out = std::process::Command::new(vgpu_tests::bins::binary("vgpuctl"))
        .args(["--socket", "/nonexistent/vgpud.sock", "gpus"])
        .output()
        .expect("vgpuctl");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{err}");
    assert!(
        err.contains("vgpud is not running at /nonexistent/vgpud.sock"),
        "{err}"
    );
}

#[test]
fn the_demo_runs_and_cleans_up() {
    require_kvm!();
    let dir = temp_dir("demo");
    let plot = dir.join("u.png");
    for bin in ["vgpud", "vgpu-worker", "vmm"] {
        vgpu_tests::bins::binary(bin);
    }
    // Without CARGO in its environment the demo uses the binaries beside it as they are.
    let out = std::process::Command::new(vgpu_tests::bins::binary("vgpu-demo"))
        .env_remove("CARGO")
        .args([
            "--rounds",
            "60",
            "--spin-us",
            "2000",
            "--max-seconds",
            "60",
            "--plot",
        ])
        .arg(&plot)
        .stdin(Stdio::null())
        .output()
        .expect("vgpu-demo");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{text}\n{err}");
    assert_eq!(text.matches("GPU-LOAD OK rounds=60").count(), 2, "{text}");
    assert!(
        text.contains("0 left-over processes, state directory removed"),
        "{text}"
    );
    let png = std::fs::read(&plot).expect("the plot");
    assert!(
        png.starts_with(b"\x89PNG\r\n\x1a\n") && png.len() > 10_000,
        "not a plot"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
