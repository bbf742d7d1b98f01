//! The whole stack on a real GPU: `vgpu-worker --backend cuda` + `vmm` + payload guests
//! under KVM, every request going guest -> virtqueue -> vhost-user -> cuda backend -> GPU.
//!
//! Skips (saying why) where there is no KVM or no usable CUDA GPU (the worker cannot open
//! one); `VGPU_REQUIRE_CUDA=1` turns a skip into a failure, so a run on the GPU machine
//! cannot pass by skipping. On the GPU machine (no cargo) run the prebuilt test binary from
//! a `release/deps` folder beside `release/vmm` and `release/vgpu-worker`, with
//! `VGPU_PAYLOAD_DIR` pointing at prebuilt payloads (docs/cuda.md).
//!
//! `gpu_copy_sweep` (ignored by default) is the guest side of the CUDA backend benchmark:
//! vecadd's copy bandwidth for buffers of 4 KiB to 256 MiB, one VM per size.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use vgpu_tests::bins::{binary, payload};
use vgpu_tests::require_kvm;
use vgpu_tests::run::run_payload;

const DEADLINE: Duration = Duration::from_secs(120);

/// A `vgpu-worker --backend cuda` serving one socket; killed when dropped.
struct Worker {
    child: Child,
    socket: PathBuf,
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.socket);
    }
}

impl Worker {
    /// Everything the worker printed (after it exited).
    fn output(mut self) -> String {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let mut s = String::new();
        if let Some(e) = self.child.stderr.as_mut() {
            let _ = e.read_to_string(&mut s);
        }
        s
    }
}

fn require_cuda() -> bool {
    std::env::var_os("VGPU_REQUIRE_CUDA").is_some()
}

/// Starts a cuda worker with `memory` bytes and `queues` queues; None (after saying why)
/// when this machine has no usable GPU.
fn cuda_worker(name: &str, memory: &str, queues: u16) -> Option<Worker> {
    let socket =
        std::env::temp_dir().join(format!("vgpu-gpu-test-{}-{name}.sock", std::process::id()));
    let _ = std::fs::remove_file(&socket);
    let child = Command::new(binary("vgpu-worker"))
        .args(["--backend", "cuda", "--gpu", "0", "--vgpu-id", "1"])
        .args(["--memory", memory, "--queues", &queues.to_string()])
        .arg("--socket")
        .arg(&socket)
        .env(
            "RUST_LOG",
            std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into()),
        )
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("cannot start vgpu-worker");
    let mut w = Worker { child, socket };
    let start = Instant::now();
    while !w.socket.exists() {
        if let Ok(Some(status)) = w.child.try_wait() {
            let out = w.output();
            assert!(
                !require_cuda(),
                "VGPU_REQUIRE_CUDA is set but the cuda worker exited ({status}): {out}"
            );
            eprintln!(
                "SKIPPED: no usable CUDA GPU: the cuda worker exited with {status}: {}",
                out.trim()
            );
            return None;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the cuda worker did not bind {} in 60 s",
            w.socket.display()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    Some(w)
}

fn vgpu_arg(socket: &Path) -> String {
    format!("socket={}", socket.display())
}

/// Runs payload `name` with `arg` against a fresh cuda worker of `queues` queues; returns
/// the guest's output and the worker's log, or None when skipped.
fn on_gpu(name: &str, queues: u16, arg: &str, ok_line: &str) -> Option<(String, String)> {
    let w = cuda_worker(name, "1G", queues)?;
    let out = run_payload(
        &payload(name),
        &[
            "--memory",
            "512M",
            "--vgpu",
            &vgpu_arg(&w.socket),
            "--payload-arg",
            arg,
        ],
        DEADLINE,
    );
    let log = w.output();
    assert_eq!(out.code, Some(0), "{name}: {out:?}\nworker:\n{log}");
    assert!(out.stdout.contains(ok_line), "{name}: {out:?}");
    println!("{}", out.stdout);
    assert!(
        log.contains("guest memory pinned for direct copies"),
        "{name}: the worker did not pin guest RAM: {log}"
    );
    Some((out.stdout, log))
}

#[test]
fn vecadd_passes_on_the_gpu() {
    require_kvm!();
    if let Some((out, _)) = on_gpu("vecadd", 2, "n=1000003 iters=2000", "VECADD OK") {
        assert!(
            out.contains("backend 1"),
            "the guest did not see a cuda vGPU: {out}"
        );
    }
}

#[test]
fn streams_pass_on_the_gpu() {
    require_kvm!();
    on_gpu("streams", 4, "streams=4", "STREAMS OK");
}

#[test]
fn hostile_guest_is_refused_on_the_gpu() {
    require_kvm!();
    on_gpu("hostile", 2, "", "HOSTILE OK");
}

#[test]
#[ignore = "benchmark: run on the GPU machine (docs/cuda.md)"]
fn gpu_copy_sweep() {
    require_kvm!();
    for (n, label) in [
        (1usize << 10, "4KiB"),
        (1 << 14, "64KiB"),
        (1 << 18, "1MiB"),
        (1 << 22, "16MiB"),
        (1 << 24, "64MiB"),
        (1 << 26, "256MiB"),
    ] {
        let Some(w) = cuda_worker(label, "4G", 1) else {
            return;
        };
        let out = run_payload(
            &payload("vecadd"),
            &[
                "--memory",
                "2G",
                "--vgpu",
                &vgpu_arg(&w.socket),
                "--payload-arg",
                &format!("n={n} iters=2000"),
            ],
            DEADLINE,
        );
        let log = w.output();
        assert_eq!(out.code, Some(0), "{label}: {out:?}\nworker:\n{log}");
        for line in out.stdout.lines().filter(|l| l.starts_with("BENCH")) {
            println!("GUEST {label} {line}");
        }
    }
}
