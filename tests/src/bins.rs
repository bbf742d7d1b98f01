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

/// The path of workspace binary `name`, building it when `cargo test --workspace` did not
/// (a test run for one package builds only that package's binaries).
pub fn binary(name: &str) -> PathBuf {
    let path = profile_dir().join(name);
    if !path.exists() {
        let release = profile_dir().ends_with("release");
        let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
        cmd.args(["build", "--quiet", "--bin", name]);
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
