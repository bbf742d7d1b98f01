//! Start-up and shutdown: the lock file (one daemon per state directory), the binaries
//! check, the state file read back (adopting the VMs and workers still running), the
//! API's socket, the background tasks, and at the end the final state file (VMs and
//! workers keep running: the next vgpud adopts them).

use std::fs::File;
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::adopt;
use super::config::{Config, Listen};
use super::core::Daemon;
use super::error::DaemonError;
use super::rebalancing;
use super::restore;
use super::statefile::{self, StateFile};
use super::stats;
use super::workers::pool;

/// A graceful stop (SIGTERM, SIGINT): the final state file records every running vmm
/// and worker, which keep running (their guests never notice); the next vgpud adopts
/// them. Each worker serves its guest meanwhile and waits `--control-reconnect-s` for
/// vgpud on its control socket (the channel closes when this process exits).
async fn stop_all(d: &Daemon) {
    d.shutting_down.store(true, Ordering::SeqCst);
    pool::stop_pools(d);
    d.persist.save_final(&d.state).await;
    let (vms, workers) = d.state.with(|inner| {
        (
            inner.vms.values().filter(|v| v.proc().is_some()).count(),
            inner
                .vgpus
                .values()
                .filter(|r| r.worker().is_some())
                .count(),
        )
    });
    if vms > 0 || workers > 0 {
        tracing::info!(
            vms,
            workers,
            reconnect_s = d.cfg.workers.control_reconnect.as_secs(),
            "leaving every VM and worker running for the next vgpud to adopt"
        );
    }
}

/// Says which worker isolation is in effect (docs/hostile.md).
fn log_isolation(cfg: &Config) {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    let seccomp = cfg.workers.seccomp.as_str();
    match (root, cfg.workers.uid_base) {
        (true, Some(base)) => tracing::info!(
            uid_base = base,
            seccomp,
            "worker isolation: each worker runs as its own uid and gid (base + vGPU id; a pool worker base - 1 - slot), in a private 0700 directory, not dumpable, no_new_privs, seccomp"
        ),
        (true, None) => tracing::warn!(
            seccomp,
            "worker isolation: workers run as root (--worker-uid-base 0): only seccomp, not dumpable and no_new_privs separate them; give --worker-uid-base"
        ),
        (false, _) => tracing::warn!(
            seccomp,
            "worker isolation: vgpud does not run as root, so workers run as its own uid: private directories, seccomp (no socket, connect or ptrace), not dumpable and no_new_privs separate them, but not their uid"
        ),
    }
}

/// Holds the lock file for the daemon's life.
struct LockFile {
    _file: File,
}

/// What a running vgpud writes into its lock file: its pid and the address it serves.
fn lock_contents(pid: u32, serves: &str) -> String {
    format!("{pid}\n{serves}\n")
}

/// The pid and the served address read back from a lock file (either may be missing
/// when the holder is still writing it, or is an older vgpud that wrote only its pid).
fn parse_lock(text: &str) -> (String, String) {
    let mut lines = text.lines().map(str::trim);
    let field = |v: Option<&str>| match v {
        Some(v) if !v.is_empty() => v.to_owned(),
        _ => "unknown".to_owned(),
    };
    let pid = field(lines.next());
    let serves = field(lines.next());
    (pid, serves)
}

fn take_lock(path: &Path, state_dir: &Path, serves: &str) -> Result<LockFile, DaemonError> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map_err(|source| DaemonError::Lock {
            path: path.to_owned(),
            source,
        })?;
    // SAFETY: flock on a descriptor we own; no memory is passed.
    let rc = unsafe {
        libc::flock(
            std::os::fd::AsRawFd::as_raw_fd(&file),
            libc::LOCK_EX | libc::LOCK_NB,
        )
    };
    if rc != 0 {
        let (pid, socket) = parse_lock(&std::fs::read_to_string(path).unwrap_or_default());
        return Err(DaemonError::AlreadyRunning {
            state_dir: state_dir.to_owned(),
            socket,
            pid,
        });
    }
    let mut f = &file;
    let _ = file.set_len(0);
    let _ = f.write_all(lock_contents(std::process::id(), serves).as_bytes());
    Ok(LockFile { _file: file })
}

