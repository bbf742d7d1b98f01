//! Builds the no_std payload guests under `guests/` once per process and hands out their
//! ELF paths, so tests, benches and the demo never rebuild payloads by hand.
//!
//! Where cargo is absent (the GPU machine), point `VGPU_PAYLOAD_DIR` at a directory of
//! prebuilt payloads (`payload-build --out DIR` makes one) and nothing is built.

mod error;
mod lock;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

pub use error::Error;
use lock::BuildLock;

/// Every payload binary in guests/payloads/src/bin (a test keeps the two in step).
pub const PAYLOADS: &[&str] = &[
    "gpu-load",
    "hello",
    "hostile",
    "kvm-exits",
    "memcheck",
    "shm-pipe",
    "storage",
    "streams",
    "vecadd",
    "vhost-echo",
];

/// Directory of prebuilt payload ELFs; when set, nothing is built.
pub const PAYLOAD_DIR_ENV: &str = "VGPU_PAYLOAD_DIR";

/// The payload target named in guests/.cargo/config.toml; cargo puts the ELFs under
/// target/<triple>/release.
const TARGET_TRIPLE: &str = "x86_64-unknown-none";
/// How much of cargo's stderr a failed build reports.
const STDERR_TAIL_LINES: usize = 40;

/// Environment a parent cargo (tests, clippy, coverage) may have set that would change how
/// the payloads compile or where they land; the guests workspace brings its own settings.
const SCRUBBED_ENV: &[&str] = &[
    "RUSTFLAGS",
    "CARGO_ENCODED_RUSTFLAGS",
    "CARGO_BUILD_RUSTFLAGS",
    "CARGO_TARGET_DIR",
    "CARGO_BUILD_TARGET_DIR",
    "CARGO_BUILD_TARGET",
    "RUSTC_WORKSPACE_WRAPPER",
    "CARGO_PROFILE_RELEASE_PANIC",
    "CARGO_PROFILE_RELEASE_LTO",
];

/// The guests workspace in this checkout.
pub fn guests_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../guests")
}

/// Where a plain `cargo build --release` in guests/ leaves the ELFs.
pub fn built_dir() -> PathBuf {
    guests_dir()
        .join("target")
        .join(TARGET_TRIPLE)
        .join("release")
}

/// The ELF of payload `name`, built on first use in this process (or taken from
/// `VGPU_PAYLOAD_DIR`).
pub fn payload(name: &str) -> Result<PathBuf, Error> {
    let prebuilt = std::env::var_os(PAYLOAD_DIR_ENV)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from);
    resolve(name, prebuilt.as_deref(), build_all)
}

/// Builds every payload once per process and returns the directory holding them.
pub fn build_all() -> Result<PathBuf, Error> {
    static BUILT: OnceLock<Result<PathBuf, Error>> = OnceLock::new();
    BUILT.get_or_init(|| build_in(&guests_dir())).clone()
}

fn resolve(
    name: &str,
    prebuilt: Option<&Path>,
    build: impl FnOnce() -> Result<PathBuf, Error>,
) -> Result<PathBuf, Error> {
    if !PAYLOADS.contains(&name) {
        return Err(Error::UnknownPayload {
            name: name.to_owned(),
            known: PAYLOADS.join(", "),
        });
    }
    if let Some(dir) = prebuilt {
        let path = dir.join(name);
        return if path.is_file() {
            Ok(path)
        } else {
            Err(Error::PrebuiltMissing(path))
        };
    }
    let path = build()?.join(name);
    if path.is_file() {
        Ok(path)
    } else {
        Err(Error::NotProduced(path))
    }
}

/// Runs `cargo build --release` in `guests`, holding the cross-process lock.
fn build_in(guests: &Path) -> Result<PathBuf, Error> {
    if !guests.join("Cargo.toml").is_file() {
        return Err(Error::NoGuestsWorkspace(guests.to_path_buf()));
    }
    let target = guests.join("target");
    let _lock = BuildLock::acquire(&target.join("payload-build.lock"))?;
    // CARGO is set when we run under cargo (tests, build scripts): use the same toolchain.
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let mut cmd = Command::new(&cargo);
    cmd.current_dir(guests)
        .args(["build", "--release", "--target-dir"])
        .arg(&target);
    for var in SCRUBBED_ENV {
        cmd.env_remove(var);
    }
    let out = cmd.output().map_err(|e| Error::CargoMissing {
        cargo: cargo.clone(),
        reason: e.to_string(),
    })?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let lines: Vec<&str> = stderr.lines().collect();
        let tail = lines[lines.len().saturating_sub(STDERR_TAIL_LINES)..].join("\n");
        return Err(Error::BuildFailed {
            dir: guests.to_path_buf(),
            status: out.status.to_string(),
            stderr_tail: tail,
        });
    }
    Ok(target.join(TARGET_TRIPLE).join("release"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn never_build() -> Result<PathBuf, Error> {
        panic!("must not build")
    }

    #[test]
    fn unknown_names_are_refused_before_building() {
        let err = resolve("nope", None, never_build).unwrap_err();
        assert!(matches!(err, Error::UnknownPayload { ref name, .. } if name == "nope"));
        assert!(err.to_string().contains("hello"));
    }

    #[test]
    fn prebuilt_dir_is_used_without_building() {
        let dir = std::env::temp_dir().join(format!("payload-build-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("hello"), b"\x7fELF").unwrap();
        assert_eq!(
            resolve("hello", Some(&dir), never_build).unwrap(),
            dir.join("hello")
        );
        let err = resolve("kvm-exits", Some(&dir), never_build).unwrap_err();
        assert!(matches!(err, Error::PrebuiltMissing(p) if p == dir.join("kvm-exits")));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn missing_guests_workspace_is_reported() {
        let err = build_in(Path::new("/nonexistent/guests")).unwrap_err();
        assert!(matches!(err, Error::NoGuestsWorkspace(_)));
    }

    #[test]
    fn payload_list_matches_the_bins() {
        let mut bins: Vec<String> = std::fs::read_dir(guests_dir().join("payloads/src/bin"))
            .unwrap()
            .filter_map(|e| {
                let name = e.ok()?.file_name().into_string().ok()?;
                name.strip_suffix(".rs").map(str::to_owned)
            })
            .collect();
        bins.sort();
        let mut known: Vec<&str> = PAYLOADS.to_vec();
        known.sort();
        assert_eq!(bins, known);
    }
}
