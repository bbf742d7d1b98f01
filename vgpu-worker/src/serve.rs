//! The vhost-user side: binding the socket, serving the one frontend connection, and
//! stopping on a signal or on vgpud's word.

use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use vgpu_device::front::{Ended, Gate};
use vgpu_device::{Vgpu, VgpuVhostBackend};
use vhost::vhost_user::{Error as VhostUserError, Listener};
use vhost_user_backend::VhostUserBackend;
use vhost_user_backend::{ShutdownHandle, VhostUserDaemon};
use vm_memory::{GuestMemoryAtomic, GuestMemoryMmap};

use crate::error::WorkerError;

/// Frontend connections one worker serves after the first, each after a refused
/// request ended the one before (a daemon session per connection, over a channel made
/// before the sandbox closes).
pub const MAX_SESSIONS: usize = 8;

/// The worker's vhost-user side: the socket the frontend connects to, and the private
/// channels to the vhost-user daemon that every frontend message reaches only through
/// [`vgpu_device::front`].
pub struct Front {
    /// The frontend's socket.
    public: Listener,
    /// Its path, removed when the front goes, when this worker bound it (`bind`).
    bound_at: Option<std::path::PathBuf>,
    /// The daemon's side of the private channels.
    daemon: Listener,
    /// Our ends of the private channels, connected in advance (the sandbox allows no
    /// connect), in the order the daemon accepts them.
    ends: std::collections::VecDeque<UnixStream>,
}

/// Binds the socket, refusing to steal one another process is serving, and makes the
/// private channels to the daemon.
pub fn bind(path: &Path) -> Result<Front, WorkerError> {
    let err = |why: String| WorkerError::Bind {
        path: path.to_owned(),
        why,
    };
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() {
            return Err(err(
                "the path exists and is not a socket; remove it or pick another path".into(),
            ));
        }
        if UnixStream::connect(path).is_ok() {
            return Err(err(
                "another process is serving this socket; pick another path".into(),
            ));
        }
        std::fs::remove_file(path)
            .map_err(|e| err(format!("cannot remove the stale socket: {e}")))?;
    }
    let public = listen_at(path).map_err(|e| {
        err(format!(
            "{e}; check that the directory exists and is writable"
        ))
    })?;
    let mut f = front(Listener::from(public), path)?;
    f.bound_at = Some(path.to_owned());
    Ok(f)
}

/// A socket listening at `path` from the moment `path` exists: bound and listening under
/// a temporary name in the same directory, then renamed into place. Whoever waits for the
/// path to appear (vgpud, the test helpers, scripts) may connect at once; bound at `path`
/// directly, the path exists a moment before the socket listens and a connect in that
/// moment is refused.
fn listen_at(path: &Path) -> std::io::Result<std::os::unix::net::UnixListener> {
    let name = path.file_name().ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "the socket path names no file",
        )
    })?;
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(name);
    tmp_name.push(format!(".{}.tmp", std::process::id()));
    let tmp = path.with_file_name(tmp_name);
    let _ = std::fs::remove_file(&tmp);
    let listener = match std::os::unix::net::UnixListener::bind(&tmp) {
        Ok(l) => l,
        // The longer name does not fit a socket address: bound in place instead.
        Err(e) if e.kind() == std::io::ErrorKind::InvalidInput => {
            return std::os::unix::net::UnixListener::bind(path);
        }
        Err(e) => return Err(e),
    };
    if let Err(e) = std::fs::rename(&tmp, path) {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    Ok(listener)
}

/// The worker's side over a listening socket it was handed (vgpud binds the sockets a
/// worker serves); `path` only names it in messages.
pub fn from_listener(public: Listener, path: &Path) -> Result<Front, WorkerError> {
    front(public, path)
}

