//! A tenant's view of a process vGPU (docs/tenants.md): the same CUDA program run again
//! and again on one vGPU, each run right after the last exits, is served every time (the
//! library waits for the fresh worker vgpud starts after each exit); a process that may
//! not use the socket, and one on a deleted vGPU, are told why in their terms.

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use vgpu_api::api::{Attach, VgpuCreate, VgpuState};
use vgpu_api::client::Client;
use vgpu_tests::bins::profile_dir;
use vgpu_tests::daemon::TestDaemon;

/// The built CUDA library (`libvgpu_cuda.so`), built when missing.
fn library() -> PathBuf {
    static BUILD: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = BUILD.lock().unwrap_or_else(|p| p.into_inner());
    let path = profile_dir().join("libvgpu_cuda.so");
    if !path.exists() {
        let manifest = concat!(env!("CARGO_MANIFEST_DIR"), "/../Cargo.toml");
        let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
        cmd.args(["build", "--quiet", "--manifest-path", manifest])
            .args(["-p", "vgpu-cuda", "--lib"]);
        if profile_dir().ends_with("release") {
            cmd.arg("--release");
        }
        let status = cmd.status();
        assert!(
            matches!(status, Ok(s) if s.success()),
            "cannot build vgpu-cuda: {status:?}"
        );
    }
    path
}

/// A process vGPU on GPU 0 owned by `uid`/`gid`.
fn process_vgpu(uid: u32, gid: u32) -> VgpuCreate {
    VgpuCreate {
        gpu: Some(0),
        queues: 2,
        attach: Attach::Process,
        owner_uid: Some(uid),
        owner_gid: Some(gid),
        ..VgpuCreate::new(64 << 20, 0.5)
    }
}

/// This test's uid and gid.
fn own_ids() -> (u32, u32) {
    // SAFETY: getuid and getgid have no preconditions and cannot fail.
    unsafe { (libc::getuid(), libc::getgid()) }
}

/// One short run of the CUDA program on `socket`, as a tenant starts it: no waiting for
/// anything first.
fn run_once(socket: &str, env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_vgpu-cuda-loop"));
    cmd.arg(library())
        .args([
            "--secs",
            "0.02",
            "--spins",
            "1",
            "--spin-us",
            "50",
            "--n",
            "256",
        ])
        .env("VGPU_SOCKET", socket)
        .stdin(Stdio::null());
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("run vgpu-cuda-loop")
}

fn wait_ready(c: &Client, id: u32) {
    let end = Instant::now() + Duration::from_secs(20);
    loop {
        let v = c.vgpu(id).expect("vgpu");
        if v.state == VgpuState::Ready {
            return;
        }
        assert!(
            Instant::now() < end,
            "vGPU {id} is {:?}, not ready",
            v.state
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn fifty_back_to_back_runs_on_one_process_vgpu_all_succeed() {
    let d = TestDaemon::start("tenant-runs", &["--sim-gpus", "1"]);
    let (uid, gid) = own_ids();
    let v = d
        .client
        .create_vgpu(&process_vgpu(uid, gid))
        .expect("create");
    wait_ready(&d.client, v.id);
    let started = Instant::now();
    for run in 1..=50 {
        let out = run_once(&v.socket, &[]);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.contains("every result right"),
            "run {run} of 50: {:?}: {stdout}{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    eprintln!("50 runs in {:.1} s", started.elapsed().as_secs_f64());
    d.client.delete_vgpu(v.id).expect("delete");
}

#[test]
fn a_tenant_is_told_why_it_gets_no_vgpu() {
    let d = TestDaemon::start("tenant-errors", &["--sim-gpus", "1"]);
    let (uid, gid) = own_ids();
    let v = d
        .client
        .create_vgpu(&process_vgpu(uid, gid))
        .expect("create");
    wait_ready(&d.client, v.id);

    // Someone else's process: permission denied, with what to do about it. As root the
    // program runs as nobody; otherwise the socket is closed to its owner for the check.
    let socket = std::path::Path::new(&v.socket);
    let out = if uid == 0 {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_vgpu-cuda-loop"));
        std::os::unix::process::CommandExt::uid(&mut cmd, 65534);
        std::os::unix::process::CommandExt::gid(&mut cmd, 65534);
        cmd.arg(library())
            .args(["--secs", "0.02"])
            .env("VGPU_SOCKET", &v.socket)
            .stdin(Stdio::null())
            .output()
            .expect("run as nobody")
    } else {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(socket, std::fs::Permissions::from_mode(0o000)).expect("chmod");
        let out = run_once(&v.socket, &[]);
        std::fs::set_permissions(socket, std::fs::Permissions::from_mode(0o660)).expect("chmod");
        out
    };
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!out.status.success(), "{text}");
    assert!(
        text.contains("permission denied on the vGPU socket")
            && text.contains("owner_uid")
            && !text.contains("is its vgpu-worker running"),
        "{text}"
    );

    // A deleted vGPU: after the connect timeout, the socket is gone and the message says so.
    d.client.delete_vgpu(v.id).expect("delete");
    let started = Instant::now();
    let out = run_once(&v.socket, &[("VGPU_CONNECT_TIMEOUT", "1")]);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!out.status.success(), "{text}");
    assert!(started.elapsed() >= Duration::from_secs(1), "it waited");
    assert!(
        text.contains("no vGPU worker answers on")
            && text.contains("the vGPU was deleted")
            && text.contains("CUDA_ERROR_NO_DEVICE"),
        "{text}"
    );
}
