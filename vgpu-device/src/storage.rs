//! GPU-initiated storage as the device sees it: `STORAGE_ATTACH` goes to a
//! [`StorageHost`], the worker's set of namespaces the operator attached to this vGPU.
//! The storage kernels themselves are built-in kernels the backend runs
//! (`vgpu_proto::builtin::STORAGE_KERNELS`), reaching the same set.

use vgpu_backend::storage::{Attached, StorageSet};
use vgpu_backend::BackendError;

use crate::error::RequestError;

/// Why `STORAGE_ATTACH` failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum StorageError {
    /// No namespace with this id is attached to the vGPU, or the flags are wrong.
    #[error("{0}")]
    Invalid(String),
    /// The namespace is configured but cannot be opened (its file vanished, I/O error).
    #[error("{0}")]
    Unavailable(String),
}

impl StorageError {
    /// The wire status for this error.
    pub fn status(&self) -> vgpu_proto::Status {
        match self {
            StorageError::Invalid(_) => vgpu_proto::Status::InvalidArgument,
            StorageError::Unavailable(_) => vgpu_proto::Status::DeviceError,
        }
    }
}

impl From<StorageError> for RequestError {
    fn from(e: StorageError) -> Self {
        RequestError::Storage(e)
    }
}

/// The storage namespaces of one vGPU.
pub trait StorageHost: Send + Sync {
    /// `STORAGE_ATTACH`: opens namespace `namespace` for this vGPU (idempotent) and says
    /// how the guest reaches it.
    fn attach(&self, namespace: u64) -> Result<Attached, StorageError>;
}

impl StorageHost for StorageSet {
    fn attach(&self, namespace: u64) -> Result<Attached, StorageError> {
        StorageSet::attach(self, namespace).map_err(|e| match e {
            BackendError::InvalidArgument(m) => StorageError::Invalid(m),
            other => StorageError::Unavailable(other.to_string()),
        })
    }
}
