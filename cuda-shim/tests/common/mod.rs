//! What the tests share: a sim `vgpu-worker` for one test (the end-to-end tests' helper),
//! the path of the built library, the library loaded in the test's process (`cuda`), C
//! programs on the installed library (`c`), the symbols a library exports (`elf`), and a
//! vGPU served in the test's own process over the Linux transport (`physmem`).

#![allow(dead_code)]

pub mod c;
#[macro_use]
pub mod cuda;
pub mod elf;
pub mod physmem;

use std::path::{Path, PathBuf};
use std::process::Command;

/// The target profile directory of the running test (`target/debug` or `target/release`).
pub fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap_or_default();
    let mut dir = exe.parent().map(PathBuf::from).unwrap_or_default();
    if dir.ends_with("deps") {
        dir.pop();
    }
    dir
}

/// Builds `-p package` (its `--bin bin` when given); with `only_missing`, only when
/// `path` does not exist.
fn ensure_built(path: &Path, package: &str, bin: Option<&str>, only_missing: bool) {
    static BUILD: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = BUILD.lock().unwrap_or_else(|p| p.into_inner());
    if only_missing && path.exists() {
        return;
    }
    let manifest = concat!(env!("CARGO_MANIFEST_DIR"), "/../Cargo.toml");
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cmd.args([
        "build",
        "--quiet",
        "--manifest-path",
        manifest,
        "-p",
        package,
    ]);
    if let Some(bin) = bin {
        cmd.args(["--bin", bin]);
    } else {
        cmd.arg("--lib");
    }
    if profile_dir().ends_with("release") {
        cmd.arg("--release");
    }
    let status = cmd.status();
    assert!(
        matches!(status, Ok(s) if s.success()),
        "cannot build {package}: {status:?}"
    );
}

/// The built library (`libvgpu_cuda.so`), brought up to date first (`cargo test` builds
/// the library only as the rlib the tests link).
pub fn library() -> PathBuf {
    let path = profile_dir().join("libvgpu_cuda.so");
    ensure_built(&path, "vgpu-cuda", None, false);
    path
}

/// A worker for one test: the end-to-end tests' helper ([`Worker::sim`] starts a sim one).
pub use vgpu_tests::worker::Worker;
