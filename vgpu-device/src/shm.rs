//! Shared device memory as the device sees it: the `SHM_*` requests go to a [`ShmHost`]
//! (the worker's link to vgpud's registry, which checks share groups and counts
//! attachments), and the mapping itself is the backend's (`SharedMemory::import`).

use crate::error::RequestError;

/// Why a shared-memory request failed, as the registry says it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ShmError {
    /// No object with this key (and CREATE not given) or this id.
    #[error("no shared object {0}; create it with SHM_GET and the CREATE flag, or check the id")]
    NotFound(String),
    /// CREATE|EXCLUSIVE on a key that exists.
    #[error("shared object key {0:#x} exists already (CREATE|EXCLUSIVE); use another key or drop EXCLUSIVE")]
    Exists(u64),
    /// The vGPU may not use this object.
    #[error("access denied: {0}")]
    Denied(String),
    /// Size 0, absurd, or different from the existing object's.
    #[error("invalid shared object request: {0}")]
    Invalid(String),
    /// The GPU has no memory for it.
    #[error("no device memory for the shared object: {0}")]
    NoMemory(String),
    /// vgpud could not be asked.
    #[error("the shared memory registry (vgpud) is unreachable: {0}")]
    Unavailable(String),
}

impl ShmError {
    /// The wire status for this error.
    pub fn status(&self) -> vgpu_proto::Status {
        use vgpu_proto::Status;
        match self {
            ShmError::NotFound(_) => Status::InvalidArgument,
            ShmError::Exists(_) => Status::InvalidArgument,
            ShmError::Denied(_) => Status::PermissionDenied,
            ShmError::Invalid(_) => Status::InvalidArgument,
            ShmError::NoMemory(_) => Status::OutOfMemory,
            ShmError::Unavailable(_) => Status::DeviceError,
        }
    }
}

impl From<ShmError> for RequestError {
    fn from(e: ShmError) -> Self {
        RequestError::Shm(e)
    }
}

/// The registry of shared device memory objects, as one vGPU reaches it.
pub trait ShmHost: Send + Sync {
    /// `shmget`: the id of the object with `key` in this vGPU's share group, created with
    /// `size` bytes if `flags` has CREATE and it does not exist.
    fn get(&self, key: u64, size: u64, flags: u64) -> Result<u64, ShmError>;
    /// `shmat`: maps object `shmid` into this vGPU's address space; its device address.
    fn attach(&self, shmid: u64, read_only: bool) -> Result<u64, ShmError>;
    /// `shmdt`: unmaps the mapping at `addr`.
    fn detach(&self, addr: u64) -> Result<(), ShmError>;
    /// `shmctl`: RMID (remove once the last mapper detaches) or STAT
    /// (`[size, attachments, key, 0]`).
    fn ctl(&self, shmid: u64, cmd: u32) -> Result<[u64; 4], ShmError>;
}
