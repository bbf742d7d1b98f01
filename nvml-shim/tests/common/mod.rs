//! The libraries installed as a tenant gets them (`vgpu-cuda install`), for the tests.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The target profile directory of the running test (`target/debug` or `target/release`).
pub fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap_or_default();
    let mut dir = exe.parent().map(PathBuf::from).unwrap_or_default();
    if dir.ends_with("deps") {
        dir.pop();
    }
    dir
}

/// `cargo build -p package` with `what` (`--lib`, or `--bin NAME`): `cargo test` builds
/// neither the cdylibs nor another package's programs.
fn build(package: &str, what: &[&str]) {
    let manifest = concat!(env!("CARGO_MANIFEST_DIR"), "/../Cargo.toml");
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cmd.args([
        "build",
        "--quiet",
        "--manifest-path",
        manifest,
        "-p",
        package,
    ])
    .args(what);
    if profile_dir().ends_with("release") {
        cmd.arg("--release");
    }
    let status = cmd.status();
    assert!(
        matches!(status, Ok(s) if s.success()),
        "cannot build {package}: {status:?}"
    );
}

/// The directory with `libcuda.so.1` and `libnvidia-ml.so.1` (and their `.so` links),
/// installed once per test program by `vgpu-cuda install --lib ... --nvml ...`, as the
/// package and a tenant's container have them.
pub fn libdir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        build("vgpu-cuda", &["--lib"]);
        build("vgpu-cuda", &["--bin", "vgpu-cuda"]);
        build("vgpu-nvml", &["--lib"]);
        let dir = profile_dir();
        // In the target directory, one per test program (its name without cargo's hash):
        // each run replaces the last one's.
        let exe = std::env::current_exe().unwrap_or_default();
        let name = exe
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.split('-').next())
            .unwrap_or("test");
        let prefix = dir.join(format!("vgpu-nvml-test-{name}"));
        let _ = std::fs::remove_dir_all(&prefix);
        let out = Command::new(dir.join("vgpu-cuda"))
            .arg("install")
            .arg("--prefix")
            .arg(&prefix)
            .arg("--lib")
            .arg(dir.join("libvgpu_cuda.so"))
            .arg("--nvml")
            .arg(dir.join("libvgpu_nvml.so"))
            .output()
            .expect("run vgpu-cuda install");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "install: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(stdout.contains("libnvidia-ml.so.1"), "{stdout}");
        let libdir = prefix.join("lib");
        assert!(libdir.join("libnvidia-ml.so.1").is_file());
        assert_eq!(
            std::fs::read_link(libdir.join("libnvidia-ml.so")).expect("libnvidia-ml.so"),
            Path::new("libnvidia-ml.so.1")
        );
        libdir
    })
}
