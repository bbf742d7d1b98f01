//! Serving the router on a listener: HTTP/1 connections through hyper with a header read
//! deadline (a client that stalls while sending a request's headers is disconnected), and
//! a graceful stop (no new connections; the open ones finish their requests).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinSet;

/// A listener vgpud serves: a unix or TCP socket.
pub(in crate::daemon) trait Accept {
    type Stream: AsyncRead + AsyncWrite + Unpin + Send + 'static;
    fn accept(&self) -> impl Future<Output = std::io::Result<Self::Stream>> + Send;
}

impl Accept for tokio::net::UnixListener {
    type Stream = tokio::net::UnixStream;
    async fn accept(&self) -> std::io::Result<Self::Stream> {
        tokio::net::UnixListener::accept(self).await.map(|(s, _)| s)
    }
}

impl Accept for tokio::net::TcpListener {
    type Stream = tokio::net::TcpStream;
    async fn accept(&self) -> std::io::Result<Self::Stream> {
        let (s, _) = tokio::net::TcpListener::accept(self).await?;
        let _ = s.set_nodelay(true);
        Ok(s)
    }
}

/// Bounds on the API's connections: vgpud keeps descriptors for its own work (vGPUs,
/// shared objects, workers) whatever its clients open.
#[derive(Clone, Copy, Debug)]
pub(in crate::daemon) struct Limits {
    /// A client gets this long to send a request's headers.
    pub header_read_timeout: Duration,
    /// A connection without I/O for this long is closed (a request in flight is answered
    /// first).
    pub idle_timeout: Duration,
    /// Most connections open at once; one more is closed on arrival.
    pub max_connections: usize,
    /// Descriptors kept free for vgpud's own work: a connection that would leave fewer is
    /// closed on arrival.
    pub reserve: u64,
}

impl Limits {
    /// The default cap for an open-file limit of `nofile`: a quarter of it, at most 1024,
    /// at least 16.
    pub fn default_max_connections(nofile: u64) -> usize {
        usize::try_from(nofile / 4)
            .unwrap_or(usize::MAX)
            .clamp(16, 1024)
    }
}

/// How long an idle-closed connection may take to finish a request in flight.
const FINISH_LIMIT: Duration = Duration::from_secs(600);

/// Descriptors kept free for vgpud's own work (`Limits::reserve`).
pub(in crate::daemon) const FD_RESERVE: u64 = 128;

/// When a connection last read or wrote, in ms since `start`.
struct Activity {
    start: Instant,
    last_ms: AtomicU64,
}

impl Activity {
    fn touch(&self) {
        let ms = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_ms.store(ms, Ordering::Relaxed);
    }

    /// How long until the connection has been idle for `idle` (zero: it has).
    fn idle_left(&self, idle: Duration) -> Duration {
        let since = self
            .start
            .elapsed()
            .saturating_sub(Duration::from_millis(self.last_ms.load(Ordering::Relaxed)));
        idle.saturating_sub(since)
    }
}

/// A stream that records its last I/O in an [`Activity`].
struct Tracked<S> {
    inner: S,
    activity: Arc<Activity>,
}

