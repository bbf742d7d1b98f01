//! `vgpu-cuda install (--prefix DIR | --dir DIR) [--lib PATH]`: installs the library as
//! `DIR/lib/libcuda.so.1` (`--dir`: `DIR/libcuda.so.1`) with a `libcuda.so` link, the
//! names CUDA programs and their loaders look for (a copy named only `libcuda.so` is not
//! found by programs linked with `-lcuda`, which ask for `libcuda.so.1`). The library is
//! the first of: `--lib`; `libvgpu_cuda.so` next to this program (a cargo build);
//! `../lib/libvgpu_cuda.so` (the GPU bundle); `../lib/vgpu/cuda/libcuda.so.1` (the
//! package's, docs/install.md).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(Debug, thiserror::Error)]
enum InstallError {
    #[error("usage: vgpu-cuda install (--prefix DIR | --dir DIR) [--lib PATH]")]
    Usage,
    #[error("no vGPU CUDA library at {0}: pass --lib PATH (the package installs it as /usr/lib/vgpu/cuda/libcuda.so.1; a source build makes target/<profile>/libvgpu_cuda.so with `cargo build -p vgpu-cuda`)")]
    NoLibrary(PathBuf),
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

fn install(args: &[String]) -> Result<PathBuf, InstallError> {
    let mut prefix = None;
    let mut into = None;
    let mut lib = None;
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
            _ => return Err(InstallError::Usage),
        }
    }
    let dir = match (prefix, into) {
        (Some(p), None) => p.join("lib"),
        (None, Some(d)) => d,
        _ => return Err(InstallError::Usage),
    };
    let lib = match lib {
        Some(l) => l,
        None => {
            let here = std::env::current_exe()
                .ok()
                .and_then(|e| e.parent().map(Path::to_path_buf))
                .ok_or(InstallError::Usage)?;
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
    std::fs::create_dir_all(&dir).map_err(io("cannot create", &dir))?;
    let so1 = dir.join("libcuda.so.1");
    let tmp = dir.join(".libcuda.so.1.tmp");
    std::fs::copy(&lib, &tmp).map_err(io("cannot copy the library to", &tmp))?;
    std::fs::rename(&tmp, &so1).map_err(io("cannot install", &so1))?;
    let link = dir.join("libcuda.so");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink("libcuda.so.1", &link).map_err(io("cannot link", &link))?;
    Ok(dir)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match install(&args) {
        Ok(dir) => {
            println!("installed {}/libcuda.so.1 and libcuda.so", dir.display());
            println!("run programs with LD_LIBRARY_PATH={} and VGPU_SOCKET=<worker socket> (in a container) ", dir.display());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("vgpu-cuda: {e}");
            ExitCode::from(2)
        }
    }
}
