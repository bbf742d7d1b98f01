//! A worker's files: its private directory `<state dir>/workers/N/` (mode 0700, owned by
//! the worker's identity), the sockets vgpud binds there for it, its secret, and its log's
//! last words. vGPU N's directory holds the vhost-user socket (`vgpu.sock`, the one the
//! vmm connects to; a process vGPU's is at its hand-over path instead), the control socket
//! a restarted vgpud reconnects on (`control.sock`) and the secret it presents there
//! (`secret`). vgpud binds both sockets and hands the worker the listening descriptors:
//! the worker binds, links and renames nothing.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::process::Command;

use super::attach::ProcessAttach;
use super::procs::Identity;

/// The vhost-user socket's name in a worker's directory.
pub(super) const VHOST_SOCKET: &str = "vgpu.sock";
/// The control socket a restarted vgpud reconnects on.
pub(super) const CONTROL_SOCKET: &str = "control.sock";
/// The secret a reconnecting vgpud presents.
pub(super) const SECRET_FILE: &str = "secret";

/// vGPU `id`'s private directory.
pub(super) fn worker_dir(state_dir: &Path, id: u32) -> PathBuf {
    state_dir.join("workers").join(id.to_string())
}

/// Where a worker finds the listening sockets vgpud bound for it (`--listen-fd 6
/// --control-listen-fd 7`).
pub(super) const VHOST_LISTEN_FD: i32 = 6;
pub(super) const CONTROL_LISTEN_FD: i32 = 7;

/// Binds `path` afresh (a stale socket there is removed first).
fn bind_fresh(path: &Path) -> std::io::Result<UnixListener> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    UnixListener::bind(path)
}

/// The listening sockets vgpud binds for a new worker of a vGPU and hands it as
/// descriptors, so that the worker binds, links and renames nothing: the vhost-user socket
/// (a VM's at `vhost`, in the worker's directory; a process vGPU's at its hand-over path
/// `to`, in a directory only vgpud writes) and the control socket a restarted vgpud
/// reconnects on (`control.sock` in the worker's directory `dir`).
pub(super) fn bind_sockets(
    dir: &Path,
    vhost: &Path,
    to: Option<&ProcessAttach>,
) -> std::io::Result<(OwnedFd, OwnedFd)> {
    let v = match to {
        Some(to) => super::attach::bind_hand_over(to)?,
        None => bind_fresh(vhost)?,
    };
    let c = bind_fresh(&dir.join(CONTROL_SOCKET))?;
    Ok((OwnedFd::from(v), OwnedFd::from(c)))
}

/// vGPU `id`'s vhost-user socket (what its VM's vmm connects to).
pub(super) fn worker_socket(state_dir: &Path, id: u32) -> PathBuf {
    worker_dir(state_dir, id).join(VHOST_SOCKET)
}

/// A fresh secret: 32 random bytes, hex.
fn new_secret() -> std::io::Result<String> {
    let mut b = [0u8; 32];
    File::open("/dev/urandom")?.read_exact(&mut b)?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

/// Held while a worker's directory is made or removed: one vGPU's last worker removing
/// `workers/` (once empty) must not race another's making its directory inside it, nor a
/// directory's removal the same directory's making (the one vGPU's old and fresh worker).
fn dirs_lock() -> std::sync::MutexGuard<'static, ()> {
    static DIRS: std::sync::Mutex<()> = std::sync::Mutex::new(());
    DIRS.lock().unwrap_or_else(|e| e.into_inner())
}

/// Makes a worker's private directory `dir` (under `<state dir>/workers/`) anew (0700,
/// owned by `identity`) with its secret.
pub(super) fn prepare_dir(
    state_dir: &Path,
    dir: &Path,
    identity: Option<Identity>,
) -> std::io::Result<()> {
    let _dirs = dirs_lock();
    let parent = state_dir.join("workers");
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&parent)?;
    match std::fs::remove_dir_all(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    // Recursive: `workers/` may have been removed a moment ago (its last worker exited).
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    let secret = dir.join(SECRET_FILE);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&secret)?;
    f.write_all(new_secret()?.as_bytes())?;
    if let Some(who) = identity {
        for p in [dir, secret.as_path()] {
            std::os::unix::fs::chown(p, Some(who.uid), Some(who.gid))?;
        }
    }
    Ok(())
}

/// Removes vGPU `id`'s private directory (its worker is gone), and `workers/` once empty.
pub(super) fn remove_dir(state_dir: &Path, id: u32) {
    let _dirs = dirs_lock();
    let _ = std::fs::remove_dir_all(worker_dir(state_dir, id));
    let _ = std::fs::remove_dir(state_dir.join("workers"));
}

/// The environment every worker gets on top of vgpud's.
pub(super) fn worker_env(cmd: &mut Command) {
    // The CUDA driver's JIT cache would write files after the worker's seccomp filter is
    // on (and a worker's uid has no home of its own). Pool workers JIT the built-in
    // kernels while idle, off any VM's start (docs/hostile.md, "Worker pool").
    cmd.env("NO_COLOR", "1").env("CUDA_CACHE_DISABLE", "1");
}

/// The worker's last words, for failure reasons: its last error line (or last line),
/// without the log timestamp.
pub(super) fn log_tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let pick = lines
        .iter()
        .rev()
        .find(|l| l.contains("error") || l.contains("ERROR") || l.contains("panicked"))
        .or(lines.last());
    match pick {
        Some(l) => {
            let l = l.trim();
            // "2026-11-29T12:20:53.99Z  INFO target: message" -> "INFO target: message"
            let l = match l.split_once(' ') {
                Some((ts, rest)) if ts.len() > 18 && ts.as_bytes().get(4) == Some(&b'-') => {
                    rest.trim_start()
                }
                _ => l,
            };
            format!(": {l}")
        }
        None => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_tail_picks_the_error_without_the_timestamp() {
        let p = std::env::temp_dir().join(format!("vgpud-logtail-{}", std::process::id()));
        std::fs::write(
            &p,
            "2026-11-29T12:20:53.997651Z  INFO vgpu_worker: listening\n\
             2026-11-29T12:20:53.998011Z ERROR vgpu_worker: cannot bind\n\
             2026-11-29T12:20:53.998011Z  INFO vgpu_worker: bye\n",
        )
        .expect("write");
        assert_eq!(log_tail(&p), ": ERROR vgpu_worker: cannot bind");
        std::fs::remove_file(&p).expect("rm");
        assert_eq!(log_tail(&p), "");
    }
}
