//! Child processes: spawning them so that they outlive vgpud (their own session, no
//! parent-death signal: a vgpud restart never touches a VM), under their own identity and
//! with inherited descriptors at fixed numbers; pidfds for race-free signals and for
//! supervising processes a previous vgpud started (adoption, checked against their start
//! time so a reused pid is never mistaken for them); prompt reaping on the runtime.
//! Workers start sealed (`seal.rs`): pid 1 of a PID namespace of their own, and what a
//! worker leaves in its session is killed before its uid serves the next one.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, ExitStatus};
use std::sync::Arc;

use tokio::io::unix::AsyncFd;

mod seal;
pub use seal::{running_uids, SealedChild};

/// The descriptor number a worker's control socket gets in the child.
pub const CONTROL_FD: RawFd = 3;
/// Where a worker finds its grant page and the scheduler's doorbell (`--grant-fds 4,5`).
pub const GRANT_PAGE_FD: RawFd = 4;
pub const GRANT_DOORBELL_FD: RawFd = 5;

/// A process we can signal without pid-reuse races: a child, or one a previous vgpud
/// started (adopted).
#[derive(Clone, Debug)]
pub struct Proc {
    pub pid: u32,
    /// When it started, in clock ticks since boot (`/proc/PID/stat` field 22): with the
    /// pid, what identifies it across a vgpud restart.
    pub start_time: u64,
    pidfd: Arc<OwnedFd>,
}

/// The identity a child runs under (a worker's own uid and gid).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Identity {
    pub uid: u32,
    pub gid: u32,
}

/// Process `pid`'s start time, or None when it is gone (or a zombie).
pub fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // "pid (comm) state ppid ..." where comm may hold spaces and parentheses.
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    let state = fields.next()?;
    if state == "Z" || state == "X" {
        return None;
    }
    // Fields after comm start at 3 (state); start time is field 22.
    fields.nth(22 - 4)?.parse().ok()
}

/// Takes over supervision of process `pid` that a previous vgpud started, if it is still
/// the same process (its start time matches): the pidfd is opened first and the start
/// time read after, so the pidfd cannot refer to a process that reused the pid.
pub fn adopt(pid: u32, started: u64) -> Option<Proc> {
    let pidfd = pidfd_open(pid).ok()?;
    if start_time(pid)? != started {
        return None;
    }
    Some(Proc {
        pid,
        start_time: started,
        pidfd: Arc::new(pidfd),
    })
}

/// Waits until an adopted process exits (it is not our child: its exit status is its
/// parent's, so none is known here).
pub async fn watch(proc: &Proc) {
    let pidfd = PidFd(proc.pidfd.clone());
    // SAFETY: `PidFd` holds an `Arc<OwnedFd>`, so the descriptor stays open for as long as
    // the `AsyncFd` that registers it lives.
    let registered =
        unsafe { AsyncFd::register_with_interest(pidfd, tokio::io::Interest::READABLE) };
    match registered {
        Ok(afd) => {
            let _ = afd.readable().await;
        }
        Err(e) => {
            tracing::warn!(pid = proc.pid, error = %e, "cannot watch the pidfd; polling instead");
            while start_time(proc.pid) == Some(proc.start_time) {
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
        }
    }
}

impl Proc {
    /// Sends `sig`; a process that already exited is not an error.
    pub fn signal(&self, sig: i32) {
        // SAFETY: pidfd_send_signal takes a pidfd we own, a signal number, a null siginfo
        // and zero flags; it touches no memory of ours.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                self.pidfd.as_raw_fd(),
                sig,
                std::ptr::null::<libc::siginfo_t>(),
                0,
            )
        };
        if rc != 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::ESRCH) {
                tracing::warn!(pid = self.pid, sig, error = %e, "cannot signal child");
            }
        }
    }
}

struct PidFd(Arc<OwnedFd>);

impl AsRawFd for PidFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

fn pidfd_open(pid: u32) -> io::Result<OwnedFd> {
    let pid = libc::pid_t::try_from(pid).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, libc::PIDFD_NONBLOCK) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    let fd = RawFd::try_from(fd).map_err(|_| io::Error::from_raw_os_error(libc::EBADF))?;
    // SAFETY: the kernel just returned this descriptor to us; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// A connected `SOCK_STREAM` unix socket pair, close-on-exec.
pub fn socketpair() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: socketpair writes two descriptors into `fds`, a valid 2-element array.
    let rc = unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_STREAM | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both descriptors were just created by socketpair and are owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Spawns `cmd` in a session of its own and without a parent-death signal: it outlives
