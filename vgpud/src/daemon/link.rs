//! vgpud's end of one worker's control channel (see [`crate::control`]).

use std::collections::{HashMap, VecDeque};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use vmm_sys_util::sock_ctrl_msg::ScmSocket;

use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWriteExt, BufReader, ReadBuf};
use tokio::net::UnixStream;
use tokio::sync::{mpsc, oneshot};

use super::locks::{Rank, Ranked};
use crate::control::{
    self, Ask, Command, MemReport, MigrationProgress, ReplyBody, Request, WorkerMessage,
    WorkerStats,
};

/// What a worker reports without being asked (besides `ready`).
#[derive(Debug)]
pub enum Event {
    /// Its vmm connected.
    Connected,
    /// Its counters at the end; it exits next.
    Final(WorkerStats),
    /// A question to answer with [`Link::tell`] (`Command::Answer { to: id }`), with the
    /// descriptor that rode on its line when the ask carries one (`shm_create`).
    Ask {
        id: u64,
        ask: Ask,
        fd: Option<OwnedFd>,
    },
    /// Its pager's state changed.
    Memory(MemReport),
    /// A migration of it moved on.
    Migration(MigrationProgress),
}

type Pending = oneshot::Sender<Result<ReplyBody, String>>;

enum Out {
    /// A command whose reply someone waits for, with descriptors riding on its line.
    Call(Command, Pending, Vec<OwnedFd>),
    /// A command without a reply, with descriptors riding on its line.
    Tell(Command, Vec<OwnedFd>),
}

/// Sends commands to one worker.
#[derive(Clone, Debug)]
pub struct Link {
    tx: mpsc::Sender<Out>,
}

impl std::fmt::Debug for Out {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Out::Call(c, _, fds) => write!(f, "Call({c:?}, fds: {})", fds.len()),
            Out::Tell(c, fds) => write!(f, "Tell({c:?}, fds: {})", fds.len()),
        }
    }
}

impl Link {
    /// Sends `command` without waiting for a reply; `fd` (if any) rides with its line.
    pub async fn tell(&self, command: Command, fd: Option<OwnedFd>) -> Result<(), String> {
        self.tx
            .send(Out::Tell(command, fd.into_iter().collect()))
            .await
            .map_err(|_| "the worker's control channel is closed (the worker exited)".to_string())
    }

    /// Sends `command` and waits for the worker's reply at most `timeout`.
    pub async fn call(&self, command: Command, timeout: Duration) -> Result<ReplyBody, String> {
        self.call_with_fds(command, Vec::new(), timeout).await
    }

    /// Like [`Link::call`], with `fds` riding on the command's line (SCM_RIGHTS).
    pub async fn call_with_fds(
        &self,
        command: Command,
        fds: Vec<OwnedFd>,
        timeout: Duration,
    ) -> Result<ReplyBody, String> {
        let (tx, rx) = oneshot::channel();
        self.tx
            .send(Out::Call(command, tx, fds))
            .await
            .map_err(|_| {
                "the worker's control channel is closed (the worker exited)".to_string()
            })?;
        match tokio::time::timeout(timeout, rx).await {
            Ok(Ok(r)) => r,
            Ok(Err(_)) => Err("the worker's control channel closed before it answered".into()),
            Err(_) => Err(format!(
                "the worker did not answer within {} ms",
                timeout.as_millis()
            )),
        }
    }
}

/// Starts serving the channel on the runtime. `on_event` runs for each unprompted report. The returned receiver yields the worker's pid once it is ready
/// (its socket bound); it is dropped unanswered if the channel closes first.
pub fn start(
    stream: std::os::unix::net::UnixStream,
    on_event: impl Fn(Event) + Send + 'static,
) -> std::io::Result<(Link, oneshot::Receiver<u32>)> {
    stream.set_nonblocking(true)?;
    let stream = UnixStream::from_std(stream)?;
    let (tx, rx) = mpsc::channel(16);
    let (ready_tx, ready_rx) = oneshot::channel();
    tokio::spawn(serve(stream, rx, ready_tx, on_event));
    Ok((Link { tx }, ready_rx))
}

