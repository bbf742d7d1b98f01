//! The worker's own part of its sandbox (vgpud's part: its identity and its private
//! directory, see `vgpud/src/daemon/workers.rs`): once its start-up is done (backend
//! built, sockets bound, descriptors received) the worker makes itself non-dumpable, sets
//! `no_new_privs`, and installs a seccomp filter that allows only the system calls serving
//! a guest needs. Anything else kills the whole worker with SIGSYS (`--seccomp kill`),
//! or is logged by the kernel and allowed (`--seccomp log`, to find a missing one).
//!
//! Not on the list, on purpose: `socket`, `connect`, `bind`, `listen` (the worker never
//! opens a new connection: vgpud comes to it), `rename*`, `link*`, `symlink*`, `mkdir*`
//! (so it cannot put a socket of its own where another vGPU's vmm will connect, even
//! where workers share a uid), `execve`, `ptrace`, `process_vm_readv/writev`, `kill` (it
//! signals nobody), `mount`, `unshare`, `setns`, `set*uid`, `bpf`, `keyctl`, `pidfd_*`.

use std::collections::BTreeMap;

use seccompiler::{BpfProgram, SeccompAction, SeccompFilter, SeccompRule};

/// What a seccomp violation does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum SeccompMode {
    /// No filter.
    Off,
    /// Violations are logged by the kernel (audit log) and allowed: for finding what a
    /// filter misses.
    Log,
    /// A violation kills the worker with SIGSYS.
    Kill,
}

/// Why the sandbox could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    #[error("prctl({what}) failed: {source}")]
    Prctl {
        what: &'static str,
        source: std::io::Error,
    },
    #[error("cannot build the seccomp filter: {0}")]
    Filter(String),
    #[error("cannot install the seccomp filter: {0}")]
    Install(String),
}

