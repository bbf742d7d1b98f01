//! A sim `vgpu-worker` for one test, killed when dropped, and the paths of the built
//! programs and library.

#![allow(dead_code)]

#[macro_use]
pub mod cuda;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The target profile directory of the running test (`target/debug` or `target/release`).
pub fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap_or_default();
    let mut dir = exe.parent().map(PathBuf::from).unwrap_or_default();
    if dir.ends_with("deps") {
        dir.pop();
    }
    dir
}

/// Builds `-p package` (its `--bin bin` when given); with `only_missing`, only when
/// `path` does not exist.
fn ensure_built(path: &Path, package: &str, bin: Option<&str>, only_missing: bool) {
    static BUILD: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = BUILD.lock().unwrap_or_else(|p| p.into_inner());
    if only_missing && path.exists() {
        return;
    }
    let manifest = concat!(env!("CARGO_MANIFEST_DIR"), "/../Cargo.toml");
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cmd.args([
        "build",
        "--quiet",
        "--manifest-path",
        manifest,
        "-p",
        package,
    ]);
    if let Some(bin) = bin {
        cmd.args(["--bin", bin]);
    } else {
        cmd.arg("--lib");
    }
    if profile_dir().ends_with("release") {
        cmd.arg("--release");
    }
    let status = cmd.status();
    assert!(
        matches!(status, Ok(s) if s.success()),
        "cannot build {package}: {status:?}"
    );
}

/// The package that builds `vgpu-worker`: its own crate where the workspace has one, else
/// vgpud.
fn worker_package() -> &'static str {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    if root.join("vgpu-worker/Cargo.toml").is_file() {
        "vgpu-worker"
    } else {
        "vgpud"
    }
}

/// The `vgpu-worker` program, built when missing.
pub fn worker_binary() -> PathBuf {
    let path = profile_dir().join("vgpu-worker");
    ensure_built(&path, worker_package(), Some("vgpu-worker"), true);
    path
}

/// The built library (`libvgpu_cuda.so`), brought up to date first (`cargo test` builds
/// the library only as the rlib the tests link).
pub fn library() -> PathBuf {
    let path = profile_dir().join("libvgpu_cuda.so");
    ensure_built(&path, "vgpu-cuda", None, false);
    path
}

pub struct Worker {
    child: Child,
    pub socket: PathBuf,
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.socket);
    }
}

impl Worker {
    /// Starts a sim worker (`memory` of device memory, `queues` queues) and waits for its
    /// socket.
    pub fn start(name: &str, memory: &str, queues: u16) -> Worker {
        let socket =
            std::env::temp_dir().join(format!("vgpu-cuda-test-{}-{name}.sock", std::process::id()));
        let _ = std::fs::remove_file(&socket);
        let child = Command::new(worker_binary())
            .args(["--backend", "sim", "--vgpu-id", "0"])
            .args(["--memory", memory, "--queues", &queues.to_string()])
            .arg("--socket")
            .arg(&socket)
            .env(
                "RUST_LOG",
                std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start vgpu-worker");
        let mut w = Worker { child, socket };
        let start = Instant::now();
        while !w.socket.exists() {
            if let Ok(Some(status)) = w.child.try_wait() {
                let mut out = String::new();
                if let Some(e) = w.child.stderr.as_mut() {
                    let _ = e.read_to_string(&mut out);
                }
                panic!("the worker exited with {status}: {out}");
            }
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "the worker did not bind {} in 60 s",
                w.socket.display()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        w
    }
}