async fn serve(
    stream: UnixStream,
    mut commands: mpsc::Receiver<Out>,
    ready: oneshot::Sender<u32>,
    on_event: impl Fn(Event),
) {
    let (rd, mut wr) = stream.into_split();
    let limit = u64::try_from(control::MAX_LINE).unwrap_or(u64::MAX) + 1;
    let fds = Arc::new(Ranked::new(Rank::LinkFds, VecDeque::new()));
    let mut rd = BufReader::new(FdRead {
        half: rd,
        fds: fds.clone(),
    });
    let mut ready = Some(ready);
    let mut pending: HashMap<u64, Pending> = HashMap::new();
    let mut next_id = 1u64;
    let mut line = Vec::new();
    loop {
        // `line` keeps a partial line across select! rounds (read_until appends what it
        // read before a command branch won), so it is cleared only once a line is handled.
        let mut limited = (&mut rd).take(limit);
        tokio::select! {
            cmd = commands.recv() => {
                let Some(out) = cmd else { break };
                match out {
                    Out::Call(command, reply, fds) => {
                        let id = next_id;
                        next_id += 1;
                        let bytes = control::encode(&Request { id, command });
                        if let Err(e) = write_with_fds(&mut wr, &bytes, &fds).await {
                            let _ = reply.send(Err(format!("cannot write to the worker's control channel: {e}")));
                            continue;
                        }
                        pending.insert(id, reply);
                    }
                    Out::Tell(command, fds) => {
                        let bytes = control::encode(&Request { id: 0, command });
                        if let Err(e) = write_with_fds(&mut wr, &bytes, &fds).await {
                            tracing::warn!(error = %e, "cannot write to the worker's control channel");
                        }
                    }
                }
            }
            n = limited.read_until(b'\n', &mut line) => {
                match n {
                    Ok(0) => break,
                    Ok(_) if line.len() > control::MAX_LINE => {
                        tracing::warn!("worker sent an over-long control message; closing the channel");
                        break;
                    }
                    Ok(_) if line.last() != Some(&b'\n') => continue,
                    Ok(_) => {}
                    Err(e) => {
                        tracing::warn!(error = %e, "control channel read failed");
                        break;
                    }
                }
                match serde_json::from_slice::<WorkerMessage>(&line) {
                    Ok(WorkerMessage::Ready { pid }) => {
                        if let Some(r) = ready.take() {
                            let _ = r.send(pid);
                        }
                    }
                    Ok(WorkerMessage::Connected) => on_event(Event::Connected),
                    Ok(WorkerMessage::Final { stats }) => on_event(Event::Final(stats)),
                    Ok(WorkerMessage::Ask { id, ask }) => {
                        // Only a create carries a descriptor (on its line's first byte, so
                        // it arrived with this line or before it).
                        let fd = matches!(ask, Ask::ShmCreate { .. })
                            .then(|| fds.lock().pop_front())
                            .flatten();
                        on_event(Event::Ask { id, ask, fd })
                    }
                    Ok(WorkerMessage::Memory { memory }) => on_event(Event::Memory(memory)),
                    Ok(WorkerMessage::Migration { progress }) => on_event(Event::Migration(progress)),
                    Ok(WorkerMessage::Reply { id, body }) => match pending.remove(&id) {
                        Some(p) => {
                            let _ = p.send(Ok(body));
                        }
                        None => tracing::debug!(id, "reply to a request nobody waits for"),
                    },
                    Err(e) => tracing::warn!(error = %e, "ignoring a malformed message from the worker"),
                }
                line.clear();
            }
        }
    }
    for (_, p) in pending.drain() {
        let _ = p.send(Err("the worker's control channel closed".into()));
    }
}

/// Writes `bytes` with `fds` attached to their first byte (SCM_RIGHTS), then the rest.
async fn write_with_fds(
    wr: &mut tokio::net::unix::OwnedWriteHalf,
    bytes: &[u8],
    fds: &[OwnedFd],
) -> std::io::Result<()> {
    if fds.is_empty() {
        return wr.write_all(bytes).await;
    }
    let raw: Vec<i32> = fds.iter().map(|f| f.as_raw_fd()).collect();
    let stream: &UnixStream = wr.as_ref();
    let sent = loop {
        stream.writable().await?;
        let r = stream.try_io(tokio::io::Interest::WRITABLE, || {
            // SAFETY: the descriptor is the tokio stream's own, open for this whole call;
            // ManuallyDrop keeps the temporary std view from closing it.
            let s = std::mem::ManuallyDrop::new(unsafe {
                std::os::unix::net::UnixStream::from_raw_fd(stream.as_raw_fd())
            });
            s.send_with_fds(&[bytes], &raw)
                .map_err(|e| std::io::Error::from_raw_os_error(e.errno()))
        });
        match r {
            Ok(n) => break n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        }
    };
    if sent < bytes.len() {
        wr.write_all(&bytes[sent..]).await?;
    }
    Ok(())
}

/// Most descriptors waiting for the line that claims them; a worker that sends more than
/// its lines claim gets the extra ones closed (they cannot pile up in vgpud).
const MAX_WAITING_FDS: usize = 4;

/// The channel's read half, keeping the descriptors that ride on the worker's bytes in
/// arrival order. A worker sends one with the first byte of the line that claims it, and
/// writes one line at a time, so the queue order is the claiming lines' order.
struct FdRead {
    half: tokio::net::unix::OwnedReadHalf,
    fds: Arc<Ranked<VecDeque<OwnedFd>>>,
}

impl FdRead {
    fn keep(&self, fd: OwnedFd) {
        let mut q = self.fds.lock();
        if q.len() < MAX_WAITING_FDS {
            q.push_back(fd);
        } else {
            tracing::warn!("worker sent descriptors no line claims; closing the extra one");
        }
    }
}

