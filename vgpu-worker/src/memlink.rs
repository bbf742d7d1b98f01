//! The worker's side of vgpud's memory decisions and shared memory registry: questions
//! asked over the control channel ([`vgpu_api::control::Ask`]) and their answers, a
//! [`Broker`] for the pager of an oversubscribed vGPU, and a [`ShmHost`] for the device.

use std::collections::{HashMap, VecDeque};
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use vgpu_backend::pager::{Broker, MemState};
use vgpu_backend::{require_shared_memory, Backend};
use vgpu_device::{ShmError, ShmHost};
use vmm_sys_util::sock_ctrl_msg::ScmSocket;

use vgpu_api::control::{self, Answer, Ask, ShmFailure, WorkerMessage};

/// How long a question waits for vgpud (a reservation may wait for other vGPUs to swap
/// out several gigabytes).
pub const ASK_TIMEOUT: Duration = Duration::from_secs(120);

/// The worker's writing end of the control channel.
pub struct ControlOut(Mutex<UnixStream>);

impl ControlOut {
    /// Wraps the stream.
    pub fn new(stream: UnixStream) -> Self {
        Self(Mutex::new(stream))
    }

    /// Writes to `stream` from now on (vgpud reconnected).
    pub fn replace(&self, stream: UnixStream) {
        *vgpu_sync::lock(&self.0) = stream;
    }

    /// Sends one message as a line.
    pub fn send(&self, msg: &WorkerMessage) {
        let line = control::encode(msg);
        let mut out = vgpu_sync::lock(&self.0);
        if let Err(e) = out.write_all(&line) {
            tracing::warn!(error = %e, "cannot write to the control channel");
        }
    }

    /// Sends one message as a line with `fd` riding on its first byte (SCM_RIGHTS).
    pub fn send_with_fd(&self, msg: &WorkerMessage, fd: &OwnedFd) {
        let line = control::encode(msg);
        let mut out = vgpu_sync::lock(&self.0);
        let sent = match out.send_with_fds(&[&line[..]], &[fd.as_raw_fd()]) {
            Ok(n) => n,
            Err(e) => {
                tracing::warn!(error = %e, "cannot write to the control channel");
                return;
            }
        };
        if let Some(rest) = line.get(sent..).filter(|r| !r.is_empty()) {
            if let Err(e) = out.write_all(rest) {
                tracing::warn!(error = %e, "cannot write to the control channel");
            }
        }
    }
}

/// File descriptors received on the control channel, in arrival order.
#[derive(Default)]
pub struct FdQueue(Mutex<VecDeque<OwnedFd>>);

impl FdQueue {
    fn push(&self, fd: OwnedFd) {
        vgpu_sync::lock(&self.0).push_back(fd);
    }

    /// The oldest descriptor not yet taken.
    pub fn pop(&self) -> Option<OwnedFd> {
        vgpu_sync::lock(&self.0).pop_front()
    }
}

/// Reads the control socket and keeps the descriptors that ride with its bytes. The
/// daemon sends a descriptor with the first byte of the line that needs it, and the
/// kernel never merges a read across that boundary, so the queue order is the line order.
pub struct FdReader {
    sock: UnixStream,
    fds: Arc<FdQueue>,
}

impl FdReader {
    /// Reads `sock`, queueing descriptors into `fds`.
    pub fn new(sock: UnixStream, fds: Arc<FdQueue>) -> Self {
        Self { sock, fds }
    }
}

impl Read for FdReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let mut iov = [libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        }];
        let mut raw = [-1i32; MAX_FDS];
        // SAFETY: the iovec points at `buf`, which is valid for writes of its length for
        // this whole call; `raw` has room for MAX_FDS descriptors.
        let (n, nfds) = unsafe { self.sock.recv_with_fds(&mut iov, &mut raw) }
            .map_err(|e| std::io::Error::from_raw_os_error(e.errno()))?;
        for fd in raw.iter().take(nfds).filter(|fd| **fd >= 0) {
            // SAFETY: recvmsg installed this descriptor in our table just now; nothing
            // else owns it.
            self.fds.push(unsafe { OwnedFd::from_raw_fd(*fd) });
        }
        Ok(n)
    }
}

