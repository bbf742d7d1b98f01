//! A worker's sealed life (docs/hostile.md, "A compromised worker"): each worker starts
//! as the first process (pid 1) of a PID namespace of its own, so that when it ends the
//! kernel kills whatever it started, before vgpud sees its exit; and a uid is given to a
//! new worker only while nothing runs under it.
//!
//! `std::process::Command` cannot ask for a namespace at fork, so the worker is started
//! with `clone(CLONE_NEWPID)` here: everything the child needs (paths, arguments,
//! environment, descriptors) is prepared before the clone, and the child only makes
//! system calls (no allocation, no lock) until `execve`. An exec failure comes back
//! through a close-on-exec pipe. Without the privilege for a namespace (vgpud not root)
//! the worker starts without one; its seccomp filter still lets it start threads only.

use std::ffi::{CString, OsStr, OsString};
use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::{Command, ExitStatus};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::{pidfd_open, Identity, Proc, CONTROL_FD};

/// Descriptors a sealed child gets, at their numbers: stdin, stdout, stderr, the control
/// socket, and up to four more.
const MAX_FDS: usize = 8;

/// A worker started by [`spawn_sealed`]: our child, reaped by pid.
#[derive(Debug)]
pub struct SealedChild {
    pid: libc::pid_t,
    /// Whether it runs in a PID namespace of its own.
    pub sealed: bool,
}

impl SealedChild {
    /// Its exit status once it exited (reaped), None while it runs.
    pub fn try_wait(&mut self) -> io::Result<Option<ExitStatus>> {
        let mut status = 0;
        // SAFETY: waitpid on our own child with a valid out-pointer.
        let r = unsafe { libc::waitpid(self.pid, &mut status, libc::WNOHANG) };
        match r {
            0 => Ok(None),
            r if r == self.pid => Ok(Some(ExitStatus::from_raw(status))),
            _ => Err(io::Error::last_os_error()),
        }
    }

    /// Waits for its exit (blocking).
    pub fn wait(&mut self) -> io::Result<ExitStatus> {
        let mut status = 0;
        loop {
            // SAFETY: waitpid on our own child with a valid out-pointer.
            let r = unsafe { libc::waitpid(self.pid, &mut status, 0) };
            if r == self.pid {
                return Ok(ExitStatus::from_raw(status));
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }
}

/// What the child does between the clone and `execve`, all prepared beforehand.
struct Plan {
    path: CString,
    /// Null-terminated pointer arrays into `strings`.
    argv: Vec<*const libc::c_char>,
    envp: Vec<*const libc::c_char>,
    /// What `argv` and `envp` point into.
    _strings: Vec<CString>,
    cwd: Option<CString>,
    /// (source, target) descriptor numbers.
    fds: [(RawFd, RawFd); MAX_FDS],
    identity: Option<Identity>,
    /// The write end of the exec-error pipe (close-on-exec).
    err: RawFd,
    /// Whether the child mounts a /proc of its own PID namespace (it has one, and a
    /// mount namespace of its own).
    own_proc: bool,
}

/// The program's path: as given when it holds a `/`, else found on PATH.
fn program_path(program: &OsStr) -> io::Result<PathBuf> {
    if program.as_bytes().contains(&b'/') {
        return Ok(PathBuf::from(program));
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|d| d.join(program))
        .find(|p| p.is_file())
        .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "not found on PATH"))
}

