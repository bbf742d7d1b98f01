//! A C program built with `cc` against include/cuda.h and linked with `-lcuda`, run with
//! the library installed as libcuda.so.1 (`vgpu-cuda install`) against a sim worker.
//! Skipped, saying so, where no C compiler is present.

mod common;

use std::path::Path;
use std::process::Command;

#[test]
fn a_c_program_runs_on_the_installed_library() {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    if Command::new(&cc).arg("--version").output().is_err() {
        eprintln!("skipped: no C compiler ({cc}) on this machine");
        return;
    }
    let lib = common::library();
    let prefix = std::env::temp_dir().join(format!("vgpu-cuda-c-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&prefix);
    let out = Command::new(env!("CARGO_BIN_EXE_vgpu-cuda"))
        .arg("install")
        .arg("--prefix")
        .arg(&prefix)
        .arg("--lib")
        .arg(&lib)
        .output()
        .expect("run vgpu-cuda install");
    assert!(
        out.status.success(),
        "install: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let libdir = prefix.join("lib");
    assert!(libdir.join("libcuda.so.1").is_file());
    assert_eq!(
        std::fs::read_link(libdir.join("libcuda.so")).expect("libcuda.so link"),
        Path::new("libcuda.so.1")
    );

    let exe = prefix.join("smoke");
    let out = Command::new(&cc)
        .arg("-std=c11")
        .arg("-Wall")
        .arg("-Werror")
        .arg("-I")
        .arg(manifest.join("include"))
        .arg(manifest.join("tests/c/smoke.c"))
        .arg("-o")
        .arg(&exe)
        .arg("-L")
        .arg(&libdir)
        .arg("-lcuda")
        .output()
        .expect("run cc");
    assert!(
        out.status.success(),
        "cc: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    let worker = common::Worker::sim("c-program", "256M", 4);
    let out = Command::new(&exe)
        .env("VGPU_SOCKET", &worker.socket)
        .env("LD_LIBRARY_PATH", &libdir)
        .output()
        .expect("run the C program");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "the C program failed: {stdout}{stderr}"
    );
    assert_eq!(stdout.trim(), "ok");
    // Without a worker behind VGPU_SOCKET: no device after the connect timeout, no abort,
    // and the log says where it looked and for how long.
    let started = std::time::Instant::now();
    let out = Command::new(&exe)
        .arg("nodevice")
        .env("VGPU_SOCKET", prefix.join("no-such.sock"))
        .env("VGPU_CONNECT_TIMEOUT", "0.5")
        .env("LD_LIBRARY_PATH", &libdir)
        .output()
        .expect("run the C program");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "ok");
    assert!(
        started.elapsed() >= std::time::Duration::from_millis(500),
        "cuInit waited for a worker"
    );
    assert!(
        stderr.contains("no vGPU worker answers on")
            && stderr.contains("VGPU_CONNECT_TIMEOUT")
            && stderr.contains("the socket does not exist"),
        "{stderr}"
    );
    // Without VGPU_SOCKET, outside a VM: the message names the variable to set.
    let out = Command::new(&exe)
        .arg("nodevice")
        .env_remove("VGPU_SOCKET")
        .env("LD_LIBRARY_PATH", &libdir)
        .output()
        .expect("run the C program");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("VGPU_SOCKET is not set") && stderr.contains("docs/tenants.md"),
        "{stderr}"
    );
    // The program linked against the installed name.
    let ldd = Command::new("ldd")
        .arg(&exe)
        .env("LD_LIBRARY_PATH", &libdir)
        .output();
    if let Ok(ldd) = ldd {
        let text = String::from_utf8_lossy(&ldd.stdout);
        assert!(text.contains("libcuda.so.1"), "ldd: {text}");
    }
    let _ = std::fs::remove_dir_all(&prefix);
}