fn check_binaries(cfg: &Config) -> Result<(), DaemonError> {
    for (name, path, flag) in [
        (
            "vgpu-worker",
            &cfg.worker_bin,
            "--worker-bin (or VGPUD_WORKER_BIN)",
        ),
        ("vmm", &cfg.vmm_bin, "--vmm-bin (or VGPUD_VMM_BIN)"),
    ] {
        if !path.is_file() {
            return Err(DaemonError::MissingBinary {
                name,
                package: name,
                path: path.clone(),
                flag,
            });
        }
    }
    Ok(())
}

/// Binds the API, serves it until SIGTERM/SIGINT, then stops everything.
pub(super) async fn serve(cfg: Config, on_listening: impl FnOnce()) -> Result<(), DaemonError> {
    check_binaries(&cfg)?;
    // Every shared object, worker channel and REST connection is a descriptor.
    let nofile = super::shm::raise_fd_limit();
    if cfg.gpus.is_empty() {
        return Err(DaemonError::Option(
            "no GPUs configured; give --sim-gpus 1 or more".into(),
        ));
    }
    // A directory another user made first, or may write in, is refused before vgpud
    // creates anything in it.
    super::private::prepare_dir(&cfg.state_dir, "state directory")?;
    if let Listen::Unix(p) = &cfg.listen {
        if let Some(dir) = p.parent().filter(|d| !d.as_os_str().is_empty()) {
            super::private::prepare_dir(dir, "socket directory")?;
        }
    }
    // One daemon per state directory (worker sockets, logs and consoles live there); a
    // second one is refused before it touches anything.
    let serves = match &cfg.listen {
        Listen::Unix(p) => p.display().to_string(),
        Listen::Tcp(a) => a.to_string(),
    };
    let lock_path = cfg.state_dir.join("vgpud.lock");
    let _lock = take_lock(&lock_path, &cfg.state_dir, &serves)?;

    let state_path = statefile::path_in(&cfg.state_dir);
    let saved = load_saved(&cfg, &state_path)?;

    let daemon = Arc::new(Daemon::new(cfg.clone())?);
    log_isolation(&cfg);
    // Signals are ours from here on: a stop during the restore below is a graceful one.
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
    let mut int = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt()).ok();
    let shutdown = async move {
        tokio::select! {
            _ = async { match term.as_mut() { Some(s) => { s.recv().await; } None => std::future::pending().await } } => {}
            _ = async { match int.as_mut() { Some(s) => { s.recv().await; } None => std::future::pending().await } } => {}
        }
        tracing::info!("signal received; shutting down");
    };
    let listener = bind(&cfg).await?;
    // Bound but not yet serving: a client that connects now waits for the restore.
    match saved {
        Some(saved) => restore::bring_back(&daemon, saved).await,
        None => tracing::info!(path = %state_path.display(), "no state file; starting fresh"),
    }
    adopt::sweep_worker_dirs(&daemon);
    pool::fill_pools(&daemon);
    // A state directory that cannot be written is logged here and reported to every API
    // change until a save succeeds.
    let _ = daemon.persist.save(&daemon.state).await;
    let saver = tokio::spawn({
        let d = daemon.clone();
        async move { d.persist.run(&d.state).await }
    });
    let app = super::http::router(daemon.clone());
    let sampler = tokio::spawn(stats::sampler(daemon.clone()));
    let rebalancer = tokio::spawn(rebalancing::rebalancer(daemon.clone()));
    on_listening();
    let limits = super::http::serve::Limits {
        header_read_timeout: cfg.header_read_timeout,
        idle_timeout: cfg.api_idle_timeout,
        max_connections: cfg
            .max_api_connections
            .unwrap_or_else(|| super::http::serve::Limits::default_max_connections(nofile)),
        reserve: super::http::serve::FD_RESERVE,
    };
    tracing::info!(
        max = limits.max_connections,
        idle_timeout_s = limits.idle_timeout.as_secs(),
        "API connections bounded"
    );
    let served = match listener {
        Bound::Unix(listener, path) => {
            let r = super::http::serve::serve(listener, app, limits, shutdown).await;
            let _ = std::fs::remove_file(path);
            r
        }
        Bound::Tcp(listener) => super::http::serve::serve(listener, app, limits, shutdown).await,
    };
    sampler.abort();
    rebalancer.abort();
    stop_all(&daemon).await;
    saver.abort();
    let _ = std::fs::remove_file(&lock_path);
    tracing::info!("vgpud stopped");
    served.map_err(DaemonError::Runtime)
}