/// Makes the private channels to the daemon beside `public`: a listener in a fresh 0700
/// directory of the worker's own (the socket's directory may be vgpud's, where the worker
/// cannot write), connected to at once and removed, so that nothing else can reach it.
fn front(public: Listener, path: &Path) -> Result<Front, WorkerError> {
    let channel_err = |e: std::io::Error| WorkerError::Bind {
        path: path.to_owned(),
        why: format!("cannot make the daemon's private channel: {e}"),
    };
    let dir = private_dir().map_err(channel_err)?;
    let private = dir.join("daemon.sock");
    let bound = std::os::unix::net::UnixListener::bind(&private).and_then(|daemon| {
        let ends = (0..=MAX_SESSIONS)
            .map(|_| UnixStream::connect(&private))
            .collect::<Result<_, _>>()?;
        Ok((daemon, ends))
    });
    let _ = std::fs::remove_file(&private);
    let _ = std::fs::remove_dir(&dir);
    let (daemon, ends) = bound.map_err(channel_err)?;
    Ok(Front {
        public,
        bound_at: None,
        daemon: Listener::from(daemon),
        ends,
    })
}

impl Drop for Front {
    fn drop(&mut self) {
        if let Some(path) = &self.bound_at {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// A new directory only this process's uid may enter, under the temporary directory.
fn private_dir() -> std::io::Result<std::path::PathBuf> {
    use std::os::unix::ffi::OsStrExt;
    let mut template = std::env::temp_dir()
        .join("vgpu-worker-XXXXXX")
        .as_os_str()
        .as_bytes()
        .to_vec();
    template.push(0);
    // SAFETY: `template` is a NUL-terminated buffer this frame owns; mkdtemp writes only
    // its six trailing X characters and returns either NULL or a pointer into it.
    let made = unsafe { libc::mkdtemp(template.as_mut_ptr().cast()) };
    if made.is_null() {
        return Err(std::io::Error::last_os_error());
    }
    template.pop();
    let made: std::ffi::OsString = std::os::unix::ffi::OsStringExt::from_vec(template);
    Ok(std::path::PathBuf::from(made))
}

/// Blocks SIGTERM and SIGINT in this thread (and every thread spawned after), so that
/// `wait_signal` receives them.
pub fn block_signals() -> Result<libc::sigset_t, WorkerError> {
    // SAFETY: an all-zero sigset_t is a valid value to hand to sigemptyset.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid sigset_t owned by this frame; the calls only write to it and
    // to this thread's signal mask.
    let rc = unsafe {
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut())
    };
    if rc != 0 {
        return Err(WorkerError::Signals(std::io::Error::from_raw_os_error(rc)));
    }
    Ok(set)
}

/// Waits for one of the blocked signals.
fn wait_signal(set: &libc::sigset_t) -> i32 {
    let mut sig = 0;
    // SAFETY: `set` is an initialised signal set and `sig` a valid out-pointer.
    let rc = unsafe { libc::sigwait(set, &mut sig) };
    if rc == 0 {
        sig
    } else {
        libc::SIGTERM
    }
}

/// Starts the thread that stops the worker on SIGTERM or SIGINT (blocked in `signals`).
pub fn spawn_signal_thread(
    signals: libc::sigset_t,
    shutdown: Shutdown,
    socket: std::path::PathBuf,
    gate: Option<Arc<vgpu_grant::SwitchGate>>,
) -> Result<(), WorkerError> {
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            let sig = wait_signal(&signals);
            let why = if sig == libc::SIGINT {
                "SIGINT"
            } else {
                "SIGTERM"
            };
            stop(&shutdown, &socket, gate.as_deref(), why);
        })
        .map(drop)
        .map_err(WorkerError::Signals)
}

/// Connection state the signal thread acts on.
pub type Shutdown = Arc<Mutex<Option<ShutdownHandle>>>;

/// Ends the worker: closes the frontend connection when there is one (serve() then
/// returns), else removes the socket and exits at once. Requests waiting for a grant run
/// ungated from now on: vgpud may be gone, and its scheduler with it.
pub fn stop(shutdown: &Shutdown, socket: &Path, gate: Option<&vgpu_grant::SwitchGate>, why: &str) {
    if let Some(g) = gate {
        g.close();
    }
    match vgpu_sync::lock(shutdown).as_ref() {
        Some(handle) => {
            tracing::info!(why, "stopping: closing the frontend connection");
            handle.shutdown();
        }
        None => {
            tracing::info!(why, "stopping before any frontend connected");
            let _ = std::fs::remove_file(socket);
            std::process::exit(0);
        }
    }
}