impl AsyncRead for FdRead {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let stream: &UnixStream = this.half.as_ref();
        loop {
            if let Err(e) = std::task::ready!(stream.poll_read_ready(cx)) {
                return Poll::Ready(Err(e));
            }
            let room = buf.initialize_unfilled();
            let mut got = Vec::new();
            let r = stream.try_io(tokio::io::Interest::READABLE, || {
                recv_cloexec(stream.as_raw_fd(), room, &mut got)
            });
            for fd in got {
                this.keep(fd);
            }
            match r {
                Ok(n) => {
                    buf.advance(n);
                    return Poll::Ready(Ok(()));
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }
}

/// One `recvmsg` on the socket `fd` into `buf`; the descriptors that came with the bytes (at
/// most [`MAX_WAITING_FDS`]; the kernel closes any beyond) go to `fds`, close-on-exec from
/// the start (`MSG_CMSG_CLOEXEC`), so no process vgpud spawns meanwhile inherits one.
fn recv_cloexec(
    fd: std::os::fd::RawFd,
    buf: &mut [u8],
    fds: &mut Vec<OwnedFd>,
) -> std::io::Result<usize> {
    const FD_BYTES: usize = std::mem::size_of::<std::os::fd::RawFd>();
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: pure arithmetic on a small constant.
    let space = unsafe { libc::CMSG_SPACE((MAX_WAITING_FDS * FD_BYTES) as u32) } as usize;
    // u64 words: aligned for cmsghdr.
    let mut control = vec![0u64; space.div_ceil(8)];
    // SAFETY: an all-zero msghdr is a valid empty header.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = space;
    // SAFETY: `msg` points at `iov` (over `buf`) and `control`, both live and writable for
    // their stated lengths for this whole call.
    let n = unsafe { libc::recvmsg(fd, &mut msg, libc::MSG_CMSG_CLOEXEC) };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `msg` was filled by recvmsg; its control buffer is `control`, alive here.
    let mut c = unsafe { libc::CMSG_FIRSTHDR(&msg) };
    while !c.is_null() {
        // SAFETY: CMSG_FIRSTHDR/CMSG_NXTHDR return headers inside `control` or null.
        let h = unsafe { &*c };
        if h.cmsg_level == libc::SOL_SOCKET && h.cmsg_type == libc::SCM_RIGHTS {
            // SAFETY: the data of a header inside `control`.
            let data = unsafe { libc::CMSG_DATA(c) };
            let head = data as usize - c as usize;
            let count = (h.cmsg_len as usize).saturating_sub(head) / FD_BYTES;
            for i in 0..count {
                // SAFETY: `count` descriptors lie at `data` inside the header's length.
                let raw = unsafe { std::ptr::read_unaligned(data.cast::<i32>().add(i)) };
                // SAFETY: the kernel installed this descriptor in our table for this
                // message; nothing else owns it.
                fds.push(unsafe { OwnedFd::from_raw_fd(raw) });
            }
        }
        // SAFETY: `c` is a header of `msg`'s control buffer.
        c = unsafe { libc::CMSG_NXTHDR(&msg, c) };
    }
    usize::try_from(n).map_err(|_| std::io::Error::other("recvmsg returned a negative length"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A descriptor that rides on a worker's line arrives close-on-exec (no process vgpud
    /// spawns inherits it) and with the line's bytes; extra ones beyond the bound are not
    /// kept.
    #[test]
    fn descriptors_from_a_worker_arrive_close_on_exec() {
        let (a, b) = std::os::unix::net::UnixStream::pair().expect("pair");
        let devnull = OwnedFd::from(std::fs::File::open("/dev/null").expect("open"));
        let raw = [devnull.as_raw_fd()];
        a.send_with_fds(&[b"line\n".as_slice()], &raw)
            .expect("send");
        let mut buf = [0u8; 16];
        let mut fds = Vec::new();
        let n = recv_cloexec(b.as_raw_fd(), &mut buf, &mut fds).expect("recv");
        assert_eq!(&buf[..n], b"line\n");
        assert_eq!(fds.len(), 1);
        // SAFETY: fcntl on a descriptor we own.
        let flags = unsafe { libc::fcntl(fds[0].as_raw_fd(), libc::F_GETFD) };
        assert!(
            flags >= 0 && flags & libc::FD_CLOEXEC != 0,
            "flags {flags:#x}"
        );
        // More descriptors than the bound: the kernel closes those past it.
        let many: Vec<i32> = (0..MAX_WAITING_FDS + 2).map(|_| raw[0]).collect();
        a.send_with_fds(&[b"x".as_slice()], &many).expect("send");
        let mut more = Vec::new();
        recv_cloexec(b.as_raw_fd(), &mut buf, &mut more).expect("recv");
        assert_eq!(more.len(), MAX_WAITING_FDS);
    }
}