/// vgpud (a restart or an upgrade of vgpud leaves VMs and workers running; the next vgpud
/// adopts them). When `control` is given, the child gets that descriptor as
/// [`CONTROL_FD`]; each `(descriptor, number)` of `extra` it gets at that number (the
/// grant page and doorbell, say); it runs as `identity` (no supplementary groups) when
/// given.
pub fn spawn_with_fds(
    cmd: &mut Command,
    control: Option<&OwnedFd>,
    extra: &[(&OwnedFd, RawFd)],
    identity: Option<Identity>,
) -> io::Result<(Child, Proc)> {
    const MAX_EXTRA: usize = 4;
    if extra.len() > MAX_EXTRA {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    let mut extra_raw = [(-1 as RawFd, -1 as RawFd); MAX_EXTRA];
    for (slot, (fd, target)) in extra_raw.iter_mut().zip(extra) {
        *slot = (fd.as_raw_fd(), *target);
    }
    let control_raw = control.map(AsRawFd::as_raw_fd);
    // SAFETY: the closure runs in the child between fork and exec and calls only
    // async-signal-safe functions (setsid, dup2, fcntl, setgroups, setgid, setuid) on
    // plain integers.
    unsafe {
        cmd.pre_exec(move || {
            // Its own session: a signal to vgpud's process group (a terminal's ^C, a
            // service manager stopping vgpud) does not reach it.
            if libc::setsid() < 0 {
                return Err(io::Error::last_os_error());
            }
            // Move every extra descriptor out of the way of the target numbers first, so
            // one dup2 cannot clobber another's source.
            let mut moved = [-1 as RawFd; MAX_EXTRA];
            for (m, (fd, _)) in moved.iter_mut().zip(extra_raw.iter()) {
                if *fd >= 0 {
                    *m = libc::fcntl(*fd, libc::F_DUPFD_CLOEXEC, 100);
                    if *m < 0 {
                        return Err(io::Error::last_os_error());
                    }
                }
            }
            for (m, (_, target)) in moved.iter().zip(extra_raw.iter()) {
                if *m >= 0 && libc::dup2(*m, *target) < 0 {
                    return Err(io::Error::last_os_error());
                }
            }
            if let Some(fd) = control_raw {
                if fd == CONTROL_FD {
                    let flags = libc::fcntl(fd, libc::F_GETFD);
                    if flags < 0 || libc::fcntl(fd, libc::F_SETFD, flags & !libc::FD_CLOEXEC) < 0 {
                        return Err(io::Error::last_os_error());
                    }
                } else if libc::dup2(fd, CONTROL_FD) < 0 {
                    return Err(io::Error::last_os_error());
                }
            }
            if let Some(id) = identity {
                if libc::setgroups(0, std::ptr::null()) != 0
                    || libc::setgid(id.gid) != 0
                    || libc::setuid(id.uid) != 0
                {
                    return Err(io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    let child = cmd.spawn()?;
    let pidfd = match pidfd_open(child.id()) {
        Ok(fd) => fd,
        Err(e) => {
            let mut child = child;
            let _ = child.kill();
            let _ = child.wait();
            return Err(e);
        }
    };
    let proc = Proc {
        pid: child.id(),
        start_time: start_time(child.id()).unwrap_or(0),
        pidfd: Arc::new(pidfd),
    };
    Ok((child, proc))
}

/// [`spawn_with_fds`] on the blocking pool, taking its descriptors by value: fork and exec
/// never stall the runtime, so launches of different VMs proceed side by side. The
/// descriptors are closed here once the child has its copies.
pub async fn spawn_off_runtime(
    mut cmd: Command,
    control: Option<OwnedFd>,
    extra: Vec<(OwnedFd, RawFd)>,
    identity: Option<Identity>,
) -> io::Result<(Child, Proc)> {
    tokio::task::spawn_blocking(move || {
        let refs: Vec<(&OwnedFd, RawFd)> = extra.iter().map(|(fd, n)| (fd, *n)).collect();
        spawn_with_fds(&mut cmd, control.as_ref(), &refs, identity)
    })
    .await
    .map_err(|e| io::Error::other(format!("the spawning task failed: {e}")))?
}

/// [`seal::spawn_sealed`] on the blocking pool (a worker: pid 1 of a PID namespace of its
/// own, its stderr `stderr`), taking its descriptors by value.
pub async fn spawn_sealed_off_runtime(
    cmd: Command,
    stderr: std::fs::File,
    control: Option<OwnedFd>,
    extra: Vec<(OwnedFd, RawFd)>,
    identity: Option<Identity>,
) -> io::Result<(SealedChild, Proc)> {
    tokio::task::spawn_blocking(move || {
        let refs: Vec<(&OwnedFd, RawFd)> = extra.iter().map(|(fd, n)| (fd, *n)).collect();
        seal::spawn_sealed(&cmd, &stderr, control.as_ref(), &refs, identity)
    })
    .await
    .map_err(|e| io::Error::other(format!("the spawning task failed: {e}")))?
}

/// Ends whatever is left of worker `pid` (reaped) running as `identity`'s uid (vgpud's
/// when none), off the runtime: see [`seal::clear_leftovers`].
pub async fn clear_leftovers(pid: u32, identity: Option<Identity>) {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let uid = identity.map_or_else(|| unsafe { libc::geteuid() }, |i| i.uid);
    let limit = std::time::Duration::from_secs(2);
    let done = tokio::task::spawn_blocking(move || seal::clear_leftovers(pid, uid, limit)).await;
    if !matches!(done, Ok(true)) {
        tracing::error!(pid, uid, "processes a worker left would not die");
    }
}

/// A child process vgpud reaps: one `Command` started, or a sealed worker.
pub trait Reapable: Send {
    fn try_wait(&mut self) -> io::Result<Option<ExitStatus>>;
    fn wait(&mut self) -> io::Result<ExitStatus>;
}

impl Reapable for Child {
    fn try_wait(&mut self) -> io::Result<Option<ExitStatus>> {
        Child::try_wait(self)
    }
    fn wait(&mut self) -> io::Result<ExitStatus> {
        Child::wait(self)
    }
}

impl Reapable for SealedChild {
    fn try_wait(&mut self) -> io::Result<Option<ExitStatus>> {
        SealedChild::try_wait(self)
    }
    fn wait(&mut self) -> io::Result<ExitStatus> {
        SealedChild::wait(self)
    }
}

/// Waits until `child` exits and reaps it. Wakes as soon as the kernel reports the exit
/// (the pidfd becomes readable), so a `kill -9` is seen within milliseconds.
pub async fn reap(mut child: impl Reapable, proc: &Proc) -> ExitStatus {
    let pidfd = PidFd(proc.pidfd.clone());
    // SAFETY: `PidFd` holds an `Arc<OwnedFd>`, so the descriptor stays open for as long as
    // the `AsyncFd` that registers it lives.
    let registered =
        unsafe { AsyncFd::register_with_interest(pidfd, tokio::io::Interest::READABLE) };
    match registered {
        Ok(afd) => {
            let _ = afd.readable().await;
        }
        Err(e) => {
            tracing::warn!(pid = proc.pid, error = %e, "cannot watch the pidfd; polling instead");
            loop {
                if let Ok(Some(status)) = child.try_wait() {
                    return status;
                }
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
        }
    }
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return status,
            // Readable means exited; a zombie is reapable at once. Spurious: poll briefly.
            Ok(None) => tokio::time::sleep(std::time::Duration::from_millis(1)).await,
            Err(e) => {
                tracing::warn!(pid = proc.pid, error = %e, "waitpid failed; trying a blocking wait");
                return child.wait().unwrap_or_else(|_| {
                    std::os::unix::process::ExitStatusExt::from_raw(libc::SIGKILL)
                });
            }
        }
    }
}

/// `exit code 3` / `killed by signal 9 (SIGKILL)`.
pub fn describe(status: &ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(c), _) => format!("exit code {c}"),
        (None, Some(s)) => format!("killed by signal {s}{}", signal_name(s)),
        _ => format!("{status}"),
    }
}

fn signal_name(s: i32) -> &'static str {
    match s {
        libc::SIGKILL => " (SIGKILL)",
        libc::SIGTERM => " (SIGTERM)",
        libc::SIGSEGV => " (SIGSEGV)",
        libc::SIGABRT => " (SIGABRT)",
        libc::SIGINT => " (SIGINT)",
        libc::SIGBUS => " (SIGBUS)",
        libc::SIGSYS => " (SIGSYS)",
        _ => "",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adoption_checks_the_start_time() {
        let me = std::process::id();
        let t = start_time(me).expect("our own start time");
        assert!(adopt(me, t).is_some(), "the same process");
        assert!(adopt(me, t + 1).is_none(), "a reused pid is not adopted");
        assert!(start_time(u32::MAX).is_none());
    }
}