/// Serves frontend connections on `front` until one disconnects or `shutdown` is
/// triggered, then logs the vGPU's stats. `on_connected` runs once the first frontend is
/// in. A connection ended by a refused request (docs/hostile.md) leaves the vGPU as it
/// was, and the next connection is served, up to [`MAX_SESSIONS`] times.
pub fn serve(
    front: &mut Front,
    vgpu: Arc<Vgpu>,
    shutdown: &Shutdown,
    poll: Duration,
    max_guest_memory: u64,
    outgoing: Arc<crate::outgoing::Outgoing>,
    on_connected: impl FnOnce(),
) -> Result<(), WorkerError> {
    let id = vgpu.config().vgpu_id;
    let mem = GuestMemoryAtomic::new(GuestMemoryMmap::new());
    let inner = Arc::new(VgpuVhostBackend::new(vgpu.clone(), mem.clone()).with_poll(poll));
    let offered = inner.protocol_features();
    let queues = u32::from(vgpu.config().num_queues);
    let backend = crate::outgoing::Hooked::new(inner, outgoing.clone());
    let mut daemon = VhostUserDaemon::new(format!("vgpu-{id}"), backend, mem)
        .map_err(|e| WorkerError::Daemon(e.to_string()))?;
    let mut on_connected = Some(on_connected);
    let mut sessions = 0usize;
    let result = loop {
        let frontend = loop {
            match front.public.accept() {
                Ok(Some(s)) => break s,
                Ok(None) => continue,
                Err(e) => return Err(WorkerError::Daemon(e.to_string())),
            }
        };
        let Some(end) = front.ends.pop_front() else {
            break Err(WorkerError::Daemon(format!(
                "{MAX_SESSIONS} frontend connections ended on refused requests; stopping"
            )));
        };
        if sessions > 0 {
            // The daemon still counts the last frontend as its owner.
            if let Err(e) = vgpu_device::front::reset_owner(&end) {
                break Err(WorkerError::Daemon(e.to_string()));
            }
        }
        sessions += 1;
        daemon
            .start(&mut front.daemon)
            .map_err(|e| WorkerError::Daemon(e.to_string()))?;
        *vgpu_sync::lock(shutdown) = daemon.shutdown_handle();
        if let Some(f) = on_connected.take() {
            tracing::info!(vgpu = id, "frontend connected");
            f();
        } else {
            tracing::info!(vgpu = id, "a new frontend connected");
        }
        let mut gate = Gate::new(offered, queues).with_max_guest_memory(max_guest_memory);
        let ended = vgpu_device::front::carry(frontend, end, &mut gate, id);
        let waited = daemon.wait();
        let refused = match (&ended, &waited) {
            (Ended::Refused(why), _) => Some(why.clone()),
            (_, Ok(()))
            | (_, Err(vhost_user_backend::Error::HandleRequest(VhostUserError::Disconnected)))
            | (_, Err(vhost_user_backend::Error::HandleRequest(VhostUserError::PartialMessage))) => {
                None
            }
            (_, Err(e)) => Some(e.to_string()),
        };
        match refused {
            Some(why) => tracing::warn!(
                vgpu = id,
                %why,
                "a frontend request was refused and its connection closed; the vGPU keeps its state and serves the next connection"
            ),
            None => break Ok(()),
        }
    };
    outgoing.release();
    for handler in daemon.get_epoll_handlers() {
        handler.send_exit_event();
    }
    let s = vgpu.stats();
    tracing::info!(
        vgpu = id,
        requests = s.requests,
        errors = s.errors,
        bytes_htod = s.bytes_htod,
        bytes_dtoh = s.bytes_dtoh,
        kernels = s.kernels,
        busy_ms = s.busy_ns / 1_000_000,
        "vGPU stats"
    );
    result
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;
    use vgpu_backend::{SimConfig, SimGpu};
    use vgpu_device::DeviceConfig;
    use vgpu_proto::VgpuConfig;
    use vhost::vhost_user::message::{VhostUserConfigFlags, VhostUserProtocolFeatures};
    use vhost::vhost_user::{Frontend, VhostUserFrontend};
    use vhost::VhostBackend;

    fn tmp(name: &str) -> PathBuf {
        std::env::temp_dir().join(format!("vgpu-worker-test-{}-{name}", std::process::id()))
    }

    #[test]
    fn bind_errors_are_clear() {
        let e = bind(Path::new("/nonexistent-dir/x.sock"))
            .err()
            .expect("no such dir");
        assert!(e.to_string().contains("/nonexistent-dir/x.sock"), "{e}");
        let file = tmp("plain-file");
        std::fs::write(&file, b"x").expect("write");
        let e = bind(&file).err().expect("not a socket");
        assert!(e.to_string().contains("not a socket"), "{e}");
        std::fs::remove_file(&file).expect("rm");
        let live = tmp("live.sock");
        let _l = bind(&live).expect("bind");
        let e = bind(&live).err().expect("in use");
        assert!(e.to_string().contains("another process"), "{e}");
    }

    #[test]
    fn a_stale_socket_is_replaced() {
        let p = tmp("stale.sock");
        drop(std::os::unix::net::UnixListener::bind(&p).expect("bind"));
        assert!(p.exists(), "std leaves the socket file behind");
        let l = bind(&p).expect("stale socket replaced");
        drop(l);
        assert!(!p.exists(), "the listener removes its socket");
    }

    #[test]
    fn serves_a_frontend_until_it_disconnects() {
        let path = tmp("serve.sock");
        let mut listener = bind(&path).expect("bind");
        let sim = SimGpu::new(SimConfig {
            memory: 16 << 20,
            va_size: 1 << 30,
            threads: 1,
            ..SimConfig::default()
        })
        .expect("sim");
        let cfg = DeviceConfig {
            vgpu_id: 9,
            num_queues: 3,
            queue_size: 256,
            memory_share: 16 << 20,
            compute_share: 250,
            copy_share: 750,
            batch: vgpu_device::BatchLimits::default(),
        };
        let vgpu = Arc::new(Vgpu::new(cfg, Arc::new(sim)).expect("vgpu"));
        let shutdown: Shutdown = Arc::new(Mutex::new(None));
        let sd = shutdown.clone();
        let worker = std::thread::spawn(move || {
            serve(
                &mut listener,
                vgpu,
                &sd,
                Duration::ZERO,
                vgpu_device::front::DEFAULT_MAX_GUEST_MEMORY,
                Arc::default(),
                || {},
            )
        });

        let mut fe = Frontend::connect(&path, 3).expect("connect");
        fe.set_owner().expect("owner");
        let features = fe.get_features().expect("features");
        assert_ne!(features & (1 << 32), 0);
        fe.set_features(features).expect("set features");
        let pf = fe.get_protocol_features().expect("protocol features");
        assert!(pf.contains(VhostUserProtocolFeatures::CONFIG | VhostUserProtocolFeatures::MQ));
        fe.set_protocol_features(pf).expect("set protocol features");
        assert_eq!(fe.get_queue_num().expect("queue num"), 3);
        let buf = [0u8; VgpuConfig::SIZE];
        let (_, cfg) = fe
            .get_config(0, buf.len() as u32, VhostUserConfigFlags::WRITABLE, &buf)
            .expect("config");
        assert_eq!(
            &cfg[4..8],
            &9u32.to_le_bytes(),
            "vgpu id in the config space"
        );
        assert_eq!(
            &cfg[8..12],
            &3u32.to_le_bytes(),
            "queue count in the config space"
        );
        drop(fe);
        worker
            .join()
            .expect("worker thread")
            .expect("clean exit on disconnect");
    }
}
