//! vgpud's end of one worker's control channel (see [`crate::control`]).

use std::collections::HashMap;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;
use tokio::sync::{mpsc, oneshot};

use crate::control::{self, Command, ReplyBody, Request, WorkerMessage, WorkerStats};

/// What a worker reports without being asked (besides `ready`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Event {
    /// Its vmm connected.
    Connected,
    /// Its counters at the end; it exits next.
    Final(WorkerStats),
}

type Pending = oneshot::Sender<Result<ReplyBody, String>>;

/// Sends commands to one worker.
#[derive(Clone, Debug)]
pub struct Link {
    tx: mpsc::Sender<(Command, Pending)>,
}

impl Link {
    /// Sends `command` and waits for the worker's reply at most `timeout`.
    pub async fn call(&self, command: Command, timeout: Duration) -> Result<ReplyBody, String> {
        let (tx, rx) = oneshot::channel();
        self.tx.send((command, tx)).await.map_err(|_| {
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
    mut commands: mpsc::Receiver<(Command, Pending)>,
    ready: oneshot::Sender<u32>,
    on_event: impl Fn(Event),
) {
    let (rd, mut wr) = stream.into_split();
    let limit = u64::try_from(control::MAX_LINE).unwrap_or(u64::MAX) + 1;
    let mut rd = BufReader::new(rd);
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
                let Some((command, reply)) = cmd else { break };
                let id = next_id;
                next_id += 1;
                let bytes = control::encode(&Request { id, command });
                if let Err(e) = wr.write_all(&bytes).await {
                    let _ = reply.send(Err(format!("cannot write to the worker's control channel: {e}")));
                    continue;
                }
                pending.insert(id, reply);
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