impl<S: AsyncRead + Unpin> AsyncRead for Tracked<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(r, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.activity.touch();
        }
        r
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Tracked<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, data);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.touch();
        }
        r
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Serves `app` on `listener` until `shutdown` resolves, then lets the open connections
/// finish their requests, within `limits`.
pub(in crate::daemon) async fn serve<L: Accept + Sync>(
    listener: L,
    app: Router,
    limits: Limits,
    shutdown: impl Future<Output = ()> + Send,
) -> std::io::Result<()> {
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .keep_alive(true);
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut conns = JoinSet::new();
    let permits = Arc::new(Semaphore::new(limits.max_connections));
    // When a refused connection was last logged (one line per 10 s at most).
    let mut refused_logged: Option<Instant> = None;
    let mut refused = 0u64;
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            () = &mut shutdown => break,
            // Finished connections are collected as they end.
            Some(_) = conns.join_next(), if !conns.is_empty() => continue,
            r = listener.accept() => r,
        };
        let stream = match stream {
            Ok(s) => s,
            Err(e) => {
                // Out of descriptors and the like: the listener itself stays good.
                tracing::warn!(error = %e, "cannot accept a connection");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let permit = match permits.clone().try_acquire_owned() {
            Ok(p) if super::super::shm::fd_headroom().is_none_or(|h| h >= limits.reserve) => p,
            _ => {
                // Closed on arrival: its descriptor goes back at once.
                drop(stream);
                refused += 1;
                if refused_logged.is_none_or(|t| t.elapsed() >= Duration::from_secs(10)) {
                    refused_logged = Some(Instant::now());
                    tracing::warn!(
                        open = limits.max_connections - permits.available_permits(),
                        max = limits.max_connections,
                        refused,
                        "API connections at their bound (--max-api-connections) or descriptors short; closing new ones until some end"
                    );
                }
                continue;
            }
        };
        let activity = Arc::new(Activity {
            start: Instant::now(),
            last_ms: AtomicU64::new(0),
        });
        let io = TokioIo::new(Tracked {
            inner: stream,
            activity: activity.clone(),
        });
        let conn = builder.serve_connection(io, TowerToHyperService::new(app.clone()));
        let mut stop = stop_rx.clone();
        let idle = limits.idle_timeout;
        conns.spawn(async move {
            let _permit = permit;
            let mut conn = std::pin::pin!(conn);
            let idled = async {
                loop {
                    let left = activity.idle_left(idle);
                    if left.is_zero() {
                        break;
                    }
                    tokio::time::sleep(left).await;
                }
            };
            let result = tokio::select! {
                r = conn.as_mut() => Some(r),
                () = async { drop(stop.wait_for(|s| *s).await) } => {
                    conn.as_mut().graceful_shutdown();
                    Some(conn.await)
                }
                () = idled => {
                    tracing::debug!("closing an idle API connection");
                    // A request in flight is answered; a client that does not read its
                    // answer holds the connection at most `FINISH_LIMIT` more.
                    conn.as_mut().graceful_shutdown();
                    tokio::time::timeout(idle.max(FINISH_LIMIT), conn).await.ok()
                }
            };
            if let Some(Err(e)) = result {
                tracing::debug!(error = %e, "connection closed");
            }
        });
    }
    let _ = stop_tx.send(true);
    while conns.join_next().await.is_some() {}
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    #[tokio::test]
    async fn a_client_stalled_in_its_headers_is_disconnected() {
        let dir = std::env::temp_dir().join(format!("vgpud-serve-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("api.sock");
        let _ = std::fs::remove_file(&path);
        let listener = tokio::net::UnixListener::bind(&path).expect("bind");
        let app = Router::new().route("/", axum::routing::get(|| async { "ok" }));
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let limits = Limits {
            header_read_timeout: Duration::from_millis(300),
            idle_timeout: Duration::from_secs(60),
            max_connections: 16,
            reserve: 0,
        };
        let server = tokio::spawn(serve(listener, app, limits, async {
            let _ = rx.await;
        }));
        let p = path.clone();
        let (closed_after, answered) = tokio::task::spawn_blocking(move || {
            // A whole request is answered.
            let mut ok = std::os::unix::net::UnixStream::connect(&p).expect("connect");
            ok.write_all(b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
                .expect("write");
            let mut answer = String::new();
            let _ = ok.read_to_string(&mut answer);
            // Half a request line and nothing more: closed at the deadline.
            let mut s = std::os::unix::net::UnixStream::connect(&p).expect("connect");
            s.set_read_timeout(Some(Duration::from_secs(10)))
                .expect("timeout");
            s.write_all(b"GET /v1/gp").expect("write");
            let t0 = std::time::Instant::now();
            let mut buf = [0u8; 256];
            loop {
                match s.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                }
            }
            (t0.elapsed(), answer)
        })
        .await
        .expect("client");
        assert!(answered.ends_with("ok"), "{answered}");
        assert!(
            closed_after < Duration::from_secs(5),
            "the stalled connection stayed open {closed_after:?}"
        );
        let _ = tx.send(());
        server.await.expect("join").expect("serve");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
