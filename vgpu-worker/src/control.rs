//! The worker's end of the control channel (`vgpu_api::control`): adopting the inherited
//! socket, and the loop that reads vgpud's commands and answers them.

use std::io::{BufRead, BufReader, Read};
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use vgpu_api::control::{self, Command, ReplyBody, Request, WorkerMessage, WorkerStats};
use vgpu_backend::pager::Pager;
use vgpu_backend::storage::StorageSet;
use vgpu_device::Vgpu;
use vgpu_migration::Migratable;

use crate::error::WorkerError;
use crate::memlink::{Asker, ControlOut, FdQueue, FdReader};
use crate::migrate::MigrateCommand;
use crate::serve::{stop, Shutdown};

/// Shares and priority as last set (reported to vgpud; the guest's config space keeps the
/// values the vGPU started with).
#[derive(Clone, Copy, Debug)]
pub struct Shares {
    pub compute: u32,
    pub copy: u32,
    pub priority: i32,
}

/// What the control thread reports and acts on.
pub struct ControlState {
    pub vgpu: Arc<Vgpu>,
    pub started: Instant,
    pub shares: Mutex<Shares>,
    pub connected: AtomicBool,
    pub shutdown: Shutdown,
    pub socket: PathBuf,
    pub pager: Option<Arc<Pager>>,
    pub asker: Option<Arc<Asker>>,
    pub migratable: Arc<Migratable>,
    pub gate: Option<Arc<vgpu_grant::SwitchGate>>,
    /// The vGPU's memory share (a cuda target is sized by it).
    pub memory: u64,
    /// Storage namespaces the target GPU's backend must serve too.
    pub storage: Option<Arc<StorageSet>>,
}

impl ControlState {
    /// The counters now.
    pub fn stats(&self) -> WorkerStats {
        let s = self.vgpu.stats();
        let m = self.vgpu.backend().memory_usage();
        let sh = *self.shares.lock().unwrap_or_else(PoisonError::into_inner);
        WorkerStats {
            uptime_ns: u64::try_from(self.started.elapsed().as_nanos()).unwrap_or(u64::MAX),
            requests: s.requests,
            errors: s.errors,
            bytes_htod: s.bytes_htod,
            bytes_dtoh: s.bytes_dtoh,
            bytes_dtod: s.bytes_dtod,
            kernels: s.kernels,
            kernel_ns: s.kernel_ns,
            busy_ns: s.busy_ns,
            memory_used: m.used,
            allocations: m.allocations,
            compute_share: sh.compute,
            copy_share: sh.copy,
            priority: sh.priority,
            connected: self.connected.load(Ordering::Relaxed),
            memory: self.pager.as_ref().map(|p| p.state().into()),
        }
    }

    /// Answers one command; true: the worker is to stop.
    fn handle(&self, command: Command) -> (ReplyBody, bool) {
        match command {
            Command::Stats => (
                ReplyBody::Stats {
                    stats: self.stats(),
                },
                false,
            ),
            Command::SetShares {
                compute_share,
                copy_share,
                priority,
            } => (self.set_shares(compute_share, copy_share, priority), false),
            Command::Shutdown => (ReplyBody::ShuttingDown, true),
            Command::Evict { bytes, tier } => match &self.pager {
                Some(p) => {
                    let freed = p.evict(bytes, tier.into());
                    let memory = p.state().into();
                    (ReplyBody::Evicted { freed, memory }, false)
                }
                None => (no_pager(), false),
            },
            Command::Spill { bytes } => match &self.pager {
                Some(p) => {
                    let moved = p.spill(bytes);
                    let memory = p.state().into();
                    (ReplyBody::Spilled { moved, memory }, false)
                }
                None => (no_pager(), false),
            },
            Command::Migrate { .. } => (
                ReplyBody::Error {
                    message: "migrations are started before commands are handled".into(),
                },
                false,
            ),
            Command::Answer { .. } => (
                ReplyBody::Error {
                    message: "answers are routed before commands are handled".into(),
                },
                false,
            ),
        }
    }

    fn set_shares(&self, compute_share: u32, copy_share: u32, priority: i32) -> ReplyBody {
        let scale = vgpu_proto::SHARE_SCALE;
        if compute_share > scale || copy_share > scale {
            let message = format!(
                "shares are per-mille and must be at most {scale}; got compute {compute_share}, copy {copy_share}"
            );
            return ReplyBody::Error { message };
        }
        *self.shares.lock().unwrap_or_else(PoisonError::into_inner) = Shares {
            compute: compute_share,
            copy: copy_share,
            priority,
        };
        tracing::info!(compute_share, copy_share, priority, "shares changed");
        ReplyBody::SharesSet {
            compute_share,
            copy_share,
            priority,
        }
    }

