//! A pool worker's wait for its vGPU (`--pool`). vgpud keeps a few workers per GPU
//! started ahead of need: each has built its GPU backend (a cuda worker: its context, its
//! reserved address space and the built-in kernels; a sim worker: its simulated GPU), said
//! `ready`, and waits here on the control channel. vgpud's `assign` command names the
//! vGPU (id, memory share, queues, shares) and carries its grant page and doorbell and
//! the listening sockets vgpud bound for it (vhost-user, control); the worker then answers
//! `assigned`, and is that vGPU's worker like one started for it.
//!
//! An idle pool worker holds no tenant: it exits when vgpud's end of the channel closes
//! (vgpud stopped), on `shutdown`, and on SIGTERM or SIGINT (a handler that exits: there
//! is nothing to clean up). Its seccomp filter goes on once it is assigned and set up, as a
//! worker started for its vGPU puts it on once start-up is done.

use std::io::Read;
use std::os::fd::OwnedFd;

use vgpu_api::control::{self, Command, ReplyBody, Request, WorkerMessage};

use crate::error::WorkerError;
use crate::memlink::{ControlOut, FdQueue, FdReader};
use crate::run::Config;

/// Set in a pool worker's environment (tests only), it takes its assignment and never
/// answers: how vgpud copes with a hostile pool worker.
const STALL_ENV: &str = "VGPU_WORKER_POOL_STALL";

/// What the pool worker was assigned: the request to answer, the vGPU's grant page
/// and doorbell (when vgpud sent them), and the listening sockets vgpud bound for it (the
/// vhost-user socket its frontend connects to, the control socket vgpud reconnects on).
pub struct Assignment {
    pub request: u64,
    pub grant: Option<(OwnedFd, OwnedFd)>,
    pub sockets: Option<(OwnedFd, OwnedFd)>,
}