fn cstring(s: &OsStr) -> io::Result<CString> {
    CString::new(s.as_bytes()).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

/// vgpud's environment with `cmd`'s changes.
fn environment(cmd: &Command) -> io::Result<Vec<CString>> {
    let mut env: Vec<(OsString, OsString)> = std::env::vars_os().collect();
    for (k, v) in cmd.get_envs() {
        env.retain(|(key, _)| key != k);
        if let Some(v) = v {
            env.push((k.to_owned(), v.to_owned()));
        }
    }
    env.into_iter()
        .map(|(k, v)| {
            let mut kv = k;
            kv.push("=");
            kv.push(v);
            cstring(&kv)
        })
        .collect()
}

/// The child's side: never returns. Only system calls, on memory prepared before the
/// clone.
fn child(plan: &Plan) -> ! {
    // SAFETY: plain system calls on integers and on the C strings and pointer arrays
    // `plan` prepared before the clone; this process has one thread and allocates nothing.
    unsafe {
        let fail = |step: i32| -> ! {
            let errno = *libc::__errno_location();
            let msg = [step, errno];
            libc::write(plan.err, msg.as_ptr().cast(), std::mem::size_of_val(&msg));
            libc::_exit(127)
        };
        if libc::setsid() < 0 {
            fail(1);
        }
        if plan.own_proc {
            // Pid 1 of a new PID namespace and a mount namespace of its own: a /proc of
            // this namespace, so that the process's own pid (1) and /proc/self agree (the
            // CUDA driver's cuInit fails with CUDA_ERROR_OPERATING_SYSTEM when they do
            // not). Mounts stay private to the namespace. Best effort: without it a
            // worker runs as before, and only a CUDA worker notices.
            let none = c"none".as_ptr();
            let root = c"/".as_ptr();
            let proc_ = c"proc".as_ptr();
            let target = c"/proc".as_ptr();
            if libc::mount(
                none,
                root,
                std::ptr::null(),
                libc::MS_REC | libc::MS_PRIVATE,
                std::ptr::null(),
            ) == 0
            {
                libc::mount(
                    proc_,
                    target,
                    proc_,
                    libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                    std::ptr::null(),
                );
            }
        }
        // Every source out of the way of every target first, then each to its number.
        let mut moved = [-1 as RawFd; MAX_FDS];
        for (m, (src, _)) in moved.iter_mut().zip(plan.fds.iter()) {
            if *src >= 0 {
                *m = libc::fcntl(*src, libc::F_DUPFD_CLOEXEC, 100);
                if *m < 0 {
                    fail(2);
                }
            }
        }
        for (m, (_, target)) in moved.iter().zip(plan.fds.iter()) {
            if *m >= 0 && libc::dup2(*m, *target) < 0 {
                fail(3);
            }
        }
        if let Some(cwd) = &plan.cwd {
            if libc::chdir(cwd.as_ptr()) != 0 {
                fail(4);
            }
        }
        if let Some(id) = plan.identity {
            // The raw calls: glibc's wrappers would signal the threads it believes the
            // process has (vgpud's, which this child does not have).
            if libc::syscall(libc::SYS_setgroups, 0, std::ptr::null::<libc::gid_t>()) != 0
                || libc::syscall(libc::SYS_setgid, id.gid) != 0
                || libc::syscall(libc::SYS_setuid, id.uid) != 0
            {
                fail(5);
            }
        }
        // The child starts with no signal blocked and SIGPIPE at its default (vgpud
        // ignores it; an ignored signal stays ignored across execve).
        let mut none: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut none);
        libc::sigprocmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        libc::execve(plan.path.as_ptr(), plan.argv.as_ptr(), plan.envp.as_ptr());
        fail(6)
    }
}

/// Whether a PID namespace could not be had (logged once).
static NO_NAMESPACE: AtomicBool = AtomicBool::new(false);

