//! The NVML calls frameworks make (tests/py/frameworks.py: PyTorch's NVML-based device
//! count and UUID through ctypes, and pynvml's memory, process and utilization queries, as
//! torch.cuda's helpers make them) on the installed libraries against a sim worker.
//! Needs NVIDIA's nvidia-ml-py, which `ci/fetch-pynvml.sh` (run by `ci/setup.sh`) puts in
//! target/pynvml/; skipped, saying so, without it or without python3.

use std::path::{Path, PathBuf};
use std::process::Command;

use vgpu_tests::worker::Worker;

mod common;

/// Where `ci/fetch-pynvml.sh` put pynvml.py (`VGPU_PYNVML_DIR` overrides, as there).
fn pynvml_dir() -> PathBuf {
    match std::env::var_os("VGPU_PYNVML_DIR") {
        Some(d) => PathBuf::from(d),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/pynvml"),
    }
}

#[test]
fn framework_nvml_calls_see_the_vgpu() {
    let dir = pynvml_dir();
    if !dir.join("pynvml.py").is_file() {
        eprintln!(
            "skipped: no pynvml.py in {} (ci/fetch-pynvml.sh fetches it)",
            dir.display()
        );
        return;
    }
    if Command::new("python3").arg("--version").output().is_err() {
        eprintln!("skipped: no python3 on this machine");
        return;
    }
    let libdir = common::libdir();
    let worker = Worker::sim("pynvml", "256M", 2);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/py/frameworks.py");
    let out = Command::new("python3")
        .arg(&script)
        .arg((256u64 << 20).to_string())
        .env("PYTHONPATH", &dir)
        .env("LD_LIBRARY_PATH", libdir)
        .env("VGPU_SOCKET", &worker.socket)
        .output()
        .expect("run python3");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.trim() == "ok",
        "the framework calls failed: {stdout}{stderr}"
    );
}
