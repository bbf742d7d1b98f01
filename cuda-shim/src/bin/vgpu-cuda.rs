//! `vgpu-cuda install (--prefix DIR | --dir DIR) [--lib PATH] [--nvml PATH]`: installs the
//! library as `DIR/lib/libcuda.so.1` (`--dir`: `DIR/libcuda.so.1`) with a `libcuda.so` link,
//! the names CUDA programs and their loaders look for (a copy named only `libcuda.so` is not
//! found by programs linked with `-lcuda`, which ask for `libcuda.so.1`). The library is
//! the first of: `--lib`; `libvgpu_cuda.so` next to this program (a cargo build);
//! `../lib/libvgpu_cuda.so` (the GPU bundle); `../lib/vgpu/cuda/libcuda.so.1` (the
//! package's, docs/install.md).
//!
//! Beside it, the vGPU NVML library (`vgpu-nvml`, docs/nvml.md) as `libnvidia-ml.so.1`
//! with a `libnvidia-ml.so` link: `--nvml`, else `libvgpu_nvml.so` in the CUDA library's
//! directory, else `libvgpu_nvml.so` next to this program, `../lib/libvgpu_nvml.so`,
//! `../lib/vgpu/cuda/libnvidia-ml.so.1`. Without one, only the CUDA library is installed, and the output says so.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(Debug, thiserror::Error)]
enum InstallError {
    #[error("usage: vgpu-cuda install (--prefix DIR | --dir DIR) [--lib PATH] [--nvml PATH]")]
    Usage,
    #[error("no vGPU CUDA library at {0}: pass --lib PATH (the package installs it as /usr/lib/vgpu/cuda/libcuda.so.1; a source build makes target/<profile>/libvgpu_cuda.so with `cargo build -p vgpu-cuda`)")]
    NoLibrary(PathBuf),
    #[error("no vGPU NVML library at {0}: pass the built one (target/<profile>/libvgpu_nvml.so from `cargo build -p vgpu-nvml`), or leave --nvml out to install the CUDA library alone")]
    NoNvml(PathBuf),
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
}

fn io(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> InstallError {
    let path = path.to_path_buf();
    move |source| InstallError::Io { what, path, source }
}

/// What was installed: the directory, and whether the NVML library went with it.
struct Installed {
    dir: PathBuf,
    nvml: bool,
}

/// Copies `from` to `dir/name` (through a temporary name, so a running program keeps the
/// file it mapped) and links `link` to it.
fn place(from: &Path, dir: &Path, name: &str, link: &str) -> Result<(), InstallError> {
    let to = dir.join(name);
    let tmp = dir.join(format!(".{name}.tmp"));
    std::fs::copy(from, &tmp).map_err(io("cannot copy the library to", &tmp))?;
    std::fs::rename(&tmp, &to).map_err(io("cannot install", &to))?;
    let link = dir.join(link);
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(name, &link).map_err(io("cannot link", &link))?;
    Ok(())
}

fn install(args: &[String]) -> Result<Installed, InstallError> {
    let mut prefix = None;
    let mut into = None;
    let mut lib = None;
    let mut nvml = None;
    let mut it = args.iter();
    match it.next().map(String::as_str) {
        Some("install") => {}
        _ => return Err(InstallError::Usage),
    }
    while let Some(a) = it.next() {
        match a.as_str() {
            "--prefix" => prefix = it.next().map(PathBuf::from),
            "--dir" => into = it.next().map(PathBuf::from),
            "--lib" => lib = it.next().map(PathBuf::from),
            "--nvml" => nvml = it.next().map(PathBuf::from),
            _ => return Err(InstallError::Usage),
        }
    }
    let dir = match (prefix, into) {
        (Some(p), None) => p.join("lib"),
        (None, Some(d)) => d,
        _ => return Err(InstallError::Usage),
    };
    let here = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(Path::to_path_buf))
        .ok_or(InstallError::Usage)?;
    let lib = match lib {
        Some(l) => l,
        None => {
            let candidates = [
                here.join("libvgpu_cuda.so"),
                here.join("../lib/libvgpu_cuda.so"),
                here.join("../lib/vgpu/cuda/libcuda.so.1"),
            ];
            candidates
                .iter()
                .find(|c| c.is_file())
                .unwrap_or(&candidates[0])
                .clone()
        }
    };
    if !lib.is_file() {
        return Err(InstallError::NoLibrary(lib));
    }
    let nvml = match nvml {
        Some(n) if n.is_file() => Some(n),
        Some(n) => return Err(InstallError::NoNvml(n)),
        None => {
            let beside = lib.parent().map(Path::to_path_buf).unwrap_or_default();
            [
                beside.join("libvgpu_nvml.so"),
                here.join("libvgpu_nvml.so"),
                here.join("../lib/libvgpu_nvml.so"),
                here.join("../lib/vgpu/cuda/libnvidia-ml.so.1"),
            ]
            .into_iter()
            .find(|c| c.is_file())
        }
    };
    std::fs::create_dir_all(&dir).map_err(io("cannot create", &dir))?;
    place(&lib, &dir, "libcuda.so.1", "libcuda.so")?;
    if let Some(n) = &nvml {
        place(n, &dir, "libnvidia-ml.so.1", "libnvidia-ml.so")?;
    }
    Ok(Installed {
        dir,
        nvml: nvml.is_some(),
    })
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match install(&args) {
        Ok(Installed { dir, nvml }) => {
            println!("installed {}/libcuda.so.1 and libcuda.so", dir.display());
            if nvml {
                println!(
                    "installed {}/libnvidia-ml.so.1 and libnvidia-ml.so",
                    dir.display()
                );
            } else {
                println!("no vGPU NVML library found (--nvml PATH): NVML queries on the vGPU will find no libnvidia-ml.so.1 here");
            }
            println!("run programs with LD_LIBRARY_PATH={} and VGPU_SOCKET=<worker socket> (in a container) ", dir.display());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("vgpu-cuda: {e}");
            ExitCode::from(2)
        }
    }
}