/// The system calls a worker makes after its start-up, on the sim and the cuda backend.
/// Found with `strace -f` of workers under the end-to-end tests: a sim worker serving a
/// gpu-load guest made 35 distinct calls after `seccomp` (read, write, futex, epoll_*,
/// recvmsg/sendmsg for vhost-user, mmap/munmap/mprotect/madvise, memfd_create, ftruncate,
/// fallocate for device memory, clone3 and its thread set-up, accept4, shutdown, unlink,
/// ...); the rest is what storage (io_uring, openat), migration (a second backend), the
/// reconnect (poll, setsockopt) and the CUDA driver (ioctls on its device files, mappings,
/// its own threads, /proc and /sys reads) call.
fn allowed() -> Vec<i64> {
    let mut v = vec![
        // I/O on descriptors it holds.
        libc::SYS_read,
        libc::SYS_write,
        libc::SYS_readv,
        libc::SYS_writev,
        libc::SYS_pread64,
        libc::SYS_pwrite64,
        libc::SYS_preadv,
        libc::SYS_pwritev,
        libc::SYS_close,
        libc::SYS_lseek,
        libc::SYS_fstat,
        libc::SYS_newfstatat,
        libc::SYS_statx,
        libc::SYS_fcntl,
        libc::SYS_dup,
        libc::SYS_dup3,
        libc::SYS_ioctl,
        libc::SYS_ftruncate,
        libc::SYS_fallocate,
        libc::SYS_fsync,
        libc::SYS_fdatasync,
        libc::SYS_getdents64,
        libc::SYS_readlinkat,
        libc::SYS_faccessat,
        libc::SYS_faccessat2,
        // Storage namespaces are opened when the guest attaches them; the CUDA driver
        // opens its device files lazily. Which files: the worker's identity decides.
        libc::SYS_openat,
        libc::SYS_unlinkat,
        // Memory: guest RAM and device memory mappings, memfds for sim device memory.
        libc::SYS_mmap,
        libc::SYS_munmap,
        libc::SYS_mprotect,
        libc::SYS_mremap,
        libc::SYS_madvise,
        libc::SYS_mincore,
        libc::SYS_msync,
        libc::SYS_mlock,
        libc::SYS_munlock,
        libc::SYS_brk,
        libc::SYS_memfd_create,
        libc::SYS_membarrier,
        // Threads, futexes, signals to itself.
        libc::SYS_clone,
        libc::SYS_clone3,
        libc::SYS_futex,
        libc::SYS_set_robust_list,
        libc::SYS_get_robust_list,
        libc::SYS_rseq,
        libc::SYS_set_tid_address,
        libc::SYS_exit,
        libc::SYS_exit_group,
        libc::SYS_gettid,
        libc::SYS_getpid,
        libc::SYS_getppid,
        libc::SYS_getuid,
        libc::SYS_geteuid,
        libc::SYS_getgid,
        libc::SYS_getegid,
        libc::SYS_tgkill,
        libc::SYS_rt_sigaction,
        libc::SYS_rt_sigprocmask,
        libc::SYS_rt_sigreturn,
        libc::SYS_rt_sigtimedwait,
        libc::SYS_sigaltstack,
        libc::SYS_restart_syscall,
        libc::SYS_sched_yield,
        libc::SYS_sched_getaffinity,
        libc::SYS_sched_setaffinity,
        libc::SYS_sched_getparam,
        libc::SYS_sched_getscheduler,
        libc::SYS_prctl,
        libc::SYS_prlimit64,
        libc::SYS_uname,
        libc::SYS_sysinfo,
        libc::SYS_getcwd,
        // Time.
        libc::SYS_nanosleep,
        libc::SYS_clock_nanosleep,
        libc::SYS_clock_gettime,
        libc::SYS_clock_getres,
        libc::SYS_gettimeofday,
        libc::SYS_getrandom,
        // Event loops: vhost-user's epoll threads, eventfds for kicks and calls, timers.
        libc::SYS_epoll_create1,
        libc::SYS_epoll_ctl,
        libc::SYS_epoll_pwait,
        libc::SYS_epoll_pwait2,
        libc::SYS_eventfd2,
        libc::SYS_timerfd_create,
        libc::SYS_timerfd_settime,
        libc::SYS_ppoll,
        libc::SYS_pselect6,
        libc::SYS_pipe2,
        // The sockets it already has: the vhost-user connection (descriptors ride with
        // its messages), the control channel, and vgpud coming back on the control socket.
        libc::SYS_accept4,
        libc::SYS_recvmsg,
        libc::SYS_sendmsg,
        libc::SYS_recvfrom,
        libc::SYS_sendto,
        libc::SYS_shutdown,
        libc::SYS_getsockopt,
        libc::SYS_setsockopt,
        libc::SYS_getsockname,
        libc::SYS_getpeername,
        // Storage: the emulated NVMe controller's io_uring.
        libc::SYS_io_uring_setup,
        libc::SYS_io_uring_enter,
        libc::SYS_io_uring_register,
        // The CUDA driver: NUMA placement of host memory, its threads' priorities. (Its
        // JIT cache on disk is off for workers: vgpud sets CUDA_CACHE_DISABLE=1.)
        libc::SYS_get_mempolicy,
        libc::SYS_set_mempolicy,
        libc::SYS_mbind,
        libc::SYS_mlock2,
        libc::SYS_sched_get_priority_max,
        libc::SYS_sched_get_priority_min,
        libc::SYS_sched_setscheduler,
        libc::SYS_sched_setparam,
        libc::SYS_getpriority,
        libc::SYS_setpriority,
        libc::SYS_getrusage,
        libc::SYS_times,
        libc::SYS_getcpu,
        libc::SYS_fstatfs,
        libc::SYS_statfs,
        libc::SYS_flock,
        libc::SYS_inotify_init1,
        libc::SYS_inotify_add_watch,
        libc::SYS_inotify_rm_watch,
    ];
    #[cfg(target_arch = "x86_64")]
    v.extend([
        libc::SYS_open,
        libc::SYS_stat,
        libc::SYS_lstat,
        libc::SYS_access,
        libc::SYS_readlink,
        libc::SYS_unlink,
        libc::SYS_poll,
        libc::SYS_select,
        libc::SYS_epoll_wait,
        libc::SYS_accept,
        libc::SYS_pipe,
        libc::SYS_dup2,
        libc::SYS_arch_prctl,
        libc::SYS_getdents,
        libc::SYS_eventfd,
    ]);
    v
}

