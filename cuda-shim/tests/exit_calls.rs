//! Driver calls from a thread's exit path (`tests/c/exit_calls.c`), after the thread's own
//! locals were destroyed, as the CUDA runtime's and cuBLAS's exit handlers make them: each
//! answers a CUDA result and the program exits normally, never aborted by a panic that
//! cannot unwind, and without a panic message. Skipped, saying so, without a C compiler.

mod common;

use std::path::Path;
use std::process::Command;

#[test]
fn calls_from_a_threads_exit_path_answer_and_never_abort() {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    if Command::new(&cc).arg("--version").output().is_err() {
        eprintln!("skipped: no C compiler ({cc}) on this machine");
        return;
    }
    let prefix = std::env::temp_dir().join(format!("vgpu-cuda-exit-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&prefix);
    let out = Command::new(env!("CARGO_BIN_EXE_vgpu-cuda"))
        .arg("install")
        .arg("--prefix")
        .arg(&prefix)
        .arg("--lib")
        .arg(common::library())
        .output()
        .expect("run vgpu-cuda install");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let libdir = prefix.join("lib");
    let exe = prefix.join("exit_calls");
    let out = Command::new(&cc)
        .args(["-std=c11", "-Wall", "-Werror", "-I"])
        .arg(manifest.join("include"))
        .arg(manifest.join("tests/c/exit_calls.c"))
        .arg("-o")
        .arg(&exe)
        .arg("-L")
        .arg(&libdir)
        .args(["-lcuda", "-lpthread"])
        .output()
        .expect("run cc");
    assert!(
        out.status.success(),
        "cc: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let worker = common::Worker::sim("exit-calls", "64M", 1);
    let out = Command::new(&exe)
        .env("VGPU_SOCKET", &worker.socket)
        .env("LD_LIBRARY_PATH", &libdir)
        .env("VGPU_CUDA_LOG", "debug")
        .output()
        .expect("run the C program");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.trim() == "ok",
        "{}: {stdout}{stderr}",
        out.status
    );
    // The calls made after the thread's locals were gone log nothing and panic nowhere.
    assert!(!stderr.contains("panicked"), "{stderr}");
    let _ = std::fs::remove_dir_all(&prefix);
}
