//! `vgpu-cuda install --prefix DIR [--lib PATH]`: installs the library as
//! `DIR/lib/libcuda.so.1` with a `libcuda.so` link, the names CUDA programs and their
//! loaders look for. The library is the `libvgpu_cuda.so` built next to this program
//! unless `--lib` names another.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(Debug, thiserror::Error)]
enum InstallError {
    #[error("usage: vgpu-cuda install --prefix DIR [--lib PATH]")]
    Usage,
    #[error("no built library at {0} (build it with `cargo build -p vgpu-cuda`, or pass --lib)")]
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
    let mut lib = None;
    let mut it = args.iter();
    match it.next().map(String::as_str) {
        Some("install") => {}
        _ => return Err(InstallError::Usage),
    }
    while let Some(a) = it.next() {
        match a.as_str() {
            "--prefix" => prefix = it.next().map(PathBuf::from),
            "--lib" => lib = it.next().map(PathBuf::from),
            _ => return Err(InstallError::Usage),
        }
    }
    let prefix = prefix.ok_or(InstallError::Usage)?;
    let lib = match lib {
        Some(l) => l,
        None => std::env::current_exe()
            .ok()
            .and_then(|e| e.parent().map(|d| d.join("libvgpu_cuda.so")))
            .ok_or(InstallError::Usage)?,
    };
    if !lib.is_file() {
        return Err(InstallError::NoLibrary(lib));
    }
    let dir = prefix.join("lib");
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
