//! Where the project's binaries and payloads are.

use std::path::PathBuf;
use std::process::Command;

/// The workspace's target profile directory of the running test or bench
/// (`target/debug` or `target/release`).
pub fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap_or_default();
    let mut dir = exe.parent().map(PathBuf::from).unwrap_or_default();
    if dir.ends_with("deps") {
        dir.pop();
    }
    dir
}

/// The package that owns workspace binary `name`.
fn package_of(name: &str) -> &'static str {
    match name {
        "vmm" => "vmm",
        "payload-build" => "payload-build",
        "vgpu-bench" | "vgpu-native-load" => "vgpu-tests",
        "vgpu-worker" => "vgpu-worker",
        "vgpuctl" | "vgpu-demo" => "vgpuctl",
        _ => "vgpud",
    }
}

/// The path of workspace binary `name`, building it when it is missing: `cargo test`
/// builds another package's binaries only as unit-test harnesses, never the programs.
pub fn binary(name: &str) -> PathBuf {
    static BUILD: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let path = profile_dir().join(name);
    let _one_at_a_time = BUILD.lock().unwrap_or_else(|p| p.into_inner());
    if !path.exists() {
        let release = profile_dir().ends_with("release");
        let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
        let manifest = concat!(env!("CARGO_MANIFEST_DIR"), "/../Cargo.toml");
        cmd.args([
            "build",
            "--quiet",
            "--manifest-path",
            manifest,
            "-p",
            package_of(name),
            "--bin",
            name,
        ]);
        if release {
            cmd.arg("--release");
        }
        let status = cmd.status();
        assert!(
            matches!(status, Ok(s) if s.success()),
            "cannot build binary {name}: {status:?}"
        );
    }
    path
}

/// The ELF of payload `name`, built once by payload-build.
pub fn payload(name: &str) -> PathBuf {
    match payload_build::payload(name) {
        Ok(p) => p,
        Err(e) => panic!("payload {name}: {e}"),
    }
}

/// True when this machine can run KVM guests; tests that need KVM say so and skip
/// otherwise.
pub fn have_kvm() -> bool {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
        .is_ok()
}

/// Skips the calling test (returns from it) when KVM is missing.
#[macro_export]
macro_rules! require_kvm {
    () => {
        if !$crate::bins::have_kvm() {
            eprintln!("SKIPPED: /dev/kvm is not available on this machine");
            return;
        }
    };
}