/// Most descriptors one control line carries.
pub const MAX_FDS: usize = 4;

type Waiter = mpsc::SyncSender<(Answer, Option<OwnedFd>)>;

/// Asks vgpud questions and routes its answers back to the askers.
pub struct Asker {
    out: Arc<ControlOut>,
    fds: Arc<FdQueue>,
    waiters: Mutex<HashMap<u64, Waiter>>,
    next: AtomicU64,
}

impl Asker {
    /// Asks through `out`; descriptors arrive in `fds` (filled by the [`FdReader`]).
    pub fn new(out: Arc<ControlOut>, fds: Arc<FdQueue>) -> Self {
        Self {
            out,
            fds,
            waiters: Mutex::new(HashMap::new()),
            next: AtomicU64::new(1),
        }
    }

    /// Asks and waits for the answer (and the descriptor that came with it).
    pub fn ask(&self, ask: Ask) -> Result<(Answer, Option<OwnedFd>), String> {
        self.ask_with(ask, None)
    }

    /// [`Asker::ask`] with `fd` riding on the ask's line; it is closed here once sent
    /// (vgpud holds its own copy).
    pub fn ask_with_fd(&self, ask: Ask, fd: OwnedFd) -> Result<(Answer, Option<OwnedFd>), String> {
        self.ask_with(ask, Some(fd))
    }

    fn ask_with(&self, ask: Ask, fd: Option<OwnedFd>) -> Result<(Answer, Option<OwnedFd>), String> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = mpsc::sync_channel(1);
        vgpu_sync::lock(&self.waiters).insert(id, tx);
        let msg = WorkerMessage::Ask { id, ask };
        match fd {
            Some(fd) => self.out.send_with_fd(&msg, &fd),
            None => self.out.send(&msg),
        }
        let r = rx.recv_timeout(ASK_TIMEOUT).map_err(|e| match e {
            mpsc::RecvTimeoutError::Timeout => {
                format!("vgpud did not answer within {} s", ASK_TIMEOUT.as_secs())
            }
            mpsc::RecvTimeoutError::Disconnected => {
                "the control channel to vgpud closed".to_string()
            }
        });
        vgpu_sync::lock(&self.waiters).remove(&id);
        r
    }

    /// Delivers vgpud's answer to question `to` (the control loop calls this).
    pub fn answer(&self, to: u64, answer: Answer) {
        let fd = matches!(answer, Answer::Attach { .. })
            .then(|| self.fds.pop())
            .flatten();
        let waiter = vgpu_sync::lock(&self.waiters).remove(&to);
        match waiter {
            Some(w) => {
                let _ = w.send((answer, fd));
            }
            None => tracing::debug!(to, "answer to a question nobody waits for"),
        }
    }

    /// Fails every waiting question (the channel closed).
    pub fn close(&self) {
        vgpu_sync::lock(&self.waiters).clear();
    }

    /// Reports the pager's state.
    pub fn report(&self, m: MemState) {
        self.out.send(&WorkerMessage::Memory { memory: m.into() });
    }
}

/// The pager's broker in a worker: vgpud decides.
pub struct ControlBroker(pub Arc<Asker>);

impl Broker for ControlBroker {
    fn reserve(&self, bytes: u64) -> Result<(), String> {
        match self.0.ask(Ask::Reserve { bytes })? {
            (Answer::Granted, _) => Ok(()),
            (Answer::Refused { why }, _) => Err(why),
            (other, _) => Err(format!("unexpected answer from vgpud: {other:?}")),
        }
    }

    fn report(&self, state: MemState) {
        self.0.report(state);
    }
}

