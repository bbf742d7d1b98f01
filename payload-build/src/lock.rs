//! A cross-process lock, so test binaries running in parallel build the payloads one at a
//! time instead of racing over the same target directory.

use std::fs::{self, File, OpenOptions};
use std::os::fd::AsRawFd;
use std::path::Path;

use crate::error::Error;

/// Held until dropped: closing the file releases the flock.
pub(crate) struct BuildLock {
    _file: File,
}

impl BuildLock {
    pub(crate) fn acquire(path: &Path) -> Result<Self, Error> {
        let err = |reason: String| Error::Lock {
            path: path.to_path_buf(),
            reason,
        };
        if let Some(dir) = path.parent() {
            fs::create_dir_all(dir).map_err(|e| err(e.to_string()))?;
        }
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path)
            .map_err(|e| err(e.to_string()))?;
        loop {
            // SAFETY: flock on a descriptor we own; it only takes an advisory lock.
            let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) };
            if rc == 0 {
                return Ok(BuildLock { _file: file });
            }
            let e = std::io::Error::last_os_error();
            if e.kind() != std::io::ErrorKind::Interrupted {
                return Err(err(e.to_string()));
            }
        }
    }
}
