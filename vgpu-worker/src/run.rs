//! One worker's life, one straight sequence of steps ([`run`]), each a function here:
//!
//! 1. [`prepare`]: the sandbox's first part (not dumpable, `no_new_privs`), SIGTERM and
//!    SIGINT blocked for the signal thread, the options that need vgpud checked;
//! 2. [`open_gpu`]: the storage namespaces and the GPU at the bottom of the backend stack
//!    (a pool worker opens it before it knows its vGPU);
//! 3. [`take_vgpu`]: the control channel and the vGPU to serve, with its grant path and
//!    sockets: the command line's, or a pool worker's assignment from vgpud (`pool.rs`);
//! 4. [`build`]: the backend stack over the GPU, the device, the sockets bound; a pool
//!    worker answers its assignment with the outcome;
//! 5. [`incoming`]: with `--migrate-in`, the listener for the source worker and its token;
//! 6. [`start`]: the signal thread, the control state, the receiver of an incoming
//!    migration, the control thread (which says `ready`);
//! 7. [`serve_guest`]: the seccomp filter, then the frontend served until it leaves, and
//!    the last counters to vgpud.

use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use vgpu_api::control::{ReplyBody, WorkerMessage};
use vgpu_backend::storage::{NamespaceSpec, StorageSet};
use vgpu_backend::Backend;
use vgpu_device::{DeviceConfig, SlotPolicy, Vgpu};

use crate::backend::{self, GpuSpec, Stack};
use crate::control::{control_socket, ControlLoop, ControlState, Reconnect, Shares};
use crate::error::WorkerError;
use crate::inherit;
use crate::memlink::{Asker, ControlOut, FdQueue, FdReader, WorkerShm};
use crate::pool;
use crate::sandbox::{self, probe, SeccompMode};
use crate::serve::{self, Front, Shutdown};

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

/// Serves the vGPU until its frontend disconnects or the worker is stopped.
pub fn run(cfg: Config) -> Result<(), WorkerError> {
    let signals = prepare(&cfg)?;
    let opened = open_gpu(&cfg)?;
    let Some(taken) = take_vgpu(cfg, &signals)? else {
        // An idle pool worker told to stop.
        return Ok(());
    };
    let Taken {
        cfg,
        channel,
        grant,
        sockets,
        answer,
    } = taken;
    let built = build(
        &cfg,
        channel.as_ref(),
        grant,
        sockets,
        opened,
        answer.is_some(),
    );
    if let Some(a) = &answer {
        a.send(built.as_ref().map(drop));
    }
    let built = built?;
    let incoming = incoming(&cfg)?;
    let running = start(cfg, channel, built, signals, incoming)?;
    serve_guest(running)
}

/// Step 1: the sandbox's first part, the signals blocked (every thread started later
/// inherits the mask; the signal thread takes them), the options that need vgpud.
fn prepare(cfg: &Config) -> Result<libc::sigset_t, WorkerError> {
    sandbox::harden()?;
    let signals = serve::block_signals()?;
    if (cfg.oversubscribe || cfg.shm || cfg.pool) && cfg.control_fd.is_none() {
        return Err(WorkerError::Control {
            fd: -1,
            why: "--oversubscribe, --shm and --pool need vgpud (the control channel)".into(),
        });
    }
    Ok(signals)
}

/// The GPU before the vGPU's layers go on it, and the storage namespaces it serves.
struct Opened {
    gpu: Arc<dyn Backend>,
    storage: Option<Arc<StorageSet>>,
}

/// Step 2: the storage namespaces and the GPU at the bottom of the backend stack.
fn open_gpu(cfg: &Config) -> Result<Opened, WorkerError> {
    let storage = backend::storage_set(&cfg.storage)?;
    let gpu = backend::gpu(&cfg.gpu, storage.as_ref())?;
    Ok(Opened { gpu, storage })
}

/// The listening sockets vgpud bound for the worker, when it did.
struct Sockets {
    /// The vhost-user socket the frontend connects to.
    vhost: Option<OwnedFd>,
    /// The control socket vgpud reconnects on.
    control: Option<OwnedFd>,
}