/// Starts `cmd` (its program, arguments, environment changes and working directory; its
/// stdin and stdout /dev/null, its stderr `stderr`) as pid 1 of a PID namespace of its
/// own, in a session of its own, as `identity`, with `control` at [`CONTROL_FD`] and
/// each `(descriptor, number)` of `extra` at that number. Blocking: run it off the
/// runtime.
pub fn spawn_sealed(
    cmd: &Command,
    stderr: &File,
    control: Option<&OwnedFd>,
    extra: &[(&OwnedFd, RawFd)],
    identity: Option<Identity>,
) -> io::Result<(SealedChild, Proc)> {
    if extra.len() > MAX_FDS - 4 {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    let null = File::options().read(true).write(true).open("/dev/null")?;
    let mut fds = [(-1 as RawFd, -1 as RawFd); MAX_FDS];
    fds[0] = (null.as_raw_fd(), 0);
    fds[1] = (null.as_raw_fd(), 1);
    fds[2] = (stderr.as_raw_fd(), 2);
    if let Some(c) = control {
        fds[3] = (c.as_raw_fd(), CONTROL_FD);
    }
    for (slot, (fd, n)) in fds[4..].iter_mut().zip(extra) {
        *slot = (fd.as_raw_fd(), *n);
    }
    let path = program_path(cmd.get_program())?;
    let mut args = vec![cstring(cmd.get_program())?];
    for a in cmd.get_args() {
        args.push(cstring(a)?);
    }
    let envs = environment(cmd)?;
    let pointers = |v: &[CString]| {
        let mut p: Vec<*const libc::c_char> = v.iter().map(|s| s.as_ptr()).collect();
        p.push(std::ptr::null());
        p
    };
    let (argv, envp) = (pointers(&args), pointers(&envs));
    args.extend(envs);
    let (err_read, err_write) = pipe()?;
    let mut plan = Plan {
        path: cstring(path.as_os_str())?,
        argv,
        envp,
        _strings: args,
        cwd: cmd
            .get_current_dir()
            .map(|d| cstring(d.as_os_str()))
            .transpose()?,
        fds,
        identity,
        err: err_write.as_raw_fd(),
        own_proc: false,
    };
    let (pid, sealed) = {
        let mut sealed = !NO_NAMESPACE.load(Ordering::Relaxed);
        plan.own_proc = sealed;
        let mut pid = if sealed {
            clone(libc::CLONE_NEWPID | libc::CLONE_NEWNS)
        } else {
            -1
        };
        if pid < 0 && sealed {
            let e = io::Error::last_os_error();
            if !matches!(
                e.raw_os_error(),
                Some(libc::EPERM | libc::EINVAL | libc::ENOSPC)
            ) {
                return Err(e);
            }
            if !NO_NAMESPACE.swap(true, Ordering::Relaxed) {
                tracing::warn!(error = %e,
                    "cannot start workers in PID namespaces of their own (vgpud is not root?): a worker's seccomp filter alone keeps it from starting processes");
            }
            sealed = false;
        }
        if !sealed {
            plan.own_proc = false;
            pid = clone(0);
        }
        if pid == 0 {
            child(&plan);
        }
        (pid, sealed)
    };
    drop(plan);
    if pid < 0 {
        return Err(io::Error::last_os_error());
    }
    drop(err_write);
    let mut child = SealedChild { pid, sealed };
    let mut msg = [0u8; 8];
    let mut got = 0;
    let mut f = File::from(err_read);
    while got < msg.len() {
        match f.read(&mut msg[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    if got > 0 {
        let _ = child.wait();
        let step = i32::from_ne_bytes([msg[0], msg[1], msg[2], msg[3]]);
        let errno = i32::from_ne_bytes([msg[4], msg[5], msg[6], msg[7]]);
        let what = [
            "",
            "setsid",
            "a descriptor",
            "a descriptor",
            "chdir",
            "its identity",
            "exec",
        ];
        let e = io::Error::from_raw_os_error(errno);
        return Err(io::Error::new(
            e.kind(),
            format!(
                "{} failed in the new process: {e}",
                what.get(usize::try_from(step).unwrap_or(0))
                    .unwrap_or(&"start")
            ),
        ));
    }
    let upid = u32::try_from(pid).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    let pidfd = match pidfd_open(upid) {
        Ok(fd) => fd,
        Err(e) => {
            // SAFETY: kill of our own child, not yet reaped, so its pid is still its.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            let _ = child.wait();
            return Err(e);
        }
    };
    let proc = Proc {
        pid: upid,
        start_time: super::start_time(upid).unwrap_or(0),
        pidfd: std::sync::Arc::new(pidfd),
    };
    Ok((child, proc))
}

/// A fork-like clone with `flags` (and SIGCHLD): the child's 0, the parent's pid, or -1.
fn clone(flags: libc::c_int) -> libc::pid_t {
    // SAFETY: clone with a null stack and no CLONE_VM behaves as fork: the child gets a
    // copy of this thread only and runs `child`, which makes system calls alone.
    let r = unsafe {
        libc::syscall(
            libc::SYS_clone,
            libc::c_long::from(flags | libc::SIGCHLD),
            0,
            0,
            0,
            0,
        )
    };
    libc::pid_t::try_from(r).unwrap_or(-1)
}

fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: pipe2 writes two descriptors into `fds`.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both descriptors were just created and are owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Process `pid`'s session id (`/proc/PID/stat` field 6), None when it is gone (or a
/// zombie: it runs nothing any more).
fn session_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 1..];
    // Fields after comm: state (3), ppid (4), pgrp (5), session (6).
    let mut fields = rest.split_whitespace();
    if matches!(fields.next(), Some("Z" | "X") | None) {
        return None;
    }
    fields.nth(2)?.parse().ok()
}

fn runs_as(pid: u32, uid: u32) -> bool {
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
        return false;
    };
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .is_some_and(|ids| {
            ids.split_whitespace()
                .take(2)
                .any(|v| v.parse::<u32>() == Ok(uid))
        })
}

/// The processes left of a worker that was `leader` (its session: a worker starts one,
/// and its filter has no `setsid` to leave it) running as `uid`.
fn left_of(leader: u32, uid: u32) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| session_of(*pid) == Some(leader) && runs_as(*pid, uid))
        .collect()
}

