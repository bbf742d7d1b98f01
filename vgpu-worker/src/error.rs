//! Why the worker stopped with an error.

use std::path::PathBuf;

use vgpu_backend::BackendError;
use vgpu_device::ConfigError;

/// Why the worker stopped with an error. Each message names what to change.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error("grant channel: {0}")]
    Grant(String),
    #[error("cannot bind vhost-user socket {path}: {why}")]
    Bind { path: PathBuf, why: String },
    #[error("GPU backend: {0}")]
    Backend(#[from] BackendError),
    #[error("vGPU configuration: {0}")]
    Config(#[from] ConfigError),
    #[error("vhost-user: {0}; check that the frontend speaks vhost-user to this socket")]
    Daemon(String),
    #[error("signal setup: {0}")]
    Signals(std::io::Error),
    #[error("sandbox: {0}")]
    Sandbox(#[from] crate::sandbox::SandboxError),
    #[error("receiving the vGPU's state ({at}): {why}")]
    MigrateIn { at: String, why: String },
    #[error("control channel (fd {fd}): {why}; start the worker from vgpud or drop --control-fd")]
    Control { fd: i32, why: String },
}