/// What the last vgpud on this state directory saved; a damaged or newer file stops
/// the start (with what to do) unless the operator said to set it aside.
fn load_saved(cfg: &Config, state_path: &Path) -> Result<Option<StateFile>, DaemonError> {
    match statefile::load(state_path) {
        Ok(s) => Ok(s),
        Err(e) if cfg.discard_state => {
            let to = statefile::discard(state_path)?;
            tracing::warn!(error = %e, set_aside = %to.display(),
                "--discard-state: the state file is set aside; starting without its vGPUs and VMs");
            Ok(None)
        }
        Err(e) => Err(e.into()),
    }
}

/// The API's listener.
enum Bound {
    Unix(tokio::net::UnixListener, PathBuf),
    Tcp(tokio::net::TcpListener),
}

/// Binds the API's socket (replacing a stale unix socket, refusing a live one).
async fn bind(cfg: &Config) -> Result<Bound, DaemonError> {
    match &cfg.listen {
        Listen::Unix(path) => {
            if let Ok(meta) = std::fs::symlink_metadata(path) {
                use std::os::unix::fs::FileTypeExt;
                if !meta.file_type().is_socket() {
                    return Err(DaemonError::NotASocket { path: path.clone() });
                }
                if std::os::unix::net::UnixStream::connect(path).is_ok() {
                    return Err(DaemonError::SocketInUse {
                        socket: path.clone(),
                    });
                }
                let _ = std::fs::remove_file(path);
            }
            let listener =
                tokio::net::UnixListener::bind(path).map_err(|source| DaemonError::Bind {
                    addr: path.display().to_string(),
                    source,
                })?;
            let _ = std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600));
            tracing::info!(socket = %path.display(), gpus = cfg.gpus.len(), "vgpud listening");
            Ok(Bound::Unix(listener, path.clone()))
        }
        Listen::Tcp(addr) => {
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|source| DaemonError::Bind {
                    addr: addr.to_string(),
                    source,
                })?;
            tracing::info!(%addr, gpus = cfg.gpus.len(), "vgpud listening (TCP, bearer token required)");
            Ok(Bound::Tcp(listener))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_file_names_the_holder() {
        let dir = std::env::temp_dir().join(format!("vgpud-lock-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("vgpud.lock");
        let first = take_lock(&path, &dir, "/run/a.sock").expect("first lock");
        let err = take_lock(&path, &dir, "/run/b.sock")
            .err()
            .expect("second lock refused")
            .to_string();
        assert!(err.contains("already running"), "{err}");
        assert!(err.contains(&dir.display().to_string()), "{err}");
        assert!(err.contains("/run/a.sock"), "{err}");
        assert!(err.contains(&std::process::id().to_string()), "{err}");
        drop(first);
        let _again = take_lock(&path, &dir, "/run/b.sock").expect("lock after release");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn lock_file_of_an_older_vgpud() {
        assert_eq!(parse_lock("42\n"), ("42".into(), "unknown".into()));
        assert_eq!(parse_lock(""), ("unknown".into(), "unknown".into()));
    }
}