fn arch() -> Result<seccompiler::TargetArch, SandboxError> {
    std::env::consts::ARCH
        .try_into()
        .map_err(|e: seccompiler::BackendError| SandboxError::Filter(e.to_string()))
}

/// The compiled filter for `mode` (`None` for `off`).
pub fn filter(mode: SeccompMode) -> Result<Option<BpfProgram>, SandboxError> {
    let mismatch = match mode {
        SeccompMode::Off => return Ok(None),
        SeccompMode::Log => SeccompAction::Log,
        SeccompMode::Kill => SeccompAction::KillProcess,
    };
    let rules: BTreeMap<i64, Vec<SeccompRule>> =
        allowed().into_iter().map(|nr| (nr, Vec::new())).collect();
    let f = SeccompFilter::new(rules, mismatch, SeccompAction::Allow, arch()?)
        .map_err(|e| SandboxError::Filter(e.to_string()))?;
    let prog: BpfProgram = f
        .try_into()
        .map_err(|e: seccompiler::BackendError| SandboxError::Filter(e.to_string()))?;
    Ok(Some(prog))
}

fn prctl(what: &'static str, option: libc::c_int, arg: libc::c_ulong) -> Result<(), SandboxError> {
    // SAFETY: prctl with an integer option and integer arguments; it touches no memory of
    // ours for these options (PR_SET_DUMPABLE, PR_SET_NO_NEW_PRIVS).
    if unsafe { libc::prctl(option, arg, 0, 0, 0) } != 0 {
        return Err(SandboxError::Prctl {
            what,
            source: std::io::Error::last_os_error(),
        });
    }
    Ok(())
}

/// Not dumpable (no core dumps, no ptrace or /proc/PID/mem by its own uid) and no new
/// privileges (no set-uid binary can raise it; also what an unprivileged seccomp filter
/// needs). Done as soon as the worker starts.
pub fn harden() -> Result<(), SandboxError> {
    prctl("PR_SET_DUMPABLE", libc::PR_SET_DUMPABLE, 0)?;
    prctl("PR_SET_NO_NEW_PRIVS", libc::PR_SET_NO_NEW_PRIVS, 1)
}

/// Installs the filter on every thread of the worker (TSYNC), and on every thread it
/// starts from now on.
pub fn lock_down(mode: SeccompMode) -> Result<(), SandboxError> {
    let Some(prog) = filter(mode)? else {
        tracing::warn!("--seccomp off: the worker runs without a system call filter");
        return Ok(());
    };
    seccompiler::apply_filter_all_threads(&prog)
        .map_err(|e| SandboxError::Install(e.to_string()))?;
    tracing::info!(mode = ?mode, syscalls = allowed().len(), "seccomp filter installed");
    Ok(())
}

/// Test hook for the sandbox's end-to-end test (`VGPU_WORKER_PROBE=ID;REST_SOCKET;DIR`):
/// the worker of vGPU `ID` tries what a compromised worker would (connect to vgpud's REST
/// socket, open another vGPU's directory) and logs what happened, then, once its filter
/// is on, makes a system call outside it. Every attempt is expected to be refused: the
/// log lines say so, and the last one kills the worker (SIGSYS).
pub mod probe {
    use std::path::Path;

