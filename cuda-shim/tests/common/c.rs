//! C programs on the installed library: the C compiler, the library installed as
//! libcuda.so.1 in a fresh prefix (`vgpu-cuda install`), and a program of `tests/c/`
//! built against `include/cuda.h` and linked with `-lcuda`, as a program built against
//! NVIDIA's driver API is.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The C compiler (`CC`, else `cc`); None, having said the test is skipped, where there
/// is none.
pub fn compiler() -> Option<String> {
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    if Command::new(&cc).arg("--version").output().is_err() {
        eprintln!("skipped: no C compiler ({cc}) on this machine");
        return None;
    }
    Some(cc)
}

/// The built library installed as libcuda.so.1 (and libcuda.so) in a fresh prefix of the
/// temporary directory.
pub struct Installed {
    pub prefix: PathBuf,
    /// `prefix/lib`: the directory for `LD_LIBRARY_PATH` and `-L`.
    pub lib: PathBuf,
}

impl Installed {
    /// Installs into `<temp>/<name>-<pid>`, emptied first.
    pub fn new(name: &str) -> Installed {
        let prefix = std::env::temp_dir().join(format!("{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&prefix);
        let out = Command::new(env!("CARGO_BIN_EXE_vgpu-cuda"))
            .arg("install")
            .arg("--prefix")
            .arg(&prefix)
            .arg("--lib")
            .arg(super::library())
            .output()
            .expect("run vgpu-cuda install");
        assert!(
            out.status.success(),
            "install: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let lib = prefix.join("lib");
        Installed { prefix, lib }
    }

    /// Builds `tests/c/<source>.c` with `cc -std=c11 -Wall -Werror` against
    /// `include/cuda.h`, linked with `-lcuda` from this prefix and then `libs`: the
    /// executable, in the prefix.
    pub fn build(&self, cc: &str, source: &str, libs: &[&str]) -> PathBuf {
        let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
        let exe = self.prefix.join(source);
        let out = Command::new(cc)
            .args(["-std=c11", "-Wall", "-Werror", "-I"])
            .arg(manifest.join("include"))
            .arg(manifest.join(format!("tests/c/{source}.c")))
            .arg("-o")
            .arg(&exe)
            .arg("-L")
            .arg(&self.lib)
            .arg("-lcuda")
            .args(libs)
            .output()
            .expect("run cc");
        assert!(
            out.status.success(),
            "cc: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        exe
    }

    /// `exe` to run on the installed library.
    pub fn command(&self, exe: &Path) -> Command {
        let mut cmd = Command::new(exe);
        cmd.env("LD_LIBRARY_PATH", &self.lib);
        cmd
    }

    /// Removes the prefix.
    pub fn remove(self) {
        let _ = std::fs::remove_dir_all(&self.prefix);
    }
}