/// The vGPU the worker is to serve and what comes with it.
struct Taken {
    /// The configuration, a pool worker's completed by its assignment.
    cfg: Config,
    channel: Option<Channel>,
    /// The grant page and doorbell.
    grant: Option<(OwnedFd, OwnedFd)>,
    sockets: Sockets,
    /// A pool worker's assignment, answered once the vGPU is built.
    answer: Option<Answer>,
}

/// Step 3: the control channel, and the vGPU to serve: the command line's, or a pool
/// worker's assignment, awaited with its GPU open (`None`: the pool worker is to exit).
fn take_vgpu(mut cfg: Config, signals: &libc::sigset_t) -> Result<Option<Taken>, WorkerError> {
    let mut channel = open_channel(cfg.control_fd)?;
    let mut sockets = Sockets {
        vhost: inherit::fd(cfg.listen_fd, "--listen-fd")?,
        control: inherit::fd(cfg.control_listen_fd, "--control-listen-fd")?,
    };
    let (grant, answer) = match (&mut channel, cfg.pool) {
        (Some(c), true) => {
            let Some(a) = pool::await_assignment(&mut cfg, &mut c.input, &c.fds, &c.out, signals)?
            else {
                return Ok(None);
            };
            if let Some((vhost, control)) = a.sockets {
                sockets = Sockets {
                    vhost: Some(vhost),
                    control: Some(control),
                };
            }
            let answer = Answer {
                request: a.request,
                out: c.out.clone(),
            };
            (a.grant, Some(answer))
        }
        _ => (
            cfg.grant_fds
                .map(|(page, doorbell)| inherit::grant(page, doorbell))
                .transpose()?,
            None,
        ),
    };
    Ok(Some(Taken {
        cfg,
        channel,
        grant,
        sockets,
        answer,
    }))
}

/// A pool worker's `assign` request, to answer.
struct Answer {
    request: u64,
    out: Arc<ControlOut>,
}

impl Answer {
    /// `assigned` once the vGPU is built and its sockets bound, else why not.
    fn send(&self, result: Result<(), &WorkerError>) {
        let body = match result {
            Ok(()) => ReplyBody::Assigned {
                pid: std::process::id(),
            },
            Err(e) => ReplyBody::Error {
                message: e.to_string(),
            },
        };
        self.out.send(&WorkerMessage::Reply {
            id: self.request,
            body,
        });
    }
}

/// The vGPU built: its device, its backend stack's layers, its sockets.
struct Built {
    vgpu: Arc<Vgpu>,
    gate: Option<Arc<vgpu_grant::SwitchGate>>,
    stack: Stack,
    storage: Option<Arc<StorageSet>>,
    asker: Option<Arc<Asker>>,
    listener: Front,
    reconnect: Option<Reconnect>,
}

/// Step 4: the backend stack over the GPU, the device, the vhost-user and reconnect
/// sockets bound. A pool worker (`pooled`) is served only scheduled, and its share must
/// hold what its GPU charged when it opened.
fn build(
    cfg: &Config,
    channel: Option<&Channel>,
    grant: Option<(OwnedFd, OwnedFd)>,
    sockets: Sockets,
    opened: Opened,
    pooled: bool,
) -> Result<Built, WorkerError> {
    if pooled {
        check_pooled(cfg, grant.is_some(), &*opened.gpu)?;
    }
    let asker = channel.map(|c| c.asker.clone());
    let broker = asker.clone().filter(|_| cfg.oversubscribe);
    let stack = backend::assemble(opened.gpu, &cfg.gpu, broker, cfg.device.vgpu_id);
    let (vgpu, gate) = device(cfg, &stack, asker.as_ref(), opened.storage.as_ref(), grant)?;
    // vgpud binds the sockets and hands them over; a worker run alone binds its own.
    let listener = match sockets.vhost {
        Some(fd) => inherit::listener(fd, "--listen-fd")
            .map(vhost::vhost_user::Listener::from)
            .map_err(|why| WorkerError::Bind {
                path: cfg.socket.clone(),
                why,
            })
            .and_then(|l| serve::from_listener(l, &cfg.socket))?,
        None => serve::bind(&cfg.socket)?,
    };
    let reconnect = inherit::reconnect_socket(cfg, sockets.control)?;
    Ok(Built {
        vgpu: Arc::new(vgpu),
        gate,
        stack,
        storage: opened.storage,
        asker,
        listener,
        reconnect,
    })
}