    /// The probe asked for vGPU `vgpu_id`: (REST socket, another vGPU's directory).
    pub fn wanted(vgpu_id: u32) -> Option<(String, String)> {
        let spec = std::env::var("VGPU_WORKER_PROBE").ok()?;
        let mut parts = spec.splitn(3, ';');
        let id: u32 = parts.next()?.trim().parse().ok()?;
        if id != vgpu_id {
            return None;
        }
        Some((parts.next()?.to_owned(), parts.next()?.to_owned()))
    }

    fn outcome<T>(r: std::io::Result<T>) -> String {
        match r {
            Ok(_) => "ALLOWED".into(),
            Err(e) => format!("refused ({e})"),
        }
    }

    /// The attempts made before the filter is on (the identity and the directories).
    pub fn before_filter(rest: &str, other_dir: &str) {
        let c = outcome(std::os::unix::net::UnixStream::connect(rest));
        tracing::warn!("probe: connect to the REST socket {rest}: {c}");
        let o = outcome(std::fs::read_dir(Path::new(other_dir)));
        tracing::warn!("probe: open another vGPU's directory {other_dir}: {o}");
        let s = outcome(std::fs::File::open(Path::new(other_dir).join("secret")));
        tracing::warn!("probe: read another vGPU's secret: {s}");
    }

    /// The attempt made once the filter is on: a socket, which no worker opens.
    pub fn after_filter() {
        tracing::warn!("probe: calling socket(2), outside the filter");
        // SAFETY: socket takes integers and returns a descriptor or -1.
        let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0) };
        tracing::warn!("probe: socket(2) returned {fd}: ALLOWED");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_filter_compiles_for_kill_and_log_and_leaves_out_what_no_worker_needs() {
        assert!(filter(SeccompMode::Off).expect("off").is_none());
        for mode in [SeccompMode::Kill, SeccompMode::Log] {
            let prog = filter(mode).expect("compiles").expect("a program");
            assert!(!prog.is_empty());
        }
        let list = allowed();
        for banned in [
            libc::SYS_socket,
            libc::SYS_connect,
            libc::SYS_bind,
            libc::SYS_execve,
            libc::SYS_ptrace,
            libc::SYS_process_vm_readv,
            libc::SYS_kill,
            libc::SYS_setuid,
            libc::SYS_unshare,
            libc::SYS_renameat2,
            libc::SYS_linkat,
            libc::SYS_symlinkat,
        ] {
            assert!(!list.contains(&banned), "syscall {banned} is allowed");
        }
    }

    #[test]
    fn a_killing_filter_kills_a_forbidden_call_with_sigsys() {
        let prog = filter(SeccompMode::Kill)
            .expect("compiles")
            .expect("a program");
        // In a forked child, so the test process keeps its own system calls. The child
        // allocates nothing (the program is built above): it sets no_new_privs, installs
        // the filter on its one thread, makes one forbidden call and would exit.
        // SAFETY: fork has no preconditions; the child only makes system calls and exits
        // without returning into the test harness.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork");
        if pid == 0 {
            // SAFETY: prctl with integer arguments.
            let nnp = unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } == 0;
            if nnp && seccompiler::apply_filter(&prog).is_ok() {
                // SAFETY: socket takes integers; the filter kills the process here.
                unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0) };
            }
            // SAFETY: _exit ends the child at once.
            unsafe { libc::_exit(2) };
        }
        let mut status = 0;
        // SAFETY: waitpid on our own child with a valid out-pointer.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        assert!(
            libc::WIFSIGNALED(status) && libc::WTERMSIG(status) == libc::SIGSYS,
            "status {status:#x}"
        );
    }

    #[test]
    fn the_probe_is_for_its_vgpu_only() {
        std::env::set_var("VGPU_WORKER_PROBE", "7;/run/vgpud.sock;../3");
        assert_eq!(
            probe::wanted(7),
            Some(("/run/vgpud.sock".to_owned(), "../3".to_owned()))
        );
        assert_eq!(probe::wanted(8), None);
        std::env::remove_var("VGPU_WORKER_PROBE");
        assert_eq!(probe::wanted(7), None);
    }
}