fn shm_error(failure: ShmFailure, message: String) -> ShmError {
    match failure {
        ShmFailure::NotFound => ShmError::NotFound(message),
        ShmFailure::Exists => ShmError::Invalid(message),
        ShmFailure::Denied => ShmError::Denied(message),
        ShmFailure::Invalid => ShmError::Invalid(message),
        ShmFailure::NoMemory => ShmError::NoMemory(message),
    }
}

fn values(r: Result<(Answer, Option<OwnedFd>), String>) -> Result<[u64; 4], ShmError> {
    match r.map_err(ShmError::Unavailable)? {
        (Answer::Values { values }, _) => Ok(values),
        (Answer::ShmError { failure, message }, _) => Err(shm_error(failure, message)),
        (other, _) => Err(ShmError::Unavailable(format!(
            "unexpected answer from vgpud: {other:?}"
        ))),
    }
}

/// Shared device memory for one vGPU: the registry is vgpud's, the mappings are ours.
pub struct WorkerShm {
    asker: Arc<Asker>,
    backend: Arc<dyn Backend>,
    /// Device address of each mapping -> its object.
    maps: Mutex<HashMap<u64, u64>>,
}

impl WorkerShm {
    /// Maps objects into `backend`'s address space, asking vgpud through `asker`.
    pub fn new(asker: Arc<Asker>, backend: Arc<dyn Backend>) -> Self {
        Self {
            asker,
            backend,
            maps: Mutex::new(HashMap::new()),
        }
    }
}

impl ShmHost for WorkerShm {
    /// Looks the key up in vgpud's registry; when vgpud says the object is new, creates it
    /// on this vGPU's GPU (`SharedMemory::export`) and hands vgpud its descriptor. The ask that
    /// makes vgpud wait for us never waits on us: vgpud answers `Export` at once, and this
    /// thread creates the object with no question open.
    fn get(&self, key: u64, size: u64, flags: u64) -> Result<u64, ShmError> {
        match self.asker.ask(Ask::ShmGet { key, size, flags }) {
            Ok((Answer::Export, _)) => {
                let fd = require_shared_memory(&*self.backend)
                    .and_then(|s| s.export(size))
                    .map_err(|e| {
                        ShmError::NoMemory(format!("creating the shared object on the GPU: {e}"))
                    })?;
                let created = self
                    .asker
                    .ask_with_fd(Ask::ShmCreate { key, size, flags }, fd);
                values(created).map(|v| v[0])
            }
            other => values(other).map(|v| v[0]),
        }
    }

    fn attach(&self, shmid: u64, read_only: bool) -> Result<u64, ShmError> {
        let (size, fd) = match self.asker.ask(Ask::ShmAttach { shmid }) {
            Ok((Answer::Attach { size }, Some(fd))) => (size, fd),
            Ok((Answer::Attach { .. }, None)) => {
                return Err(ShmError::Unavailable(
                    "vgpud's attach answer came without the object's descriptor".into(),
                ))
            }
            other => return values(other).map(|_| 0),
        };
        match require_shared_memory(&*self.backend).and_then(|s| s.import(fd, size, read_only)) {
            Ok(addr) => {
                vgpu_sync::lock(&self.maps).insert(addr, shmid);
                Ok(addr)
            }
            Err(e) => {
                // Undo the attachment vgpud counted.
                let _ = self.asker.ask(Ask::ShmDetach { shmid });
                Err(ShmError::NoMemory(e.to_string()))
            }
        }
    }

    fn detach(&self, addr: u64) -> Result<(), ShmError> {
        let shmid = vgpu_sync::lock(&self.maps).remove(&addr).ok_or_else(|| {
            ShmError::NotFound(format!(
                "mapping at {addr:#x}; pass an address SHM_AT returned"
            ))
        })?;
        if let Err(e) = self.backend.free(addr) {
            tracing::warn!(addr, error = %e, "unmapping a shared object failed");
        }
        values(self.asker.ask(Ask::ShmDetach { shmid })).map(|_| ())
    }

    fn ctl(&self, shmid: u64, cmd: u32) -> Result<[u64; 4], ShmError> {
        values(self.asker.ask(Ask::ShmCtl { shmid, cmd }))
    }
}
