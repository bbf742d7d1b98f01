//! The worker's end of the control channel (`vgpu_api::control`): adopting the inherited
//! socket, the loop that reads vgpud's commands and answers them, and waiting for vgpud
//! to come back on the control socket when the channel closes (a vgpud restart).

use std::io::{BufRead, BufReader, Read};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

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
    /// vgpud asked it to stop: a closed channel then is no reason to wait for vgpud.
    pub stopping: AtomicBool,
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
    /// A move of the vGPU to another host's worker.
    pub outgoing: Arc<crate::outgoing::Outgoing>,
}

impl ControlState {
    /// The counters now.
    pub fn stats(&self) -> WorkerStats {
        let s = self.vgpu.stats();
        let m = self.vgpu.backend().memory_usage();
        let sh = *vgpu_sync::lock(&self.shares);
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
            pinned_host_bytes: s.pinned_host_bytes,
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
            Command::MigrateOut { .. } => (
                ReplyBody::Error {
                    message: "moves to another host are started before commands are handled".into(),
                },
                false,
            ),
            Command::CancelMigrateOut => {
                let was = self.outgoing.cancel();
                (ReplyBody::Cancelled { running: was }, false)
            }
            Command::Assign { .. } => (
                ReplyBody::Error {
                    message: "this worker serves a vGPU already; only an idle pool worker takes an assignment".into(),
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
        *vgpu_sync::lock(&self.shares) = Shares {
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

/// How the worker waits for vgpud to come back when the control channel closes (vgpud
/// restarted or was upgraded): a listening socket in its private directory, the secret
/// vgpud must present, and how long to wait.
pub struct Reconnect {
    pub listener: UnixListener,
    pub secret: String,
    pub wait: Duration,
}

/// The control thread: the channel's reading end, its received descriptors, its writing
/// end, and what the commands act on.
pub struct ControlLoop {
    pub input: FdReader,
    pub fds: Arc<FdQueue>,
    pub out: Arc<ControlOut>,
    pub state: Arc<ControlState>,
    /// Wait for vgpud to reconnect when the channel closes; `None`: stop at once.
    pub reconnect: Option<Reconnect>,
}

impl ControlLoop {
    /// Serves the channel until vgpud closes its end. With [`Reconnect`] the worker then
    /// keeps serving its guest (ungated: nobody schedules it) and waits for vgpud to come
    /// back; once it does not within the wait, or without [`Reconnect`], it stops.
    pub fn run(self) {
        let Self {
            input,
            fds,
            out,
            state,
            reconnect,
        } = self;
        let mut reader = BufReader::new(input);
        loop {
            serve_channel(&mut reader, &fds, &out, &state);
            if let Some(a) = &state.asker {
                a.close();
            }
            let Some(r) = &reconnect else { break };
            if state.stopping.load(Ordering::Relaxed) {
                break;
            }
            // Nobody schedules this vGPU until vgpud is back: its requests run ungated
            // rather than wait (the guest keeps computing).
            if let Some(g) = &state.gate {
                g.close();
            }
            tracing::warn!(
                wait_s = r.wait.as_secs(),
                "vgpud closed the control channel; serving the guest and waiting for it to reconnect"
            );
            match await_vgpud(r, &fds, &state) {
                Some((next, stream)) => {
                    reader = next;
                    out.replace(stream);
                    out.send(&WorkerMessage::Ready {
                        pid: std::process::id(),
                    });
                    if state.connected.load(Ordering::Relaxed) {
                        out.send(&WorkerMessage::Connected);
                    }
                    tracing::info!("vgpud reconnected; the control channel is back");
                }
                None => break,
            }
        }
        let why = if reconnect.is_some() && !state.stopping.load(Ordering::Relaxed) {
            "vgpud did not come back on the control socket in time"
        } else {
            "vgpud closed the control channel"
        };
        state.stop(why);
    }
}

/// Reads and answers commands until the channel closes.
fn serve_channel(
    reader: &mut BufReader<FdReader>,
    fds: &FdQueue,
    out: &Arc<ControlOut>,
    state: &Arc<ControlState>,
) {
    let mut line = Vec::new();
    while read_line(reader, &mut line) {
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
            } => match take_grant(fds, grant_fds) {
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
            Command::MigrateOut {
                token,
                max_downtime_ms,
                stop_copy,
            } => match fds.pop() {
                Some(stream) => state.start_migrate_out(
                    out.clone(),
                    req.id,
                    stream,
                    token,
                    Duration::from_millis(max_downtime_ms),
                    stop_copy,
                ),
                None => out.send(&WorkerMessage::Reply {
                    id: req.id,
                    body: ReplyBody::Error {
                        message: "the stream to the destination did not arrive".into(),
                    },
                }),
            },
            command => {
                let (body, exit) = state.handle(command);
                out.send(&WorkerMessage::Reply { id: req.id, body });
                if exit {
                    state.stopping.store(true, Ordering::Relaxed);
                    state.stop("vgpud asked to shut down");
                }
            }
        }
    }
}

/// The first line a reconnecting vgpud sends: `attach <secret>`, with the vGPU's new
/// grant page and doorbell riding on it (SCM_RIGHTS).
pub const ATTACH: &str = "attach ";

/// How long a connection on the control socket may take to present its secret.
const HELLO_TIMEOUT: Duration = Duration::from_secs(5);

/// Waits for vgpud on the control socket until the wait is over: the reader of the new
/// channel and its writing end, or `None`. A connection that does not present the secret
/// is closed and the wait goes on.
fn await_vgpud(
    r: &Reconnect,
    fds: &Arc<FdQueue>,
    state: &ControlState,
) -> Option<(BufReader<FdReader>, UnixStream)> {
    let deadline = Instant::now() + r.wait;
    loop {
        let left = deadline.checked_duration_since(Instant::now())?;
        if !readable(&r.listener, left) {
            continue;
        }
        let stream = match r.listener.accept() {
            Ok((s, _)) => s,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(e) => {
                tracing::warn!(error = %e, "accept on the control socket failed");
                continue;
            }
        };
        match hello(stream, fds, &r.secret, state) {
            Ok(v) => return Some(v),
            Err(why) => tracing::warn!(%why, "refused a connection on the control socket"),
        }
    }
}

/// Whether `listener` has a connection waiting within `timeout`.
fn readable(listener: &UnixListener, timeout: Duration) -> bool {
    let mut pfd = libc::pollfd {
        fd: listener.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = libc::c_int::try_from(timeout.as_millis())
        .unwrap_or(libc::c_int::MAX)
        .max(1);
    // SAFETY: `pfd` is one valid pollfd for the duration of the call.
    let n = unsafe { libc::poll(&mut pfd, 1, ms) };
    n > 0 && pfd.revents & libc::POLLIN != 0
}

/// Checks a reconnecting vgpud's secret and takes its grant descriptors.
fn hello(
    stream: UnixStream,
    fds: &Arc<FdQueue>,
    secret: &str,
    state: &ControlState,
) -> Result<(BufReader<FdReader>, UnixStream), String> {
    stream.set_nonblocking(false).map_err(|e| e.to_string())?;
    stream
        .set_read_timeout(Some(HELLO_TIMEOUT))
        .map_err(|e| e.to_string())?;
    let input = stream.try_clone().map_err(|e| e.to_string())?;
    // Descriptors left from the old channel belong to nobody now.
    while fds.pop().is_some() {}
    let mut reader = BufReader::new(FdReader::new(input, fds.clone()));
    let mut line = Vec::new();
    if !read_line(&mut reader, &mut line) {
        return Err("the connection closed before it said who it is".into());
    }
    let text = String::from_utf8_lossy(&line);
    let given = text.trim_end().strip_prefix(ATTACH).unwrap_or_default();
    if !same_secret(given.as_bytes(), secret.as_bytes()) {
        while fds.pop().is_some() {}
        return Err("wrong secret".into());
    }
    stream.set_read_timeout(None).map_err(|e| e.to_string())?;
    if let (Some(g), Some(page), Some(doorbell)) = (&state.gate, fds.pop(), fds.pop()) {
        match vgpu_grant::GrantClient::from_fds(page, doorbell) {
            Ok(c) => {
                g.reopen(c);
                tracing::info!("scheduled by vgpud again (new grant channel)");
            }
            Err(e) => {
                tracing::warn!(error = %e, "the new grant channel is unusable; running ungated")
            }
        }
    }
    Ok((reader, stream))
}

/// Compares secrets in time that does not depend on where they differ.
fn same_secret(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() || a.is_empty() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_compare_whole() {
        assert!(same_secret(b"abc123", b"abc123"));
        assert!(!same_secret(b"abc123", b"abc124"));
        assert!(!same_secret(b"abc", b"abc123"));
        assert!(!same_secret(b"", b""), "an empty secret never matches");
    }
}
