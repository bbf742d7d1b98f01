//! The worker's own part of its sandbox (vgpud's part: its identity, its PID namespace,
//! its private directory and the sockets it serves, see `vgpud/src/daemon/workers/mod.rs`
//! and `vgpud/src/daemon/worker_files.rs`):
//! first thing the worker makes itself non-dumpable and sets `no_new_privs`; once its
//! start-up is done (backend built, its sockets and descriptors received) it installs a
//! seccomp filter that allows only the system calls serving a guest needs. Anything else kills the whole worker with SIGSYS (`--seccomp kill`),
//! or is logged by the kernel and allowed (`--seccomp log`, to find a missing one).
//!
//! Not on the list, on purpose: `socket`, `connect`, `bind`, `listen` (the worker never
//! opens a new connection: vgpud comes to it), `rename*`, `link*`, `symlink*`, `mkdir*`
//! (so it cannot put a socket of its own where another vGPU's vmm will connect, even
//! where workers share a uid), `execve`, `fork`, `vfork`, `ptrace`,
//! `process_vm_readv/writev`, `kill`, `tkill` (it signals nobody), `mount`, `unshare`,
//! `setns`, `set*uid`, `bpf`, `keyctl`, `pidfd_*`, `io_uring_enter`/`io_uring_register`
//! (an io_uring's operations never pass the filter: a ring would open, connect, link and
//! rename what the list forbids).
//!
//! Allowed with their arguments checked: `clone` only for a thread (the flags of glibc's
//! `pthread_create`, no new namespace, no `CLONE_PARENT`/`CLONE_VFORK`/`CLONE_PIDFD`), so
//! nothing the worker starts outlives it; `tgkill` only within its own thread group (the
//! first argument is its own pid); `prctl` only for naming threads, setting its timer
//! slack and reading settings,
//! never `PR_SET_DUMPABLE` or `PR_SET_PTRACER`. Refused with ENOSYS rather than killing:
//! `clone3` (its flags sit in a struct seccomp cannot read; glibc then starts threads with
//! `clone`) and `io_uring_setup` (the emulated NVMe controller then reads with `preadv`).
//! It is one program, installed at once on every thread.

use std::collections::BTreeMap;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule,
};

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
        // Threads (clone with a thread's flags, `thread_rules`; clone3 answered ENOSYS by
        // the first filter), futexes, signals to itself (tgkill of its own pid).
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
        // Answered ENOSYS by the first filter (`refused`): no ring is ever set up.
        libc::SYS_io_uring_setup,
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

/// The clone flags every thread carries: glibc's `pthread_create` passes these plus
/// `CLONE_SETTLS | CLONE_PARENT_SETTID | CLONE_CHILD_CLEARTID`.
const THREAD_FLAGS: u64 = (libc::CLONE_VM
    | libc::CLONE_FS
    | libc::CLONE_FILES
    | libc::CLONE_SIGHAND
    | libc::CLONE_THREAD
    | libc::CLONE_SYSVSEM) as u64;
/// The clone flags no thread of the worker carries: new namespaces, another parent, a
/// vfork, a pidfd, tracing.
const NEVER_FLAGS: u64 = (libc::CLONE_NEWNS
    | libc::CLONE_NEWCGROUP
    | libc::CLONE_NEWUTS
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUSER
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWNET
    | libc::CLONE_PARENT
    | libc::CLONE_VFORK
    | libc::CLONE_PIDFD
    | libc::CLONE_PTRACE
    | libc::CLONE_UNTRACED) as u64;
/// `PR_SET_VMA` (naming anonymous mappings), not in the libc crate.
const PR_SET_VMA: u64 = 0x5356_4d41;
/// The prctl options a worker and the CUDA driver use: naming threads and mappings, the
/// kernel-wait threads' timer slack (the cuda backend's 1 µs, `backend/src/cuda/hard_limit.rs`),
/// reading settings.
const PRCTL_OPTIONS: [u64; 16] = [
    libc::PR_SET_NAME as u64,
    libc::PR_SET_TIMERSLACK as u64,
    libc::PR_GET_NAME as u64,
    PR_SET_VMA,
    libc::PR_GET_DUMPABLE as u64,
    libc::PR_GET_NO_NEW_PRIVS as u64,
    libc::PR_GET_SECCOMP as u64,
    libc::PR_GET_TIMERSLACK as u64,
    libc::PR_GET_PDEATHSIG as u64,
    libc::PR_GET_KEEPCAPS as u64,
    libc::PR_GET_CHILD_SUBREAPER as u64,
    libc::PR_GET_TID_ADDRESS as u64,
    libc::PR_GET_SPECULATION_CTRL as u64,
    libc::PR_MCE_KILL_GET as u64,
    libc::PR_CAPBSET_READ as u64,
    libc::PR_GET_THP_DISABLE as u64,
];

