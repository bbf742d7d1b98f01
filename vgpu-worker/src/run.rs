//! One worker's life: open the control channel, build the backend stack and the device,
//! bind the socket, serve the one frontend, report the last counters.

use std::os::fd::{FromRawFd, OwnedFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use vgpu_api::control::{ReplyBody, WorkerMessage};
use vgpu_backend::storage::{NamespaceSpec, StorageSet};
use vgpu_device::{DeviceConfig, SlotPolicy, Vgpu};

use crate::backend::{self, GpuSpec, Stack};
use crate::control::{control_socket, ControlLoop, ControlState, Reconnect, Shares};
use crate::error::WorkerError;
use crate::memlink::{Asker, ControlOut, FdQueue, FdReader, WorkerShm};
use crate::pool;
use crate::sandbox::{self, probe, SeccompMode};
use crate::serve::{self, Shutdown};

/// What the worker serves and how (from the command line).
#[derive(Clone, Debug)]
pub struct Config {
    /// The vhost-user socket to listen on.
    pub socket: PathBuf,
    /// The device as the guest sees it (id, queues, shares).
    pub device: DeviceConfig,
    /// The GPU the vGPU starts on.
    pub gpu: GpuSpec,
    /// Scheduling priority, reported to vgpud.
    pub priority: i32,
    /// The inherited control socket to vgpud.
    pub control_fd: Option<i32>,
    /// The inherited grant page and scheduler doorbell.
    pub grant_fds: Option<(i32, i32)>,
    /// Hardware queue slots the streams share; 0 = one per stream.
    pub hw_slots: u32,
    pub slot_policy: SlotPolicy,
    /// Let vgpud swap the vGPU's memory out.
    pub oversubscribe: bool,
    /// Serve shared device memory through vgpud's registry.
    pub shm: bool,
    /// Adaptive polling of the queues after a request.
    pub poll: Duration,
    /// Most guest memory the frontend may map (`--max-guest-memory`).
    pub max_guest_memory: u64,
    /// Storage namespaces for GPU-initiated reads.
    pub storage: Vec<NamespaceSpec>,
    /// The system call filter installed once start-up is done.
    pub seccomp: SeccompMode,
    /// Where vgpud reconnects when the control channel closes (a vgpud restart).
    pub control_listen: Option<PathBuf>,
    /// The file holding the secret a reconnecting vgpud presents.
    pub secret_file: Option<PathBuf>,
    /// The vhost-user listening socket vgpud bound (`--listen-fd`, or with a pool
    /// worker's assignment): the worker then binds nothing itself.
    pub listen_fd: Option<i32>,
    /// The control listening socket vgpud bound for its reconnect (`--control-listen-fd`).
    pub control_listen_fd: Option<i32>,
    /// How long to wait for vgpud to reconnect.
    pub reconnect: Duration,
    /// Receive the vGPU's state from another host's worker first (`--migrate-in`).
    pub migrate_in: Option<String>,
    /// Its one-time token.
    pub migrate_token_file: Option<PathBuf>,
    /// A pool worker: build the GPU, then wait for vgpud to assign a vGPU (`pool.rs`);
    /// `device`, `gpu.memory` and `priority` come with the assignment.
    pub pool: bool,
}

/// The control channel's parts: lines (with descriptors) in, lines out, questions to vgpud.
struct Channel {
    input: FdReader,
    fds: Arc<FdQueue>,
    out: Arc<ControlOut>,
    asker: Arc<Asker>,
}

/// Opens the control channel on the inherited socket, if there is one.
fn open_channel(fd: Option<i32>) -> Result<Option<Channel>, WorkerError> {
    let Some(fd) = fd else {
        return Ok(None);
    };
    let stream = control_socket(fd)?;
    let input = stream.try_clone().map_err(|e| WorkerError::Control {
        fd,
        why: e.to_string(),
    })?;
    let fds = Arc::new(FdQueue::default());
    let out = Arc::new(ControlOut::new(stream));
    let asker = Arc::new(Asker::new(out.clone(), fds.clone()));
    Ok(Some(Channel {
        input: FdReader::new(input, fds.clone()),
        fds,
        out,
        asker,
    }))
}

/// Takes the inherited grant page and doorbell (`--grant-fds`).
fn inherited_grant(page: i32, doorbell: i32) -> Result<(OwnedFd, OwnedFd), WorkerError> {
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

/// The device over the stack, with what the configuration adds (shared memory, storage,
/// the grant path, hardware slots), and the grant gate when there is one.
fn device(
    cfg: &Config,
    stack: &Stack,
    asker: Option<&Arc<Asker>>,
    storage: Option<&Arc<StorageSet>>,
    grant: Option<(OwnedFd, OwnedFd)>,
) -> Result<(Vgpu, Option<Arc<vgpu_grant::SwitchGate>>), WorkerError> {
    let mut vgpu = Vgpu::new(cfg.device.clone(), stack.backend.clone())?;
    if let (Some(a), true) = (asker, cfg.shm) {
        vgpu = vgpu.with_shm(Arc::new(WorkerShm::new(a.clone(), stack.backend.clone())));
    }
    if let Some(set) = storage {
        vgpu = vgpu.with_storage(set.clone());
    }
    let mut gate = None;
    if let Some((page, doorbell)) = grant {
        let client = vgpu_grant::GrantClient::from_fds(page, doorbell)
            .map_err(|e| WorkerError::Grant(e.to_string()))?;
        let g = Arc::new(vgpu_grant::SwitchGate::new(client));
        vgpu = vgpu.with_gate(g.clone());
        gate = Some(g);
        tracing::info!("copies and kernels are scheduled by vgpud (grant path)");
    }
    if cfg.hw_slots > 0 {
        vgpu = vgpu.with_slots(Arc::new(vgpu_device::HwSlots::new(
            cfg.hw_slots,
            cfg.slot_policy,
        )));
    }
    Ok((vgpu, gate))
}

/// The control socket vgpud reconnects on, with its secret (`--control-listen`,
/// `--secret-file`), when the worker is to wait for vgpud.
fn reconnect_socket(
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
        Some(fd) => listener_from(fd, "--control-listen-fd").map_err(err)?,
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
fn listener_from(fd: OwnedFd, what: &str) -> Result<std::os::unix::net::UnixListener, String> {
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

/// Takes an inherited descriptor named on the command line (`what`).
fn inherited_fd(fd: Option<i32>, what: &str) -> Result<Option<OwnedFd>, WorkerError> {
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

/// Answers a pool worker's assignment: `assigned` once its socket is bound, else why not.
fn answer_assignment(assigned: Option<&(u64, Arc<ControlOut>)>, result: Result<(), &WorkerError>) {
    let Some((id, out)) = assigned else { return };
    let body = match result {
        Ok(()) => ReplyBody::Assigned {
            pid: std::process::id(),
        },
        Err(e) => ReplyBody::Error {
            message: e.to_string(),
        },
    };
    out.send(&WorkerMessage::Reply { id: *id, body });
}

/// Says `ready` and starts the control thread; the channel's writing end for the rest.
fn start_control(
    channel: Channel,
    state: &Arc<ControlState>,
    reconnect: Option<Reconnect>,
) -> Result<Arc<ControlOut>, WorkerError> {
    let Channel {
        input, fds, out, ..
    } = channel;
    out.send(&WorkerMessage::Ready {
        pid: std::process::id(),
    });
    let control = ControlLoop {
        input,
        fds,
        out: out.clone(),
        state: state.clone(),
        reconnect,
    };
    std::thread::Builder::new()
        .name("control".into())
        .spawn(move || control.run())
        .map_err(WorkerError::Signals)?;
    Ok(out)
}

/// Serves the vGPU until its frontend disconnects or the worker is stopped. A pool
/// worker first waits for its vGPU (`pool.rs`).
pub fn run(mut cfg: Config) -> Result<(), WorkerError> {
    sandbox::harden()?;
    let signals = serve::block_signals()?;
    if (cfg.oversubscribe || cfg.shm || cfg.pool) && cfg.control_fd.is_none() {
        return Err(WorkerError::Control {
            fd: -1,
            why: "--oversubscribe, --shm and --pool need vgpud (the control channel)".into(),
        });
    }
    let mut channel = open_channel(cfg.control_fd)?;
    let storage = backend::storage_set(&cfg.storage)?;
    let gpu = backend::gpu(&cfg.gpu, storage.as_ref())?;
    let mut sockets = (
        inherited_fd(cfg.listen_fd, "--listen-fd")?,
        inherited_fd(cfg.control_listen_fd, "--control-listen-fd")?,
    );
    let (grant, assigned) = match (&mut channel, cfg.pool) {
        (Some(c), true) => {
            match pool::await_assignment(&mut cfg, &mut c.input, &c.fds, &c.out, &signals)? {
                // A pool worker serves only scheduled: vgpud always sends the grant page
                // and doorbell with the assignment.
                Some(a) if a.grant.is_none() => {
                    let e = WorkerError::Grant(
                        "the vGPU's grant page and doorbell did not come with the assignment"
                            .into(),
                    );
                    answer_assignment(Some(&(a.request, c.out.clone())), Err(&e));
                    return Err(e);
                }
                Some(a) => {
                    // The pool worker opened its GPU before it knew the share: a share
                    // that cannot hold what the backend charged at start (the CUDA
                    // context's reserve) is refused as a fresh worker would refuse it.
                    let reserve = gpu.memory_usage().used;
                    let share = cfg.device.memory_share;
                    if reserve > share {
                        let e = WorkerError::Backend(vgpu_backend::BackendError::ContextReserve {
                            share,
                            reserve,
                            detail: "charged when the pool worker opened its GPU".into(),
                        });
                        answer_assignment(Some(&(a.request, c.out.clone())), Err(&e));
                        return Err(e);
                    }
                    if let Some((vhost, control)) = a.sockets {
                        sockets = (Some(vhost), Some(control));
                    }
                    (a.grant, Some((a.request, c.out.clone())))
                }
                None => return Ok(()),
            }
        }
        _ => (
            cfg.grant_fds
                .map(|(page, doorbell)| inherited_grant(page, doorbell))
                .transpose()?,
            None,
        ),
    };
    let asker = channel.as_ref().map(|c| c.asker.clone());
    let broker = asker.clone().filter(|_| cfg.oversubscribe);
    let vgpu_id = cfg.device.vgpu_id;
    let stack = backend::assemble(gpu, &cfg.gpu, broker, vgpu_id);
    let (vgpu, gate) = match device(&cfg, &stack, asker.as_ref(), storage.as_ref(), grant) {
        Ok(v) => v,
        Err(e) => {
            answer_assignment(assigned.as_ref(), Err(&e));
            return Err(e);
        }
    };
    let vgpu = Arc::new(vgpu);
    // vgpud binds the sockets and hands them over; a worker run alone binds its own.
    let (vhost_fd, control_fd) = sockets;
    let vhost = match vhost_fd {
        Some(fd) => listener_from(fd, "--listen-fd")
            .map(vhost::vhost_user::Listener::from)
            .map_err(|why| WorkerError::Bind {
                path: cfg.socket.clone(),
                why,
            })
            .and_then(|l| serve::from_listener(l, &cfg.socket)),
        None => serve::bind(&cfg.socket),
    };
    let bound = vhost.and_then(|l| Ok((l, reconnect_socket(&cfg, control_fd)?)));
    let (mut listener, reconnect) = match bound {
        Ok(v) => v,
        Err(e) => {
            answer_assignment(assigned.as_ref(), Err(&e));
            return Err(e);
        }
    };
    answer_assignment(assigned.as_ref(), Ok(()));
    let incoming = match (&cfg.migrate_in, &cfg.migrate_token_file) {
        (Some(addr), Some(t)) => Some((crate::incoming::bind(addr)?, crate::incoming::token(t)?)),
        _ => None,
    };

    let shutdown: Shutdown = Arc::new(Mutex::new(None));
    serve::spawn_signal_thread(signals, shutdown.clone(), cfg.socket.clone(), gate.clone())?;
    let d = &cfg.device;
    tracing::info!(socket = %cfg.socket.display(), vgpu = vgpu_id, queues = d.num_queues,
        memory = d.memory_share, compute_share = d.compute_share, copy_share = d.copy_share,
        "listening");
    let state = Arc::new(ControlState {
        vgpu: vgpu.clone(),
        started: Instant::now(),
        shares: Mutex::new(Shares {
            compute: d.compute_share,
            copy: d.copy_share,
            priority: cfg.priority,
        }),
        connected: AtomicBool::new(false),
        stopping: AtomicBool::new(false),
        shutdown: shutdown.clone(),
        socket: cfg.socket.clone(),
        pager: stack.pager,
        asker,
        migratable: stack.migratable,
        gate,
        memory: d.memory_share,
        storage,
        outgoing: Arc::default(),
    });
    if let Some((listener, token)) = incoming {
        let (shutdown, socket, gate) = (shutdown.clone(), cfg.socket.clone(), state.gate.clone());
        let layers = (state.migratable.clone(), state.pager.clone());
        crate::incoming::start(listener, token, layers, move |_| {
            serve::stop(
                &shutdown,
                &socket,
                gate.as_deref(),
                "the vGPU's state did not arrive",
            );
        })?;
    }
    let out = channel
        .map(|c| start_control(c, &state, reconnect))
        .transpose()?;
    // Start-up is done: from here on only what serving the guest needs.
    let probing = probe::wanted(vgpu_id);
    if let Some((rest, dir)) = &probing {
        probe::before_filter(rest, dir);
    }
    sandbox::lock_down(cfg.seccomp)?;
    if probing.is_some() {
        probe::after_filter();
    }
    let served = serve::serve(
        &mut listener,
        vgpu,
        &shutdown,
        cfg.poll,
        cfg.max_guest_memory,
        state.outgoing.clone(),
        || {
            state.connected.store(true, Ordering::Relaxed);
            if let Some(out) = &out {
                out.send(&WorkerMessage::Connected);
            }
        },
    );
    if let Some(out) = &out {
        state.connected.store(false, Ordering::Relaxed);
        out.send(&WorkerMessage::Final {
            stats: state.stats(),
        });
    }
    served?;
    tracing::info!("frontend gone; exiting");
    Ok(())
}