/// A pool worker's assignment against what it has: vgpud always sends the grant page and
/// doorbell with it, and a share that cannot hold what the backend charged at start (the
/// CUDA context's reserve) is refused as a fresh worker would refuse it.
fn check_pooled(cfg: &Config, granted: bool, gpu: &dyn Backend) -> Result<(), WorkerError> {
    if !granted {
        return Err(WorkerError::Grant(
            "the vGPU's grant page and doorbell did not come with the assignment".into(),
        ));
    }
    let reserve = gpu.memory_usage().used;
    let share = cfg.device.memory_share;
    if reserve > share {
        return Err(WorkerError::Backend(
            vgpu_backend::BackendError::ContextReserve {
                share,
                reserve,
                detail: "charged when the pool worker opened its GPU".into(),
            },
        ));
    }
    Ok(())
}

/// Step 5: with `--migrate-in`, the listener the source worker connects to (bound before
/// the control thread says `ready`, so vgpud can send the source at once) and its token.
fn incoming(cfg: &Config) -> Result<Option<(crate::incoming::Listener, String)>, WorkerError> {
    match (&cfg.migrate_in, &cfg.migrate_token_file) {
        (Some(addr), Some(t)) => Ok(Some((
            crate::incoming::bind(addr)?,
            crate::incoming::token(t)?,
        ))),
        _ => Ok(None),
    }
}

/// A worker whose threads run, ready to serve its guest.
struct Running {
    cfg: Config,
    state: Arc<ControlState>,
    listener: Front,
    /// The control channel's writing end.
    out: Option<Arc<ControlOut>>,
    shutdown: Shutdown,
}

/// Step 6: the signal thread, the control state, the receiver of an incoming migration
/// (the guest's requests wait for the state), the control thread.
fn start(
    cfg: Config,
    channel: Option<Channel>,
    built: Built,
    signals: libc::sigset_t,
    incoming: Option<(crate::incoming::Listener, String)>,
) -> Result<Running, WorkerError> {
    let Built {
        vgpu,
        gate,
        stack,
        storage,
        asker,
        listener,
        reconnect,
    } = built;
    let shutdown: Shutdown = Arc::new(Mutex::new(None));
    serve::spawn_signal_thread(signals, shutdown.clone(), cfg.socket.clone(), gate.clone())?;
    let d = &cfg.device;
    tracing::info!(socket = %cfg.socket.display(), vgpu = d.vgpu_id, queues = d.num_queues,
        memory = d.memory_share, compute_share = d.compute_share, copy_share = d.copy_share,
        "listening");
    let state = Arc::new(ControlState {
        vgpu,
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
    Ok(Running {
        cfg,
        state,
        listener,
        out,
        shutdown,
    })
}

/// Step 7: the seccomp filter (start-up is done: from here on only what serving the guest
/// needs), the frontend served until it leaves, the last counters to vgpud.
fn serve_guest(running: Running) -> Result<(), WorkerError> {
    let Running {
        cfg,
        state,
        mut listener,
        out,
        shutdown,
    } = running;
    let probing = probe::wanted(cfg.device.vgpu_id);
    if let Some((rest, dir)) = &probing {
        probe::before_filter(rest, dir);
    }
    sandbox::lock_down(cfg.seccomp)?;
    if probing.is_some() {
        probe::after_filter();
    }
    let served = serve::serve(
        &mut listener,
        state.vgpu.clone(),
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
