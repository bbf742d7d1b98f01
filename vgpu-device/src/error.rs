//! Errors: a request the guest got wrong (answered with a status), and configuration errors.

use vgpu_backend::BackendError;
use vgpu_proto::{Opcode, ParseError, Status};

/// Why a request failed. Every variant maps to the status written into the response.
#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    /// The chain has fewer than two descriptors (header and response).
    #[error("a request needs a header and a response descriptor, the chain has {0} descriptor(s)")]
    TooFewDescriptors(usize),
    /// The first descriptor is device-writable.
    #[error("the header descriptor must be device-readable (clear VIRTQ_DESC_F_WRITE)")]
    HeaderWritable,
    /// A descriptor lies (partly) outside guest RAM.
    #[error("descriptor {index} ({addr:#x}+{len:#x}) is not inside guest RAM")]
    OutsideGuestMemory {
        /// Position in the chain.
        index: usize,
        /// Guest physical address.
        addr: u64,
        /// Length.
        len: u32,
    },
    /// Guest memory could not be read or written.
    #[error("guest memory access at {addr:#x} failed: {reason}")]
    GuestMemory {
        /// Guest physical address.
        addr: u64,
        /// What vm-memory said.
        reason: String,
    },
    /// The header could not be parsed.
    #[error("{0}")]
    Parse(ParseError),
    /// The wrong number of data descriptors for the opcode.
    #[error("{opcode} takes {expected} data descriptor(s) between header and response, the chain has {count}")]
    UnexpectedData {
        /// Opcode name.
        opcode: &'static str,
        /// Data descriptors the opcode takes.
        expected: usize,
        /// Data descriptors found.
        count: usize,
    },
    /// A data descriptor with the wrong direction.
    #[error("{opcode}: data descriptor {index} must be device-{}", if *.writable { "writable" } else { "readable" })]
    DataDirection {
        /// Opcode name.
        opcode: &'static str,
        /// Position in the chain.
        index: usize,
        /// True if it must be writable.
        writable: bool,
    },
    /// Data descriptor lengths do not add up to the size the arguments name.
    #[error("{opcode}: data descriptors hold {got} bytes, the arguments say {expected}")]
    DataLength {
        /// Opcode name.
        opcode: &'static str,
        /// Bytes the arguments name.
        expected: u64,
        /// Bytes the descriptors hold.
        got: u64,
    },
    /// An argument out of range.
    #[error("{opcode}: {what}")]
    Invalid {
        /// Opcode name.
        opcode: &'static str,
        /// What is wrong.
        what: String,
    },
    /// A kernel argument is malformed.
    #[error("launch argument {index}: {err}")]
    KernelArg {
        /// Argument index.
        index: usize,
        /// What is wrong.
        err: vgpu_proto::ArgError,
    },
    /// The vGPU's memory share is used up.
    #[error("vGPU memory share exhausted: {requested} bytes requested, {used} of {share} in use; free memory or ask for a larger share")]
    ShareExhausted {
        /// Bytes charged for the request.
        requested: u64,
        /// Bytes in use.
        used: u64,
        /// The share.
        share: u64,
    },
    /// No such event.
    #[error("event {0} was never recorded (or was destroyed)")]
    UnknownEvent(u64),
    /// The event table is full.
    #[error("too many events (limit {0}); destroy some with EVENT_DESTROY")]
    TooManyEvents(usize),
    /// Not implemented (yet) by this device.
    #[error("{opcode} is not supported: {why}")]
    NotSupported {
        /// Opcode name.
        opcode: &'static str,
        /// Why, and what to do instead.
        why: &'static str,
    },
    /// The backend refused or failed.
    #[error(transparent)]
    Backend(#[from] BackendError),
    /// A shared device memory request failed.
    #[error(transparent)]
    Shm(crate::shm::ShmError),
    /// A storage request failed.
    #[error(transparent)]
    Storage(crate::storage::StorageError),
}

impl RequestError {
    /// The status the guest receives.
    pub fn status(&self) -> Status {
        match self {
            RequestError::TooFewDescriptors(_)
            | RequestError::HeaderWritable
            | RequestError::OutsideGuestMemory { .. }
            | RequestError::GuestMemory { .. }
            | RequestError::UnexpectedData { .. }
            | RequestError::DataDirection { .. } => Status::BadDescriptor,
            RequestError::Parse(e) => e.status(),
            RequestError::DataLength { .. } => Status::BadLength,
            RequestError::Invalid { .. } => Status::InvalidArgument,
            RequestError::KernelArg { .. } => Status::BadArgType,
            RequestError::ShareExhausted { .. } => Status::OutOfMemory,
            RequestError::UnknownEvent(_) => Status::UnknownEvent,
            RequestError::TooManyEvents(_) => Status::OutOfResources,
            RequestError::NotSupported { .. } => Status::NotSupported,
            RequestError::Backend(e) => e.status(),
            RequestError::Shm(e) => e.status(),
            RequestError::Storage(e) => e.status(),
        }
    }

    pub(crate) fn invalid(opcode: Opcode, what: impl Into<String>) -> Self {
        RequestError::Invalid {
            opcode: opcode.name(),
            what: what.into(),
        }
    }
}

/// A vGPU configuration value out of range.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// Queue count out of range.
    #[error("queue count {0} is out of range; use 1..={max}", max = crate::config::MAX_QUEUES)]
    Queues(u16),
    /// Queue size not a power of two.
    #[error("queue size {0} must be a power of two (e.g. 256 or 1024)")]
    QueueSize(u16),
    /// Zero memory share.
    #[error("memory share must be at least 1 byte")]
    MemoryShare,
    /// A batch size out of range.
    #[error("batch size {0} is out of range; use 1..={max} (1: every launch alone)", max = crate::config::MAX_BATCH)]
    Batch(u16),
    /// A share above 1000 per-mille.
    #[error("{what} share {value} is above 1000 per-mille (the whole GPU)")]
    Share {
        /// Which share.
        what: &'static str,
        /// The value.
        value: u32,
    },
}