fn condition(arg: u8, op: SeccompCmpOp, value: u64) -> Result<SeccompCondition, SandboxError> {
    SeccompCondition::new(arg, SeccompCmpArgLen::Dword, op, value)
        .map_err(|e| SandboxError::Filter(e.to_string()))
}

fn rule(conditions: Vec<SeccompCondition>) -> Result<SeccompRule, SandboxError> {
    SeccompRule::new(conditions).map_err(|e| SandboxError::Filter(e.to_string()))
}

/// The calls allowed only with some arguments, for a worker whose pid is `pid` (as it
/// sees itself: 1 in its own PID namespace).
fn checked_rules(pid: u32) -> Result<Vec<(i64, Vec<SeccompRule>)>, SandboxError> {
    // clone's flags are its first argument on x86_64 and aarch64; the kernel reads its
    // lower 32 bits (Dword).
    let thread = rule(vec![
        condition(0, SeccompCmpOp::MaskedEq(THREAD_FLAGS), THREAD_FLAGS)?,
        condition(0, SeccompCmpOp::MaskedEq(NEVER_FLAGS), 0)?,
    ])?;
    let own = rule(vec![condition(0, SeccompCmpOp::Eq, u64::from(pid))?])?;
    let prctl = PRCTL_OPTIONS
        .iter()
        .map(|o| rule(vec![condition(0, SeccompCmpOp::Eq, *o)?]))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(vec![
        (libc::SYS_clone, vec![thread]),
        (libc::SYS_tgkill, vec![own]),
        (libc::SYS_prctl, prctl),
    ])
}

/// Answered ENOSYS (before the main filter's rules): `clone3`, whose flags seccomp cannot
/// read, so that glibc falls back to `clone`; and `io_uring_setup`, so that no ring exists
/// whose operations would bypass the filter.
const REFUSED: [i64; 2] = [libc::SYS_clone3, libc::SYS_io_uring_setup];

fn arch() -> Result<seccompiler::TargetArch, SandboxError> {
    std::env::consts::ARCH
        .try_into()
        .map_err(|e: seccompiler::BackendError| SandboxError::Filter(e.to_string()))
}

fn compile(
    rules: BTreeMap<i64, Vec<SeccompRule>>,
    mismatch: SeccompAction,
    matched: SeccompAction,
) -> Result<BpfProgram, SandboxError> {
    let f = SeccompFilter::new(rules, mismatch, matched, arch()?)
        .map_err(|e| SandboxError::Filter(e.to_string()))?;
    f.try_into()
        .map_err(|e: seccompiler::BackendError| SandboxError::Filter(e.to_string()))
}

/// The audit architecture a program checks before it reads a call's number.
fn audit_arch() -> Result<u32, SandboxError> {
    const BIT64_LE: u32 = 0x8000_0000 | 0x4000_0000;
    match std::env::consts::ARCH {
        "x86_64" => Ok(62 | BIT64_LE),
        "aarch64" => Ok(183 | BIT64_LE),
        other => Err(SandboxError::Filter(format!(
            "no seccomp filter for {other}"
        ))),
    }
}

