//! Wakes the agent when an entry of a directory is created or removed (inotify), so a
//! kubelet restart (a new `kubelet.sock`, the plugin sockets removed) is seen at once; the
//! agent's polling stays the fallback where inotify is not available.

use std::ffi::CString;
use std::fs::File;
use std::io::Read;
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Arc;

use tokio::sync::Notify;

/// Watches `dir` on a thread of its own for as long as the process lives, waking `notify`
/// on every entry created, removed or renamed there.
pub fn watch(dir: &Path, notify: Arc<Notify>) -> std::io::Result<()> {
    let path = CString::new(dir.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::other("the directory's path has a NUL byte"))?;
    // SAFETY: inotify_init1 takes flags only and returns a new descriptor or -1.
    let raw = unsafe { libc::inotify_init1(libc::IN_CLOEXEC) };
    if raw < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `raw` is a descriptor inotify_init1 just returned, owned by nothing else.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    let mask = libc::IN_CREATE
        | libc::IN_DELETE
        | libc::IN_MOVED_FROM
        | libc::IN_MOVED_TO
        | libc::IN_DELETE_SELF;
    // SAFETY: `raw` is the live inotify descriptor `fd` owns and `path` a NUL-terminated
    // string that outlives the call.
    if unsafe { libc::inotify_add_watch(raw, path.as_ptr(), mask) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let mut events = File::from(fd);
    std::thread::Builder::new()
        .name("dir-watch".into())
        .spawn(move || {
            let mut buf = [0u8; 4096];
            // Each read returns one or more events; which entry changed does not matter,
            // the agent looks at the directory itself.
            while matches!(events.read(&mut buf), Ok(n) if n > 0) {
                notify.notify_one();
            }
        })?;
    Ok(())
}
