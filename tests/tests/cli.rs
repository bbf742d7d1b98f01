//! The real vgpuctl against a real vgpud (sim GPUs): outputs and exit codes of every
//! command group, the error cases in CLI terms, and vgpud's operator checks at start.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use vgpu_tests::daemon::{temp_dir, vgpud_command, TestDaemon};

/// Runs vgpuctl on `socket`: exit code, stdout, stderr.
fn ctl(socket: &Path, args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new(vgpu_tests::bins::binary("vgpuctl"))
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
fn every_command_group_and_errors_in_cli_terms() {
    let d = TestDaemon::start("cli", &["--sim-gpus", "2", "--sim-memory", "1G"]);
    let ctl = |args: &[&str]| ctl(&d.socket, args);

    // Payloads with their arguments.
    let (code, out, err) = ctl(&["payload", "list"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.contains("gpu-load") && out.contains("rounds=<n>"),
        "{out}"
    );
    assert!(out.contains("hello") && out.contains("exit=<n>"), "{out}");
    let (code, out, _) = ctl(&["payload", "show", "memcheck"]);
    assert_eq!(code, Some(0));
    assert!(
        out.contains("size_mib=<m>") && out.contains("MEMCHECK OK"),
        "{out}"
    );
    let (code, _, err) = ctl(&["payload", "show", "nope"]);
    assert_eq!(code, Some(1));
    assert!(err.contains("payload list"), "{err}");

    // The host-wide views.
    for (args, says) in [
        (&["shm", "list"][..], "KEY"),
        (&["rebalancer", "status"][..], "mode off"),
        (&["rebalancer", "events"][..], "KIND"),
        (&["migration", "list"][..], "PHASE"),
        (&["openapi"][..], "/v1/payloads"),
        (&["gpus"][..], "vgpu-sim-1"),
    ] {
        let (code, out, err) = ctl(args);
        assert_eq!(code, Some(0), "{args:?}: {err}");
        assert!(out.contains(says), "{args:?}: {out}");
    }

    // Errors name the flag the user typed, not the API field.
    let (code, _, err) = ctl(&["vm", "launch", "--payload", "hello", "--ram", "8"]);
    assert_eq!(code, Some(1));
    assert!(
        err.contains("--ram: ") && !err.contains("memory_bytes"),
        "{err}"
    );
    let (code, _, err) = ctl(&["vm", "launch", "--payload", "/etc/passwd"]);
    assert_eq!(code, Some(1));
    assert!(
        err.contains("--payload: ") && err.contains("outside --payload-dir"),
        "{err}"
    );
    let (code, _, err) = ctl(&["vgpu", "create", "--memory", "0", "--compute", "0.1"]);
    assert_eq!(code, Some(1));
    assert!(err.contains("--memory: "), "{err}");
    let (code, _, err) = ctl(&["vm", "launch", "--payload", "hello", "--share-group", "g"]);
    assert_eq!(code, Some(1));
    assert!(err.contains("--share-group describes a new vGPU"), "{err}");
    let (code, _, err) = ctl(&["migration", "show", "77"]);
    assert_eq!(code, Some(1));
    assert!(
        err.contains("404") && err.contains("no migration 77"),
        "{err}"
    );

    // `vgpu set --compute` alone leaves the copy share and says so; a launch that the
    // copy share refuses names --copy.
    let (code, out, err) = ctl(&[
        "vgpu",
        "create",
        "--gpu",
        "0",
        "--memory",
        "256M",
        "--compute",
        "70%",
    ]);
    assert_eq!(code, Some(0), "{err}");
    let id = first_id(&out);
    let (code, out, err) = ctl(&["vgpu", "set", &id, "--compute", "50%"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("50.0%") && out.contains("70.0%"), "{out}");
    assert!(
        err.contains("copy share stays at 70.0%") && err.contains("--copy"),
        "{err}"
    );
    let (code, _, err) = ctl(&[
        "vm",
        "launch",
        "--payload",
        "hello",
        "--gpu",
        "0",
        "--memory",
        "128M",
        "--compute",
        "50%",
    ]);
    assert_eq!(code, Some(1));
    assert!(
        err.contains("--copy: ") && err.contains("at most 30.0% is left"),
        "{err}"
    );

    // Stats and top show resident and swapped memory.
    let (code, out, err) = ctl(&["vgpu", "stats", &id]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("RESIDENT") && out.contains("SWAPPED"), "{out}");
    let (code, out, err) = ctl(&["top", "--count", "1"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.contains("RESIDENT") && out.contains("promised 256.0 MiB"),
        "{out}"
    );

    // A migration: its phases with bytes on stderr, the placement, and exit 4 when the
    // pause was longer than asked.
    let (code, out, err) = ctl(&[
        "vgpu",
        "migrate",
        &id,
        "--target-gpu",
        "1",
        "--mode",
        "stop_copy",
        "--max-downtime-ms",
        "1",
    ]);
    let moved = format!("vGPU {id} now runs on GPU 1");
    assert!(
        out.contains("moved from GPU 0 to GPU 1") && out.contains(&moved),
        "{out}\n{err}"
    );
    match code {
        Some(4) => assert!(err.contains("longer than --max-downtime-ms 1"), "{err}"),
        Some(0) => assert!(!err.contains("warning"), "{err}"),
        other => panic!("vgpu migrate exited {other:?}: {err}"),
    }
    let (code, out, err) = ctl(&["migration", "show", "1"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.contains("completed") && out.contains("stop_copy"),
        "{out}"
    );
    let (code, out, err) = ctl(&["migration", "watch", "1"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("moved from GPU 0 to GPU 1"), "{out}");
    let (code, _, err) = ctl(&["vgpu", "migrate", &id, "--mode", "fast"]);
    assert_eq!(code, Some(2), "{err}");

    // Oversubscribed memory counts in top's header though it reserves nothing.
    let (code, _, err) = ctl(&[
        "vgpu",
        "create",
        "--gpu",
        "0",
        "--memory",
        "768M",
        "--compute",
        "10%",
        "--oversubscribe",
    ]);
    assert_eq!(code, Some(0), "{err}");
    let (code, out, err) = ctl(&["top", "--count", "1"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.contains("promised 768.0 MiB (0 B reserved by hard shares, 768.0 MiB oversubscribed)"),
        "{out}"
    );
    let (code, out, err) = ctl(&["gpus"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("OVERSUB RESIDENT/POOL"), "{out}");
}

#[test]
fn a_tcp_vgpud_without_the_token_tells_the_cli_flag() {
    let dir = temp_dir("cli-token");
    let token_file = dir.join("token");
    std::fs::write(&token_file, "cli-token-0123456789abcdef\n").expect("token");
    // World-readable: refused at start, naming the file and chmod 600.
    let out = vgpud_command(&[
        "--listen",
        "127.0.0.1:0",
        "--token-file",
        &token_file.display().to_string(),
        "--state-dir",
        &dir.join("s").display().to_string(),
    ])
    .output()
    .expect("vgpud");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("chmod 600") && err.contains("token"), "{err}");

    std::fs::set_permissions(
        &token_file,
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .expect("chmod");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port();
    let addr = format!("127.0.0.1:{port}");
    let state = dir.join("state");
    let mut child = vgpud_command(&[
        "--listen",
        &addr,
        "--token-file",
        &token_file.display().to_string(),
        "--state-dir",
        &state.display().to_string(),
        "--sim-gpus",
        "1",
    ])
    .stderr(std::process::Stdio::null())
    .spawn()
    .expect("vgpud");
    let url = format!("http://{addr}");
    let run = |token: bool| {
        let mut c = Command::new(vgpu_tests::bins::binary("vgpuctl"));
        c.args(["--url", &url]).env_remove("VGPUD_TOKEN_FILE");
        if token {
            c.arg("--token-file").arg(&token_file);
        }
        c.arg("gpus").output().expect("vgpuctl")
    };
    let mut served = false;
    for _ in 0..200 {
        if run(true).status.success() {
            served = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = run(false);
    let _ = child.kill();
    let _ = child.wait();
    assert!(served, "vgpud did not serve on {addr}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("pass --token-file FILE"), "{err}");
    // The state directory is private.
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(&state).expect("state dir").permissions(),
    );
    assert_eq!(mode & 0o777, 0o700);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn vgpud_refuses_bad_operator_settings_and_reads_a_config_file() {
    let dir = temp_dir("cli-config");
    let state = dir.join("state").display().to_string();
    for (args, says) in [
        (vec!["--sim-memory", "8"], "at least 64M"),
        (
            vec!["--payload-dir", "/nonexistent/payloads"],
            "no such directory",
        ),
        (
            vec!["--storage-root", "/nonexistent/storage"],
            "no such directory",
        ),
    ] {
        let mut all = args.clone();
        all.extend(["--state-dir", state.as_str()]);
        let out = vgpud_command(&all).output().expect("vgpud");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} accepted");
        assert!(err.contains(says), "{args:?}: {err}");
    }
    let cfg = dir.join("vgpud.json");
    std::fs::write(&cfg, r#"{"sim-gpus": 3, "bogus-key": 1}"#).expect("config");
    let out = vgpud_command(&["--config", &cfg.display().to_string()])
        .output()
        .expect("vgpud");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("\"bogus-key\""),
        "{err}"
    );

    // A good file; the command line overrides it.
    std::fs::write(
        &cfg,
        r#"{"sim-gpus": 3, "sim-memory": "512M", "log-format": "json"}"#,
    )
    .expect("config");
    let c = cfg.display().to_string();
    let d = TestDaemon::start_in(&dir, &["--config", &c, "--sim-memory", "256M"]);
    let (code, out, err) = ctl(&d.socket, &["gpus"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.contains("vgpu-sim-2") && out.contains("256.0 MiB"),
        "{out}"
    );
    assert!(
        d.log_text()
            .lines()
            .any(|l| l.starts_with('{') && l.contains("\"level\"")),
        "not JSON logs:\n{}",
        d.log_text()
    );
}

#[test]
fn vm_wait_after_a_vgpud_restart_has_its_own_exit_code() {
    if !vgpu_tests::bins::have_kvm() {
        eprintln!("skipped: no /dev/kvm");
        return;
    }
    let mut d = TestDaemon::start("cli-restart", &["--sim-gpus", "1", "--sim-memory", "1G"]);
    let (code, out, err) = ctl(
        &d.socket,
        &[
            "vm",
            "launch",
            "--payload",
            "gpu-load",
            "--arg",
            "rounds=100000",
            "--memory",
            "128M",
            "--compute",
            "20%",
        ],
    );
    assert_eq!(code, Some(0), "{err}");
    let vm = first_id(&out);
    assert!(d.stop(), "vgpud did not stop");
    // A restart leaves running VMs alone; the VM's vmm dying while no vgpud runs is what
    // the new vgpud reports as lost in the restart.
    let state: serde_json::Value =
        serde_json::from_slice(&std::fs::read(d.dir.join("vgpud-state.json")).expect("state file"))
            .expect("state file JSON");
    let pid = state["vms"][0]["vmm"]["pid"]
        .as_u64()
        .and_then(|p| i32::try_from(p).ok())
        .expect("the running vmm's pid in the state file");
    // SAFETY: kill(2) on the pid the state file names, the test's own VM.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    let gone = std::time::Instant::now();
    while vgpu_tests::daemon::alive(pid as u32) && gone.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(20));
    }
    d.restart(None);
    let (code, out, err) = ctl(&d.socket, &["vm", "wait", &vm, "--timeout-s", "10"]);
    assert_eq!(code, Some(123), "{out}\n{err}");
    assert!(err.contains("gone when vgpud restarted"), "{err}");
}
