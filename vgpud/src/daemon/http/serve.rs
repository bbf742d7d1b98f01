//! Serving the router on a listener: HTTP/1 connections through hyper with a header read
//! deadline (a client that stalls while sending a request's headers is disconnected), and
//! a graceful stop (no new connections; the open ones finish their requests).

use std::future::Future;
use std::time::Duration;

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::watch;
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

/// Serves `app` on `listener` until `shutdown` resolves, then lets the open connections
/// finish their requests. A client gets `header_read_timeout` to send a request's headers.
pub(in crate::daemon) async fn serve<L: Accept + Sync>(
    listener: L,
    app: Router,
    header_read_timeout: Duration,
    shutdown: impl Future<Output = ()> + Send,
) -> std::io::Result<()> {
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(header_read_timeout)
        .keep_alive(true);
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut conns = JoinSet::new();
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
        let conn =
            builder.serve_connection(TokioIo::new(stream), TowerToHyperService::new(app.clone()));
        let mut stop = stop_rx.clone();
        conns.spawn(async move {
            let mut conn = std::pin::pin!(conn);
            let result = tokio::select! {
                r = conn.as_mut() => r,
                () = async { drop(stop.wait_for(|s| *s).await) } => {
                    conn.as_mut().graceful_shutdown();
                    conn.await
                }
            };
            if let Err(e) = result {
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
        let server = tokio::spawn(serve(listener, app, Duration::from_millis(300), async {
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
