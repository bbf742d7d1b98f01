//! Whole-VM migration, the destination worker's half (`--migrate-in ADDR`): the worker
//! listens on ADDR (bound at start-up, before the sandbox closes), takes one connection
//! from the source worker and receives the vGPU's state into its fresh backend
//! (`Migratable::receive_from`: the one-time token from `--migrate-token-file`, every
//! message checked). An oversubscribed vGPU's worker runs its own pager (`--oversubscribe`),
//! and every allocation received becomes the pager's (charged to the vGPU's share and
//! vgpud's reservation, evictable once the state is in place). The guest's requests wait
//! until the state is in place. If it never arrives whole, the worker stops: its VM cannot
//! run here, and the source keeps it.

use std::io::{self, Read, Write};
use std::net::TcpListener;
use std::os::fd::OwnedFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use vgpu_backend::pager::Pager;
use vgpu_migration::screen::{self, Replayed};
use vgpu_migration::Migratable;

use crate::error::WorkerError;

/// How long the destination waits on one read or write of the stream.
const STREAM_TIMEOUT: Duration = Duration::from_secs(60);

/// Where the source connects.
pub enum Listener {
    Unix(UnixListener, PathBuf),
    Tcp(TcpListener),
}

impl Listener {
    fn set_nonblocking(&self, on: bool) -> io::Result<()> {
        match self {
            Listener::Unix(l, _) => l.set_nonblocking(on),
            Listener::Tcp(l) => l.set_nonblocking(on),
        }
    }

