//! The descriptors vgpud hands a worker: the grant page and doorbell (`--grant-fds`), the
//! listening sockets it bound for the worker (`--listen-fd`, `--control-listen-fd`, or
//! with a pool worker's assignment), and the control socket vgpud reconnects on.

use std::os::fd::{FromRawFd, OwnedFd};
use std::path::PathBuf;

use crate::control::Reconnect;
use crate::error::WorkerError;
use crate::run::Config;

/// Takes the inherited grant page and doorbell (`--grant-fds`).
pub fn grant(page: i32, doorbell: i32) -> Result<(OwnedFd, OwnedFd), WorkerError> {
    for fd in [page, doorbell] {
        // SAFETY: F_GETFD only inspects the descriptor table.
        if unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
            return Err(WorkerError::Grant(format!(
                "descriptor {fd} is not open; start the worker from vgpud or drop --grant-fds"
            )));
        }
    }
    // SAFETY: both descriptors are open (checked above) and were handed to this process
    // for the grant channel alone; nothing else in the worker owns them.
    Ok(unsafe { (OwnedFd::from_raw_fd(page), OwnedFd::from_raw_fd(doorbell)) })
}

/// Takes an inherited descriptor named on the command line (`what`).
pub fn fd(fd: Option<i32>, what: &str) -> Result<Option<OwnedFd>, WorkerError> {
    let Some(fd) = fd else { return Ok(None) };
    // SAFETY: F_GETFD only inspects the descriptor table.
    if fd < 0 || unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
        return Err(WorkerError::Control {
            fd,
            why: format!("{what}: the descriptor is not open; start the worker from vgpud"),
        });
    }
    // SAFETY: the descriptor is open (checked above) and was handed to this process for
    // this purpose alone; nothing else in the worker owns it.
    Ok(Some(unsafe { OwnedFd::from_raw_fd(fd) }))
}

/// The control socket vgpud reconnects on, with its secret (`--control-listen`,
/// `--secret-file`), when the worker is to wait for vgpud.
pub fn reconnect_socket(
    cfg: &Config,
    inherited: Option<OwnedFd>,
) -> Result<Option<Reconnect>, WorkerError> {
    let Some(secret_file) = &cfg.secret_file else {
        return Ok(None);
    };
    let path = match (&cfg.control_listen, &inherited) {
        (Some(p), _) => p.clone(),
        (None, Some(_)) => PathBuf::from("(descriptor from vgpud)"),
        (None, None) => return Ok(None),
    };
    let path = &path;
    if cfg.reconnect.is_zero() {
        return Ok(None);
    }
    let err = |why: String| WorkerError::Bind {
        path: path.clone(),
        why,
    };
    let secret = std::fs::read_to_string(secret_file)
        .map_err(|e| {
            err(format!(
                "cannot read the secret {}: {e}",
                secret_file.display()
            ))
        })?
        .trim()
        .to_owned();
    if secret.is_empty() {
        return Err(err(format!(
            "the secret {} is empty",
            secret_file.display()
        )));
    }
    let listener = match inherited {
        Some(fd) => listener(fd, "--control-listen-fd").map_err(err)?,
        None => {
            if std::fs::symlink_metadata(path).is_ok() {
                std::fs::remove_file(path)
                    .map_err(|e| err(format!("cannot remove the old socket: {e}")))?;
            }
            std::os::unix::net::UnixListener::bind(path).map_err(|e| err(e.to_string()))?
        }
    };
    listener
        .set_nonblocking(true)
        .map_err(|e| err(e.to_string()))?;
    Ok(Some(Reconnect {
        listener,
        secret,
        wait: cfg.reconnect,
    }))
}

/// A listening unix socket vgpud handed over (`what` names where it came from).
pub fn listener(fd: OwnedFd, what: &str) -> Result<std::os::unix::net::UnixListener, String> {
    use std::os::fd::AsRawFd;
    let mut ty: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `ty`, a valid c_int.
    let rc = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_ACCEPTCONN,
            std::ptr::addr_of_mut!(ty).cast(),
            &mut len,
        )
    };
    if rc != 0 || ty == 0 {
        return Err(format!(
            "{what}: descriptor {} is not a listening socket; start the worker from vgpud",
            fd.as_raw_fd()
        ));
    }
    Ok(std::os::unix::net::UnixListener::from(fd))
}
