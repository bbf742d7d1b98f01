//! What an operator reads: vgpuctl's and vgpud's messages in the operator's terms (the
//! command to run, the flag to pass, the payloads there are), `vgpuctl top` across a vgpud
//! restart in a narrow terminal, and `vm stats` by a VM's name. Each test runs the real
//! programs on sim GPUs.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use vgpu_tests::daemon::{temp_dir, vgpud_command, TestDaemon};

/// Runs vgpuctl on `socket` with `env` added: exit code, stdout, stderr.
fn ctl_env(socket: &Path, args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String, String) {
    let mut cmd = Command::new(vgpu_tests::bins::binary("vgpuctl"));
    cmd.arg("--socket")
        .arg(socket)
        .args(args)
        .env_remove("VGPUD_URL")
        .env_remove("VGPUD_SOCKET")
        .env_remove("VGPUD_TOKEN_FILE");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("vgpuctl");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn ctl(socket: &Path, args: &[&str]) -> (Option<i32>, String, String) {
    ctl_env(socket, args, &[])
}

/// The first column of the first data row of a table.
fn first_id(table: &str) -> String {
    table
        .lines()
        .nth(1)
        .and_then(|l| l.split_whitespace().next())
        .unwrap_or_default()
        .to_owned()
}

#[test]
fn messages_name_the_command_the_flag_and_the_choices() {
    let d = TestDaemon::start("op-messages", &["--sim-gpus", "1"]);
    let ctl = |args: &[&str]| ctl(&d.socket, args);

    // A mistyped payload: the one meant and the ones there are.
    let (code, _, err) = ctl(&[
        "vm",
        "launch",
        "--payload",
        "vecad",
        "--memory",
        "64M",
        "--compute",
        "0.1",
    ]);
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("did you mean \"vecadd\"?")
            && err.contains("gpu-load")
            && err.contains("hello"),
        "{err}"
    );

    // "8GB" is not silently 8 GiB.
    let (code, _, err) = ctl(&["vgpu", "create", "--memory", "8GB", "--compute", "0.1"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("write 8G or 8GiB"), "{err}");

    // --to over TCP without the destination's token names --to-token-file.
    let (code, _, err) = ctl(&["vm", "migrate", "1", "--to", "http://127.0.0.1:9"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("pass --to-token-file FILE"), "{err}");
    assert!(!err.contains("pass --token-file"), "{err}");

    // VGPUD_SOCKET in the environment does not conflict with --url.
    let out = Command::new(vgpu_tests::bins::binary("vgpuctl"))
        .args(["--url", "http://127.0.0.1:9", "gpus"])
        .env("VGPUD_SOCKET", &d.socket)
        .env_remove("VGPUD_TOKEN_FILE")
        .output()
        .expect("vgpuctl");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{err}");
    assert!(
        err.contains("http://127.0.0.1:9") && !err.contains("cannot be used with"),
        "{err}"
    );

    // Not running: how to start it, in both worlds.
    let (code, _, err) = ctl_env(Path::new("/nonexistent/vgpud.sock"), &["gpus"], &[]);
    assert_eq!(code, Some(3), "{err}");
    assert!(err.contains("systemctl start vgpud"), "{err}");
}

#[test]
fn a_vm_that_fails_shows_why_and_its_vgpu_is_found_by_its_name() {
    vgpu_tests::require_kvm!();
    let d = TestDaemon::start("op-vm", &["--sim-gpus", "1"]);
    let ctl = |args: &[&str]| ctl(&d.socket, args);

    // --wait on a guest that exits 2: the end of its console says why.
    let (code, _, err) = ctl(&[
        "vm",
        "launch",
        "--payload",
        "hello",
        "--arg",
        "exit=2",
        "--wait",
    ]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("exited with code 2; the end of its console")
            && err.contains("| args: exit=2"),
        "{err}"
    );

    // A VM by its name: its vGPU's stats (vm stats, vgpu stats NAME); a vGPU in use: the
    // command that frees it.
    let (code, out, err) = ctl(&[
        "vm",
        "launch",
        "--payload",
        "gpu-load",
        "--arg",
        "rounds=100000 spin_us=1000",
        "--memory",
        "64M",
        "--compute",
        "0.2",
        "--name",
        "trainer",
    ]);
    assert_eq!(code, Some(0), "{err}");
    let vm = first_id(&out);
    let (code, out, err) = ctl(&["vm", "stats", "trainer"]);
    assert_eq!(code, Some(0), "{err}");
    let vgpu = first_id(&out);
    assert!(vgpu.parse::<u32>().is_ok(), "{out}");
    let (code, out2, err) = ctl(&["vgpu", "stats", "trainer"]);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(first_id(&out2), vgpu, "{out2}");
    let (code, _, err) = ctl(&["vgpu", "delete", &vgpu]);
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains(&format!("`vgpuctl vm delete {vm}` first")),
        "{err}"
    );
    assert!(!err.contains("/v1/"), "{err}");
    let (code, _, err) = ctl(&["vm", "stats", "nobody"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("no VM is named \"nobody\""), "{err}");
    let (code, _, err) = ctl(&["vm", "delete", "trainer"]);
    assert_eq!(code, Some(0), "{err}");
}

#[test]
fn top_rides_out_a_vgpud_restart_in_a_narrow_terminal() {
    let mut d = TestDaemon::start("op-top", &["--sim-gpus", "1"]);
    let (uid, gid) = (
        // SAFETY: getuid and getgid have no preconditions and cannot fail.
        unsafe { libc::getuid() },
        // SAFETY: as above.
        unsafe { libc::getgid() },
    );
    let (code, _, err) = ctl(
        &d.socket,
        &[
            "vgpu",
            "create",
            "--attach",
            "process",
            "--memory",
            "64M",
            "--compute",
            "0.1",
            "--owner-uid",
            &uid.to_string(),
            "--owner-gid",
            &gid.to_string(),
            "--name",
            "tenant-a",
        ],
    );
    assert_eq!(code, Some(0), "{err}");
    let top = Command::new(vgpu_tests::bins::binary("vgpuctl"))
        .arg("--socket")
        .arg(&d.socket)
        .args(["top", "--interval-ms", "100", "--count", "40"])
        .env("COLUMNS", "60")
        .env_remove("VGPUD_URL")
        .env_remove("VGPUD_SOCKET")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("vgpuctl top");
    std::thread::sleep(Duration::from_millis(800));
    assert!(d.stop(), "vgpud stops on SIGTERM");
    std::thread::sleep(Duration::from_millis(800));
    d.restart(None);
    let out = top.wait_with_output().expect("top");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "top exited over the restart: {stderr}\n{stdout}"
    );
    let away = stdout
        .find("does not answer")
        .unwrap_or_else(|| panic!("top says vgpud is away: {stdout}"));
    assert!(
        stdout[away..].contains("VGPU"),
        "top shows the table again after the restart: {stdout}"
    );
    for col in ["VM", "STATE", "OWNER"] {
        assert!(stdout.contains(col), "{col}: {stdout}");
    }
    assert!(
        stdout.contains("process") && stdout.contains(&format!("{uid}:{gid}")),
        "{stdout}"
    );
    let wide: Vec<&str> = stdout.lines().filter(|l| l.chars().count() > 60).collect();
    assert!(wide.is_empty(), "lines wider than COLUMNS=60: {wide:?}");
}

#[test]
fn vgpud_names_the_missing_program_and_logs_json_without_placeholders() {
    let dir = temp_dir("op-vgpud");
    let out = vgpud_command(&[
        "--socket",
        &dir.join("v.sock").display().to_string(),
        "--worker-bin",
        "/nonexistent/vgpu-worker",
    ])
    .output()
    .expect("vgpud");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("vgpu-worker not found at /nonexistent/vgpu-worker")
            && err.contains("`cargo build -p vgpu-worker`")
            && err.contains("--worker-bin"),
        "{err}"
    );
    assert!(!err.contains("-p vgpud --bin vgpu-worker"), "{err}");

    let out = vgpud_command(&[
        "--socket",
        &dir.join("v.sock").display().to_string(),
        "--sim-memory",
        "8GB",
    ])
    .output()
    .expect("vgpud");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("write 8G or 8GiB"), "{err}");

    let d = TestDaemon::start_with_env(
        "op-json",
        &["--sim-gpus", "1", "--log-format", "json"],
        &[("RUST_LOG", "debug")],
    );
    let r = d
        .client
        .raw("POST", "/v1/vgpus", Some(b"{not json"))
        .expect("request");
    assert_eq!(r.status, 400);
    let r = d
        .client
        .raw(
            "POST",
            "/v1/vgpus",
            Some(br#"{"memory_bytes": 0, "compute_share": 0.1}"#),
        )
        .expect("request");
    assert_eq!(r.status, 400);
    std::thread::sleep(Duration::from_millis(200));
    let log = d.log_text();
    let rejected: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("request rejected"))
        .collect();
    assert!(rejected.len() >= 2, "{log}");
    for l in &rejected {
        assert!(!l.contains("None") && !l.contains("Some("), "{l}");
    }
    assert!(
        rejected
            .iter()
            .any(|l| l.contains(r#""field":"memory_bytes""#)),
        "{rejected:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
