//! `tests/c/driverapi.c` built with `cc` against include/cuda.h and linked with `-lcuda`,
//! run with the library installed as libcuda.so.1 against a sim worker: the structs of
//! the header (`CUDA_MEMCPY2D`, `CUDA_MEMCPY3D`, `CUlaunchConfig`, `CUmemPoolProps`) as
//! a C compiler lays them out, through the calls that take them. Skipped, saying so,
//! where no C compiler is present.

mod common;

use std::path::Path;
use std::process::Command;

#[test]
fn a_c_program_uses_the_framework_driver_api() {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    if Command::new(&cc).arg("--version").output().is_err() {
        eprintln!("skipped: no C compiler ({cc}) on this machine");
        return;
    }
    let lib = common::library();
    let prefix = std::env::temp_dir().join(format!("vgpu-cuda-capi-{}", std::process::id()));
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
    let exe = prefix.join("driverapi");
    let out = Command::new(&cc)
        .arg("-std=c11")
        .arg("-Wall")
        .arg("-Werror")
        .arg("-I")
        .arg(manifest.join("include"))
        .arg(manifest.join("tests/c/driverapi.c"))
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
    let worker = common::Worker::sim("c-driverapi", "256M", 4);
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
    let _ = std::fs::remove_dir_all(&prefix);
}
