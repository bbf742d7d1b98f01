//! gRPC over unix sockets, the way the kubelet speaks it: a server on a socket path (a
//! stale file there is replaced) and a client channel to one.

use std::path::{Path, PathBuf};

use hyper_util::rt::TokioIo;
use tokio::net::{UnixListener, UnixStream};
use tokio::task::JoinHandle;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::transport::{Channel, Endpoint};

/// Why a socket could not be served or reached.
#[derive(Debug, thiserror::Error)]
pub enum GrpcError {
    #[error(
        "cannot listen on {path}: {source} (is the directory there and writable by the agent?)"
    )]
    Listen {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot connect to {path}: {source}")]
    Connect {
        path: PathBuf,
        source: tonic::transport::Error,
    },
}

/// Binds `path` (replacing a stale socket) for a server.
pub fn bind(path: &Path) -> Result<UnixListener, GrpcError> {
    let err = |source| GrpcError::Listen {
        path: path.to_owned(),
        source,
    };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(err)?;
    }
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(err(e)),
    }
    UnixListener::bind(path).map_err(err)
}

/// Serves `router` on `listener` until the task is aborted.
pub fn serve(listener: UnixListener, router: tonic::transport::server::Router) -> JoinHandle<()> {
    tokio::spawn(async move {
        if let Err(e) = router
            .serve_with_incoming(UnixListenerStream::new(listener))
            .await
        {
            tracing::warn!("a gRPC server stopped: {e}");
        }
    })
}

/// A channel to the gRPC server on unix socket `path` (connected lazily, so a server that
/// comes later is reached by the next call).
pub async fn connect(path: &Path) -> Result<Channel, GrpcError> {
    let p = path.to_owned();
    let endpoint = Endpoint::from_static("http://localhost");
    endpoint
        .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
            let p = p.clone();
            async move { Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(p).await?)) }
        }))
        .await
        .map_err(|source| GrpcError::Connect {
            path: path.to_owned(),
            source,
        })
}