/// Kills whatever is left of worker `leader` (which exited) running as `uid`, and waits
/// until nothing is (false when something still is after `limit`): nothing of a worker
/// meets the next holder of its uid. In a PID namespace there is nothing left (the kernel
/// killed it with the worker); without one (vgpud not root) this is what ends a process a
/// worker started before its filter went on. Each process is signalled through a pidfd
/// opened before its session and uid are checked again, so a reused pid is never hit.
pub fn clear_leftovers(leader: u32, uid: u32, limit: Duration) -> bool {
    let end = Instant::now() + limit;
    loop {
        let left = left_of(leader, uid);
        if left.is_empty() {
            return true;
        }
        if Instant::now() > end {
            return false;
        }
        for pid in left {
            let Ok(fd) = pidfd_open(pid) else { continue };
            if session_of(pid) == Some(leader) && runs_as(pid, uid) {
                tracing::warn!(pid, uid, worker = leader, "killing a process a worker left");
                // SAFETY: pidfd_send_signal with a pidfd we own and a null siginfo.
                unsafe {
                    libc::syscall(
                        libc::SYS_pidfd_send_signal,
                        fd.as_raw_fd(),
                        libc::SIGKILL,
                        std::ptr::null::<libc::siginfo_t>(),
                        0,
                    )
                };
            }
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The uids (real and effective) every process runs as now.
pub fn running_uids() -> std::collections::BTreeSet<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Default::default();
    };
    dir.flatten()
        .filter(|e| {
            e.file_name()
                .to_str()
                .is_some_and(|n| n.parse::<u32>().is_ok())
        })
        .filter_map(|e| std::fs::read_to_string(e.path().join("status")).ok())
        .flat_map(|status| {
            status
                .lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .map(|ids| {
                    ids.split_whitespace()
                        .take(2)
                        .filter_map(|v| v.parse::<u32>().ok())
                        .collect::<Vec<_>>()
                })
                .unwrap_or_default()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::os::unix::process::CommandExt;

    use super::*;

    fn root() -> bool {
        // SAFETY: geteuid has no preconditions and cannot fail.
        unsafe { libc::geteuid() == 0 }
    }

    fn scratch(name: &str) -> PathBuf {
        std::env::temp_dir().join(format!("vgpud-seal-{}-{name}", std::process::id()))
    }

    #[test]
    fn what_a_sealed_child_starts_ends_with_it() {
        if !root() {
            eprintln!("SKIPPED: a PID namespace needs root");
            return;
        }
        let log = scratch("log");
        let err = File::create(&log).expect("log");
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "sleep 30 & echo $$ >&2; exit 0"]);
        let (mut child, proc) = spawn_sealed(&cmd, &err, None, &[], None).expect("spawn");
        assert!(child.sealed, "root gets a PID namespace");
        assert!(child.wait().expect("wait").success());
        // It was pid 1 of its namespace, and the sleep it left went with it.
        let said = std::fs::read_to_string(&log).expect("log");
        assert_eq!(said.trim(), "1");
        assert!(
            left_of(proc.pid, 0).is_empty(),
            "{:?}",
            left_of(proc.pid, 0)
        );
        std::fs::remove_file(&log).expect("rm");
    }

    #[test]
    fn a_program_that_cannot_start_is_an_error() {
        let err = File::create(scratch("err")).expect("file");
        let cmd = Command::new("/nonexistent/vgpu-worker");
        let e = spawn_sealed(&cmd, &err, None, &[], None).expect_err("no such program");
        assert!(e.to_string().contains("exec"), "{e}");
        let _ = std::fs::remove_file(scratch("err"));
    }

    #[test]
    fn what_a_worker_left_in_its_session_is_killed() {
        // A process that leaves a child behind in its session, started without a
        // namespace (as for an unprivileged vgpud).
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "sleep 30 & exit 0"]);
        // SAFETY: setsid is async-signal-safe and takes no arguments.
        unsafe {
            cmd.pre_exec(|| {
                if libc::setsid() < 0 {
                    return Err(io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let mut c = cmd.spawn().expect("spawn");
        let leader = c.id();
        assert!(c.wait().expect("wait").success());
        // SAFETY: geteuid has no preconditions and cannot fail.
        let uid = unsafe { libc::geteuid() };
        assert_eq!(left_of(leader, uid).len(), 1, "the sleep is left");
        assert!(clear_leftovers(leader, uid, Duration::from_secs(2)));
        assert!(left_of(leader, uid).is_empty());
    }
}
