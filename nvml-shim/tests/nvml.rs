//! A C program that asks NVML about its GPU and uses it through CUDA (tests/c/nvml.c),
//! built against include/nvml.h and linked with `-lnvidia-ml -lcuda`, run with both
//! libraries installed by `vgpu-cuda install` against a sim worker: it sees one device,
//! the vGPU's memory share as total memory, its use grow as it allocates through CUDA,
//! only itself as a process, CUDA's identity of the vGPU, and the NVML answers for bad
//! handles, NULL pointers and calls before `nvmlInit`. Skipped, saying so, where no C
//! compiler is present.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use vgpu_tests::worker::Worker;

mod common;

/// The installed libraries' directory and the built program; `None` without a C compiler.
struct Setup {
    libdir: PathBuf,
    exe: PathBuf,
}

fn setup() -> Option<&'static Setup> {
    static SETUP: OnceLock<Option<Setup>> = OnceLock::new();
    SETUP
        .get_or_init(|| {
            let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
            if Command::new(&cc).arg("--version").output().is_err() {
                eprintln!("skipped: no C compiler ({cc}) on this machine");
                return None;
            }
            let libdir = common::libdir().to_path_buf();
            let prefix = libdir.parent().unwrap_or(&libdir).to_path_buf();
            let here = Path::new(env!("CARGO_MANIFEST_DIR"));
            let exe = prefix.join("nvml");
            let out = Command::new(&cc)
                .args(["-std=c11", "-Wall", "-Werror", "-D_DEFAULT_SOURCE"])
                .arg("-I")
                .arg(here.join("include"))
                .arg("-I")
                .arg(here.join("../cuda-shim/include"))
                .arg(here.join("tests/c/nvml.c"))
                .arg("-o")
                .arg(&exe)
                .arg("-L")
                .arg(&libdir)
                .args(["-lnvidia-ml", "-lcuda"])
                .output()
                .expect("run cc");
            assert!(
                out.status.success(),
                "cc: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            Some(Setup { libdir, exe })
        })
        .as_ref()
}

/// Runs the program with `arg`, on the worker at `socket` (none: `VGPU_SOCKET` unset).
fn run(s: &Setup, arg: &str, socket: Option<&Path>) -> Output {
    let mut cmd = Command::new(&s.exe);
    cmd.arg(arg).env("LD_LIBRARY_PATH", &s.libdir);
    match socket {
        Some(p) => cmd.env("VGPU_SOCKET", p),
        None => cmd.env_remove("VGPU_SOCKET"),
    };
    cmd.output().expect("run the NVML program")
}

fn assert_ok(out: &Output) {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.trim() == "ok",
        "the NVML program failed: {stdout}{stderr}"
    );
}

#[test]
fn nvml_reports_the_vgpu_and_its_use_to_the_program_on_it() {
    let Some(s) = setup() else { return };
    let worker = Worker::sim("nvml", "256M", 2);
    // Counting devices does not take the vGPU: the worker serves one process, and the next
    // program still gets it.
    assert_ok(&run(s, "count", Some(&worker.socket)));
    assert_ok(&run(s, &(256u64 << 20).to_string(), Some(&worker.socket)));
}

#[test]
fn nvml_beside_a_program_holding_the_vgpu_reports_it_unreachable() {
    let Some(s) = setup() else { return };
    let worker = Worker::sim("nvml-busy", "256M", 2);
    let mut holder = Command::new(&s.exe)
        .arg("hold")
        .env("LD_LIBRARY_PATH", &s.libdir)
        .env("VGPU_SOCKET", &worker.socket)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the holding program");
    let mut line = String::new();
    let stdout = holder.stdout.take().expect("stdout");
    BufReader::new(stdout).read_line(&mut line).expect("read");
    assert_eq!(line.trim(), "holding");
    // A second process (a monitoring tool beside the program): the vGPU serves one
    // process, so what needs the device is unreachable; nothing hangs or aborts, and it
    // sees no process, not the other one.
    let started = Instant::now();
    let out = Command::new(&s.exe)
        .arg("busy")
        .env("LD_LIBRARY_PATH", &s.libdir)
        .env("VGPU_SOCKET", &worker.socket)
        .env("VGPU_CONNECT_TIMEOUT", "0.5")
        .output()
        .expect("run the NVML program");
    assert_ok(&out);
    assert!(started.elapsed() < Duration::from_secs(30));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("NVML_ERROR_GPU_IS_LOST") && stderr.contains("another process holds it"),
        "{stderr}"
    );
    drop(holder.stdin.take());
    let status = holder.wait().expect("wait");
    assert!(status.success());
}

#[test]
fn without_a_vgpu_nvml_reports_no_driver_and_says_why() {
    let Some(s) = setup() else { return };
    let out = run(s, "nodevice", None);
    assert_ok(&out);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("VGPU_SOCKET is not set")
            && stderr.contains("NVML_ERROR_DRIVER_NOT_LOADED")
            && stderr.contains("docs/tenants.md"),
        "{stderr}"
    );
}
