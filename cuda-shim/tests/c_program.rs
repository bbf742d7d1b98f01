//! C programs built with `cc` against include/cuda.h and linked with `-lcuda`, run with
//! the library installed as libcuda.so.1 (`vgpu-cuda install`) against a sim worker:
//! `tests/c/smoke.c` (the basic calls, no device, the installed name) and
//! `tests/c/driverapi.c` (the structs of the header, `CUDA_MEMCPY2D`, `CUDA_MEMCPY3D`,
//! `CUlaunchConfig`, `CUmemPoolProps`, as a C compiler lays them out, through the calls
//! that take them). Skipped, saying so, where no C compiler is present.

mod common;

use std::path::Path;

use common::c::{compiler, Installed};

#[test]
fn a_c_program_runs_on_the_installed_library() {
    let Some(cc) = compiler() else { return };
    let installed = Installed::new("vgpu-cuda-c");
    let libdir = &installed.lib;
    assert!(libdir.join("libcuda.so.1").is_file());
    assert_eq!(
        std::fs::read_link(libdir.join("libcuda.so")).expect("libcuda.so link"),
        Path::new("libcuda.so.1")
    );

    let exe = installed.build(&cc, "smoke", &[]);

    let worker = common::Worker::sim("c-program", "256M", 4);
    let out = installed
        .command(&exe)
        .env("VGPU_SOCKET", &worker.socket)
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
    let out = installed
        .command(&exe)
        .arg("nodevice")
        .env("VGPU_SOCKET", installed.prefix.join("no-such.sock"))
        .env("VGPU_CONNECT_TIMEOUT", "0.5")
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
    let out = installed
        .command(&exe)
        .arg("nodevice")
        .env_remove("VGPU_SOCKET")
        .output()
        .expect("run the C program");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("VGPU_SOCKET is not set") && stderr.contains("docs/tenants.md"),
        "{stderr}"
    );
    // The program linked against the installed name.
    let ldd = installed.command(Path::new("ldd")).arg(&exe).output();
    if let Ok(ldd) = ldd {
        let text = String::from_utf8_lossy(&ldd.stdout);
        assert!(text.contains("libcuda.so.1"), "ldd: {text}");
    }
    installed.remove();
}

#[test]
fn a_c_program_uses_the_framework_driver_api() {
    let Some(cc) = compiler() else { return };
    let installed = Installed::new("vgpu-cuda-capi");
    let exe = installed.build(&cc, "driverapi", &[]);
    let worker = common::Worker::sim("c-driverapi", "256M", 4);
    let out = installed
        .command(&exe)
        .env("VGPU_SOCKET", &worker.socket)
        .output()
        .expect("run the C program");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "the C program failed: {stdout}{stderr}"
    );
    assert_eq!(stdout.trim(), "ok");
    installed.remove();
}