    fn accept(&self) -> io::Result<UnixStream> {
        // Either kind of stream socket reads and writes the same; the unix type is only
        // the carrier of the descriptor.
        let fd: OwnedFd = match self {
            Listener::Unix(l, _) => l.accept()?.0.into(),
            Listener::Tcp(l) => {
                let (s, _) = l.accept()?;
                s.set_nodelay(true)?;
                s.into()
            }
        };
        let s = UnixStream::from(fd);
        s.set_read_timeout(Some(STREAM_TIMEOUT))?;
        s.set_write_timeout(Some(STREAM_TIMEOUT))?;
        Ok(s)
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        if let Listener::Unix(_, path) = self {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// Binds `addr` (`unix:PATH` or `tcp:HOST:PORT`).
pub fn bind(addr: &str) -> Result<Listener, WorkerError> {
    let err = |why: String| WorkerError::MigrateIn {
        at: addr.to_owned(),
        why,
    };
    if let Some(path) = addr.strip_prefix("unix:") {
        let path = PathBuf::from(path);
        if std::fs::symlink_metadata(&path).is_ok() {
            std::fs::remove_file(&path)
                .map_err(|e| err(format!("cannot remove the old socket: {e}")))?;
        }
        let l = UnixListener::bind(&path).map_err(|e| err(e.to_string()))?;
        return Ok(Listener::Unix(l, path));
    }
    if let Some(hp) = addr.strip_prefix("tcp:") {
        let l = TcpListener::bind(hp).map_err(|e| err(e.to_string()))?;
        return Ok(Listener::Tcp(l));
    }
    Err(err("give unix:PATH or tcp:HOST:PORT".into()))
}

/// Reads the one-time token.
pub fn token(path: &std::path::Path) -> Result<String, WorkerError> {
    let err = |why: String| WorkerError::MigrateIn {
        at: path.display().to_string(),
        why,
    };
    let t = std::fs::read_to_string(path)
        .map_err(|e| err(format!("cannot read the migration token: {e}")))?
        .trim()
        .to_owned();
    if t.is_empty() {
        return Err(err("the migration token is empty".into()));
    }
    Ok(t)
}

/// Most connections screened at once; one more is closed on arrival.
const SCREENING: usize = 16;

/// The connection, accepted on first use (so that the dispatch lock is held while the
/// worker waits for its source). A connection that does not open with a hello carrying
/// the move's token is told why and closed, and the next one awaited: only the source
/// that was given the token starts the move (vgpud cancels one whose source never comes).
/// Connections are screened side by side, so one that says nothing does not hold the
/// source up.
struct Lazy {
    listener: Listener,
    token: String,
    conn: Option<Replayed<UnixStream>>,
}

impl Lazy {
    fn conn(&mut self) -> io::Result<&mut Replayed<UnixStream>> {
        if self.conn.is_none() {
            let s = self.wait_for_source()?;
            tracing::info!("the source worker connected; receiving the vGPU's state");
            self.conn = Some(s);
        }
        self.conn
            .as_mut()
            .ok_or_else(|| io::Error::other("no connection"))
    }

    fn wait_for_source(&self) -> io::Result<Replayed<UnixStream>> {
        self.listener.set_nonblocking(true)?;
        let (found, arrived) = std::sync::mpsc::channel();
        let screening = Arc::new(AtomicUsize::new(0));
        loop {
            if let Ok(source) = arrived.try_recv() {
                return Ok(source);
            }
            let candidate = match self.listener.accept() {
                Ok(s) => s,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                }
                Err(e) => return Err(e),
            };
            if screening.load(Ordering::Acquire) >= SCREENING {
                continue;
            }
            screening.fetch_add(1, Ordering::AcqRel);
            let (found, count, token) = (found.clone(), screening.clone(), self.token.clone());
            let spawned = std::thread::Builder::new()
                .name("migrate-screen".into())
                .spawn(move || {
                    screen(candidate, token.as_bytes(), &found);
                    count.fetch_sub(1, Ordering::AcqRel);
                });
            if spawned.is_err() {
                screening.fetch_sub(1, Ordering::AcqRel);
            }
        }
    }
}

/// Reads the hello `s` opens with: passes the connection on to `found` when it carries
/// `token`, else tells it why and closes it.
fn screen(mut s: UnixStream, token: &[u8], found: &std::sync::mpsc::Sender<Replayed<UnixStream>>) {
    let screened = s
        .set_nonblocking(false)
        .and_then(|()| s.set_read_timeout(Some(screen::HELLO_WAIT)))
        .map_err(|e| vgpu_migration::MigrationError::Stream(e.to_string()))
        .and_then(|()| screen::screen_source(&mut s, token));
    match screened {
        Ok(head) => {
            if s.set_read_timeout(Some(STREAM_TIMEOUT)).is_ok() {
                let _ = found.send(Replayed::new(head, s));
            }
        }
        Err(e) => {
            tracing::warn!(error = %e, "closed a connection that is not the source's; still waiting for it");
            screen::refuse(&mut s, &e);
        }
    }
}

impl Read for Lazy {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.conn()?.read(buf)
    }
}

impl Write for Lazy {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.conn()?.write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.conn()?.flush()
    }
}

/// Receives the state on its own thread; returns once the guest's requests are held
/// back. `layers` are the vGPU's migratable layer and, for an oversubscribed vGPU, the
/// pager above it. `failed` runs when the state did not arrive whole.
pub fn start(
    listener: Listener,
    token: String,
    layers: (Arc<Migratable>, Option<Arc<Pager>>),
    failed: impl FnOnce(String) + Send + 'static,
) -> Result<(), WorkerError> {
    let (locked_tx, locked_rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("migrate-in".into())
        .spawn(move || {
            let conn = Lazy {
                listener,
                token: token.clone(),
                conn: None,
            };
            let (migratable, pager) = layers;
            let r = migratable.receive_into(conn, token.as_bytes(), pager.as_deref(), move || {
                let _ = locked_tx.send(());
            });
            match r {
                Ok(got) => tracing::info!(
                    allocations = got.allocations,
                    bytes = got.bytes,
                    modules = got.modules,
                    functions = got.functions,
                    variables = got.variables,
                    "the vGPU's state arrived; serving the guest"
                ),
                Err(e) => {
                    tracing::error!(error = %e, "the vGPU's state did not arrive; stopping");
                    failed(e.to_string());
                }
            }
        })
        .map_err(WorkerError::Signals)?;
    locked_rx.recv().map_err(|_| WorkerError::Control {
        fd: -1,
        why: "the receiving thread ended before it started".into(),
    })
}