    /// Stops the worker (see [`stop`]).
    fn stop(&self, why: &str) {
        stop(&self.shutdown, &self.socket, self.gate.as_deref(), why);
    }
}

fn no_pager() -> ReplyBody {
    ReplyBody::Error {
        message: "this vGPU does not oversubscribe memory (start the worker with --oversubscribe)"
            .into(),
    }
}

/// Adopts the inherited control socket.
pub fn control_socket(fd: i32) -> Result<UnixStream, WorkerError> {
    let err = |why: String| WorkerError::Control { fd, why };
    // SAFETY: an all-zero stat is a valid out-buffer for fstat.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat only writes to `st`; a bad fd yields EBADF, which we report.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Err(err(std::io::Error::last_os_error().to_string()));
    }
    if st.st_mode & libc::S_IFMT != libc::S_IFSOCK {
        return Err(err("not a socket".into()));
    }
    // SAFETY: the descriptor was inherited from vgpud for this purpose, is open (fstat
    // succeeded) and nothing else in this process owns it.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    Ok(UnixStream::from(owned))
}

/// Reads the next line into `line`; false when the channel is done (closed, broken, or
/// a line too long).
fn read_line(reader: &mut impl BufRead, line: &mut Vec<u8>) -> bool {
    line.clear();
    let limit = u64::try_from(control::MAX_LINE).unwrap_or(u64::MAX) + 1;
    match reader.by_ref().take(limit).read_until(b'\n', line) {
        Ok(0) => false,
        Ok(_) if line.last() != Some(&b'\n') && line.len() > control::MAX_LINE => {
            tracing::warn!(
                "control message longer than {} bytes; closing",
                control::MAX_LINE
            );
            false
        }
        Ok(_) => true,
        Err(e) => {
            tracing::warn!(error = %e, "control channel read failed");
            false
        }
    }
}

/// The target GPU's grant page and doorbell, when a `migrate` command says they ride with
/// it (they are the next two received descriptors).
fn take_grant(fds: &FdQueue, wanted: bool) -> Result<Option<(OwnedFd, OwnedFd)>, String> {
    if !wanted {
        return Ok(None);
    }
    match (fds.pop(), fds.pop()) {
        (Some(page), Some(doorbell)) => Ok(Some((page, doorbell))),
        _ => Err("the migration's grant descriptors did not arrive".into()),
    }
}

/// The control thread: the channel's reading end, its received descriptors, its writing
/// end, and what the commands act on.
pub struct ControlLoop {
    pub input: FdReader,
    pub fds: Arc<FdQueue>,
    pub out: Arc<ControlOut>,
    pub state: Arc<ControlState>,
}

impl ControlLoop {
    /// Reads commands until vgpud closes its end, answering each; then stops the worker.
    pub fn run(self) {
        let Self {
            input,
            fds,
            out,
            state,
        } = self;
        let mut reader = BufReader::new(input);
        let mut line = Vec::new();
        while read_line(&mut reader, &mut line) {
            let req: Request = match serde_json::from_slice(&line) {
                Ok(r) => r,
                Err(e) => {
                    tracing::warn!(error = %e, "ignoring a malformed control message");
                    continue;
                }
            };
            match req.command {
                Command::Answer { to, answer } => {
                    if let Some(a) = &state.asker {
                        a.answer(to, answer);
                    }
                }
                Command::Migrate {
                    target,
                    mode,
                    max_downtime_ms,
                    grant_fds,
                } => match take_grant(&fds, grant_fds) {
                    Ok(grant) => {
                        let cmd = MigrateCommand {
                            id: req.id,
                            target,
                            mode,
                            max_downtime_ms,
                            grant,
                        };
                        state.start_migration(out.clone(), cmd);
                    }
                    Err(message) => out.send(&WorkerMessage::Reply {
                        id: req.id,
                        body: ReplyBody::Error { message },
                    }),
                },
                command => {
                    let (body, exit) = state.handle(command);
                    out.send(&WorkerMessage::Reply { id: req.id, body });
                    if exit {
                        state.stop("vgpud asked to shut down");
                    }
                }
            }
        }
        if let Some(a) = &state.asker {
            a.close();
        }
        state.stop("vgpud closed the control channel");
    }
}