/// `main` with a block in front that answers [`REFUSED`] with ENOSYS: one program, so
/// that the worker never runs under half of its filter.
fn with_refused(main: BpfProgram) -> Result<BpfProgram, SandboxError> {
    use seccompiler::sock_filter;
    const LD_W_ABS: u16 = (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16;
    const JEQ_K: u16 = (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16;
    const RET_K: u16 = (libc::BPF_RET | libc::BPF_K) as u16;
    // Offsets in struct seccomp_data: nr at 0, arch at 4.
    let op = |code: u16, k: u32, jt: u8, jf: u8| sock_filter { code, jt, jf, k };
    let nr = |n: i64| u32::try_from(n).map_err(|_| SandboxError::Filter(format!("call {n}")));
    let errno = libc::SECCOMP_RET_ERRNO | (libc::ENOSYS as u32 & libc::SECCOMP_RET_DATA);
    let [first, second] = REFUSED;
    let mut prog = vec![
        op(LD_W_ABS, 4, 0, 0),
        // Another architecture: straight to the main program (which refuses it).
        op(JEQ_K, audit_arch()?, 0, 4),
        op(LD_W_ABS, 0, 0, 0),
        op(JEQ_K, nr(first)?, 1, 0),
        op(JEQ_K, nr(second)?, 0, 1),
        op(RET_K, errno, 0, 0),
    ];
    prog.extend(main);
    Ok(prog)
}

/// The compiled filter for `mode` for a worker whose pid is `pid` (`None` for `off`): the
/// allow list and the checked calls, with [`REFUSED`] answered ENOSYS in front.
pub fn filter(mode: SeccompMode, pid: u32) -> Result<Option<BpfProgram>, SandboxError> {
    let mismatch = match mode {
        SeccompMode::Off => return Ok(None),
        SeccompMode::Log => SeccompAction::Log,
        SeccompMode::Kill => SeccompAction::KillProcess,
    };
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> =
        allowed().into_iter().map(|nr| (nr, Vec::new())).collect();
    for (nr, checked) in checked_rules(pid)? {
        rules.insert(nr, checked);
    }
    let main = compile(rules, mismatch, SeccompAction::Allow)?;
    Ok(Some(with_refused(main)?))
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
    let Some(prog) = filter(mode, std::process::id())? else {
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
        assert!(filter(SeccompMode::Off, 1).expect("off").is_none());
        for mode in [SeccompMode::Kill, SeccompMode::Log] {
            let prog = filter(mode, 1).expect("compiles").expect("a program");
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
            libc::SYS_tkill,
            libc::SYS_setuid,
            libc::SYS_unshare,
            libc::SYS_renameat2,
            libc::SYS_linkat,
            libc::SYS_symlinkat,
            libc::SYS_io_uring_enter,
            libc::SYS_io_uring_register,
            // Checked by their arguments instead.
            libc::SYS_clone,
            libc::SYS_tgkill,
            libc::SYS_prctl,
        ] {
            assert!(!list.contains(&banned), "syscall {banned} is allowed");
        }
    }

    /// How a forked child that puts the killing filter on and then runs `call` ends:
    /// `Ok(code)` when `call` returned (its value is the exit code), `Err(signal)`.
    fn under_filter(call: fn() -> i32) -> Result<i32, i32> {
        // SAFETY: fork has no preconditions; the child only builds the filter, makes
        // system calls and exits without returning into the test harness.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork");
        if pid == 0 {
            // SAFETY: prctl with integer arguments.
            let nnp = unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } == 0;
            let code = match filter(SeccompMode::Kill, std::process::id()) {
                Ok(Some(prog)) if nnp => {
                    if seccompiler::apply_filter(&prog).is_ok() {
                        call()
                    } else {
                        100
                    }
                }
                _ => 101,
            };
            // SAFETY: _exit ends the child at once.
            unsafe { libc::_exit(code) };
        }
        let mut status = 0;
        // SAFETY: waitpid on our own child with a valid out-pointer.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        if libc::WIFSIGNALED(status) {
            Err(libc::WTERMSIG(status))
        } else {
            Ok(libc::WEXITSTATUS(status))
        }
    }

    fn errno() -> i32 {
        std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
    }

    #[test]
    fn a_forbidden_call_kills_with_sigsys() {
        // SAFETY: socket takes integers.
        let socket = || unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0) };
        assert_eq!(under_filter(socket), Err(libc::SIGSYS));
    }

    #[test]
    fn a_fork_or_a_clone_into_new_namespaces_kills() {
        fn fork() -> i32 {
            // SAFETY: clone without CLONE_VM and a null stack behaves as fork; the
            // child (if the filter let it be) exits at once.
            let r = unsafe { libc::syscall(libc::SYS_clone, libc::SIGCHLD, 0, 0, 0, 0) };
            if r == 0 {
                // SAFETY: ends the forked child.
                unsafe { libc::_exit(0) };
            }
            3
        }
        fn thread_in_new_namespace() -> i32 {
            let flags = THREAD_FLAGS as libc::c_long | libc::CLONE_NEWNET as libc::c_long;
            // SAFETY: the filter refuses this call before the kernel reads the (null)
            // stack; were it let through, the kernel would refuse the flag combination.
            unsafe { libc::syscall(libc::SYS_clone, flags, 0, 0, 0, 0) };
            3
        }
        assert_eq!(under_filter(fork), Err(libc::SIGSYS));
        assert_eq!(under_filter(thread_in_new_namespace), Err(libc::SIGSYS));
    }

    #[test]
    fn clone3_is_refused_with_enosys_and_threads_still_start() {
        fn clone3_then_thread() -> i32 {
            let args = [0u64; 8];
            // SAFETY: clone3 reads `args` (an all-zero clone_args of its size); the
            // filter answers ENOSYS before that.
            let r = unsafe {
                libc::syscall(
                    libc::SYS_clone3,
                    args.as_ptr(),
                    std::mem::size_of_val(&args),
                )
            };
            if r != -1 || errno() != libc::ENOSYS {
                return 4;
            }
            // glibc's pthread_create tries clone3, gets ENOSYS and uses clone.
            match std::thread::spawn(|| 7).join() {
                Ok(7) => 0,
                _ => 5,
            }
        }
        assert_eq!(under_filter(clone3_then_thread), Ok(0));
    }

    #[test]
    fn io_uring_is_refused_at_setup_and_its_calls_kill() {
        fn setup() -> i32 {
            let mut params = [0u8; 120];
            // SAFETY: io_uring_setup writes at most its params struct (120 bytes).
            let r = unsafe { libc::syscall(libc::SYS_io_uring_setup, 4, params.as_mut_ptr()) };
            if r == -1 && errno() == libc::ENOSYS {
                0
            } else {
                6
            }
        }
        fn enter() -> i32 {
            // SAFETY: io_uring_enter on descriptor -1 touches no memory.
            unsafe { libc::syscall(libc::SYS_io_uring_enter, -1, 0, 0, 0, 0, 0) };
            7
        }
        assert_eq!(under_filter(setup), Ok(0));
        assert_eq!(under_filter(enter), Err(libc::SIGSYS));
    }

    #[test]
    fn tgkill_reaches_only_its_own_thread_group() {
        fn own() -> i32 {
            // SAFETY: signal 0 to its own thread: a check that delivers nothing.
            let r = unsafe { libc::syscall(libc::SYS_tgkill, libc::getpid(), libc::gettid(), 0) };
            i32::from(r != 0)
        }
        fn parent() -> i32 {
            // SAFETY: signal 0 (nothing delivered) to the parent, the test process.
            unsafe { libc::syscall(libc::SYS_tgkill, libc::getppid(), libc::getppid(), 0) };
            8
        }
        assert_eq!(under_filter(own), Ok(0));
        assert_eq!(under_filter(parent), Err(libc::SIGSYS));
    }

    #[test]
    fn prctl_names_threads_but_never_makes_the_worker_dumpable() {
        fn name() -> i32 {
            let n = b"w\0";
            // SAFETY: PR_SET_NAME reads a NUL-terminated name; PR_GET_DUMPABLE reads
            // nothing; PR_SET_TIMERSLACK takes an integer (the cuda backend's kernel waits).
            let ok = unsafe {
                libc::prctl(libc::PR_SET_NAME, n.as_ptr()) == 0
                    && libc::prctl(libc::PR_GET_DUMPABLE) >= 0
                    && libc::prctl(libc::PR_SET_TIMERSLACK, 1000, 0, 0, 0) == 0
            };
            i32::from(!ok)
        }
        fn dumpable() -> i32 {
            // SAFETY: prctl with integer arguments.
            unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 1, 0, 0, 0) };
            9
        }
        fn ptracer() -> i32 {
            // SAFETY: prctl with integer arguments (PR_SET_PTRACER_ANY).
            unsafe { libc::prctl(libc::PR_SET_PTRACER, -1i64 as libc::c_ulong, 0, 0, 0) };
            10
        }
        assert_eq!(under_filter(name), Ok(0));
        assert_eq!(under_filter(dumpable), Err(libc::SIGSYS));
        assert_eq!(under_filter(ptracer), Err(libc::SIGSYS));
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