/// Reads one line, a byte at a time: nothing past the line is taken off the socket, so
/// the control loop that reads on after the assignment misses nothing. `None` when the
/// channel closed (or the line is too long).
fn read_line(input: &mut FdReader) -> Option<Vec<u8>> {
    let mut line = Vec::with_capacity(256);
    let mut b = [0u8; 1];
    loop {
        match input.read(&mut b) {
            Ok(0) => return None,
            Ok(_) => {
                if b[0] == b'\n' {
                    return Some(line);
                }
                if line.len() >= control::MAX_LINE {
                    tracing::warn!("control message too long; closing");
                    return None;
                }
                line.push(b[0]);
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => {
                tracing::warn!(error = %e, "control channel read failed");
                return None;
            }
        }
    }
}

/// Changes this thread's mask of SIGTERM and SIGINT (`how`: block or unblock).
fn mask(signals: &libc::sigset_t, how: libc::c_int) -> Result<(), WorkerError> {
    // SAFETY: `signals` is an initialised signal set; the call changes only this thread's
    // signal mask.
    let rc = unsafe { libc::pthread_sigmask(how, signals, std::ptr::null_mut()) };
    if rc != 0 {
        return Err(WorkerError::Signals(std::io::Error::from_raw_os_error(rc)));
    }
    Ok(())
}

/// Waits for vgpud's `assign` and applies it to `cfg` (the vGPU's device configuration,
/// memory share and priority). `None`: the worker is to exit (the channel closed, or
/// vgpud said `shutdown`). `signals` (SIGTERM, SIGINT) are deliverable while it waits.
pub fn await_assignment(
    cfg: &mut Config,
    input: &mut FdReader,
    fds: &FdQueue,
    out: &ControlOut,
    signals: &libc::sigset_t,
) -> Result<Option<Assignment>, WorkerError> {
    out.send(&WorkerMessage::Ready {
        pid: std::process::id(),
    });
    tracing::info!("pool worker ready; waiting for a vGPU");
    // A handler that exits, not the default action: the worker is pid 1 of its PID
    // namespace, and a signal at its default action does not reach such a process.
    set_handler(exit_now as extern "C" fn(libc::c_int) as libc::sighandler_t)?;
    mask(signals, libc::SIG_UNBLOCK)?;
    let got = wait(cfg, input, fds, out);
    mask(signals, libc::SIG_BLOCK)?;
    set_handler(libc::SIG_DFL)?;
    Ok(got)
}

/// SIGTERM or SIGINT while idle: nothing to clean up.
extern "C" fn exit_now(_: libc::c_int) {
    // SAFETY: _exit is async-signal-safe and ends the process at once.
    unsafe { libc::_exit(0) }
}

/// Sets the action of SIGTERM and SIGINT to `handler`.
fn set_handler(handler: libc::sighandler_t) -> Result<(), WorkerError> {
    for sig in [libc::SIGTERM, libc::SIGINT] {
        // SAFETY: a zeroed sigaction is valid; it names a handler that only calls _exit
        // (or the default action) with an empty mask and no flags.
        let rc = unsafe {
            let mut act: libc::sigaction = std::mem::zeroed();
            act.sa_sigaction = handler;
            libc::sigemptyset(&mut act.sa_mask);
            libc::sigaction(sig, &act, std::ptr::null_mut())
        };
        if rc != 0 {
            return Err(WorkerError::Signals(std::io::Error::last_os_error()));
        }
    }
    Ok(())
}

fn wait(
    cfg: &mut Config,
    input: &mut FdReader,
    fds: &FdQueue,
    out: &ControlOut,
) -> Option<Assignment> {
    loop {
        let line = read_line(input)?;
        let req: Request = match serde_json::from_slice(&line) {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(error = %e, "ignoring a malformed control message");
                continue;
            }
        };
        let reply = |body| {
            out.send(&WorkerMessage::Reply { id: req.id, body });
        };
        match req.command {
            Command::Assign {
                vgpu_id,
                memory,
                queues,
                compute_share,
                copy_share,
                priority,
            } => {
                if std::env::var_os(STALL_ENV).is_some() {
                    // A hostile pool worker for the tests: it never answers, and vgpud
                    // must give the vGPU a fresh worker.
                    tracing::warn!("{STALL_ENV} is set: never answering the assignment");
                    loop {
                        std::thread::park();
                    }
                }
                let grant = match (fds.pop(), fds.pop()) {
                    (Some(page), Some(doorbell)) => Some((page, doorbell)),
                    _ => None,
                };
                let sockets = match (fds.pop(), fds.pop()) {
                    (Some(vhost), Some(control)) => Some((vhost, control)),
                    _ => None,
                };
                let d = &mut cfg.device;
                d.vgpu_id = vgpu_id;
                d.memory_share = memory;
                d.num_queues = queues;
                d.compute_share = compute_share;
                d.copy_share = copy_share;
                cfg.gpu.memory = memory;
                cfg.priority = priority;
                tracing::info!(vgpu = vgpu_id, memory, queues, "pool worker assigned");
                return Some(Assignment {
                    request: req.id,
                    grant,
                    sockets,
                });
            }
            Command::Shutdown => {
                reply(ReplyBody::ShuttingDown);
                tracing::info!("vgpud stopped this idle pool worker");
                return None;
            }
            _ => reply(ReplyBody::Error {
                message: "this pool worker serves no vGPU yet".into(),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::{BufRead, BufReader, Write};
    use std::os::unix::net::UnixStream;
    use std::path::PathBuf;
    use std::sync::Arc;
    use std::time::Duration;

    use vgpu_device::{DeviceConfig, SlotPolicy};

    use super::*;
    use crate::backend::{BackendKind, GpuSpec};
    use crate::sandbox::SeccompMode;

    fn pool_config() -> Config {
        Config {
            socket: PathBuf::from("vgpu.sock"),
            device: DeviceConfig {
                vgpu_id: 0,
                num_queues: 1,
                queue_size: 256,
                memory_share: u64::MAX,
                compute_share: 1000,
                copy_share: 1000,
                batch: vgpu_device::BatchLimits::default(),
            },
            gpu: GpuSpec {
                kind: BackendKind::Sim,
                ordinal: 0,
                memory: u64::MAX,
                cuda_limits: Default::default(),
                sim_memory: Some(64 << 20),
                sim_copy_bw: 0,
                sim_speed: 1.0,
                sim_threads: 1,
            },
            priority: 0,
            control_fd: Some(-1),
            grant_fds: None,
            hw_slots: 0,
            slot_policy: SlotPolicy::Priority,
            oversubscribe: false,
            shm: true,
            poll: Duration::ZERO,
            max_guest_memory: vgpu_device::front::DEFAULT_MAX_GUEST_MEMORY,
            storage: Vec::new(),
            seccomp: SeccompMode::Off,
            control_listen: None,
            secret_file: None,
            listen_fd: None,
            control_listen_fd: None,
            reconnect: Duration::ZERO,
            migrate_in: None,
            migrate_token_file: None,
            pool: true,
        }
    }

    fn line(req: &Request) -> Vec<u8> {
        control::encode(req)
    }

    #[test]
    fn an_assignment_configures_the_vgpu_and_leaves_the_next_command_unread() {
        let (vgpud, worker) = UnixStream::pair().expect("pair");
        let fds = Arc::new(FdQueue::default());
        let mut input = FdReader::new(worker.try_clone().expect("clone"), fds.clone());
        let out = ControlOut::new(worker);
        let mut cfg = pool_config();
        let mut sent = line(&Request {
            id: 1,
            command: Command::Stats,
        });
        sent.extend(line(&Request {
            id: 2,
            command: Command::Assign {
                vgpu_id: 7,
                memory: 32 << 20,
                queues: 2,
                compute_share: 300,
                copy_share: 200,
                priority: 3,
            },
        }));
        sent.extend(line(&Request {
            id: 3,
            command: Command::Stats,
        }));
        (&vgpud).write_all(&sent).expect("send");
        let a = wait(&mut cfg, &mut input, &fds, &out).expect("assigned");
        assert_eq!(a.request, 2);
        assert!(a.grant.is_none(), "no descriptors rode with it");
        assert_eq!(
            (
                cfg.device.vgpu_id,
                cfg.device.memory_share,
                cfg.device.num_queues
            ),
            (7, 32 << 20, 2)
        );
        assert_eq!(
            (cfg.device.compute_share, cfg.device.copy_share),
            (300, 200)
        );
        assert_eq!((cfg.gpu.memory, cfg.priority), (32 << 20, 3));
        // The idle worker answered the first `stats` with an error.
        let mut replies = BufReader::new(vgpud.try_clone().expect("clone"));
        let mut text = String::new();
        replies.read_line(&mut text).expect("reply");
        let msg: WorkerMessage = serde_json::from_str(&text).expect("json");
        assert!(
            matches!(
                msg,
                WorkerMessage::Reply {
                    id: 1,
                    body: ReplyBody::Error { .. }
                }
            ),
            "{msg:?}"
        );
        // The command after the assignment is still there for the control loop.
        let mut rest = String::new();
        BufReader::new(input).read_line(&mut rest).expect("rest");
        let next: Request = serde_json::from_str(&rest).expect("json");
        assert_eq!(next.id, 3);
    }

    #[test]
    fn a_closed_channel_or_shutdown_ends_an_idle_pool_worker() {
        let (vgpud, worker) = UnixStream::pair().expect("pair");
        let fds = Arc::new(FdQueue::default());
        let mut input = FdReader::new(worker.try_clone().expect("clone"), fds.clone());
        let out = ControlOut::new(worker);
        let mut cfg = pool_config();
        (&vgpud)
            .write_all(&line(&Request {
                id: 1,
                command: Command::Shutdown,
            }))
            .expect("send");
        assert!(wait(&mut cfg, &mut input, &fds, &out).is_none());
        drop(vgpud);
        assert!(wait(&mut cfg, &mut input, &fds, &out).is_none());
    }
}
