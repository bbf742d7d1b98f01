//! The crate's error type. Every failure a kernel thread can see is one of these: bad
//! input and dead devices come back as errors, never as a hang or a panic.

use crate::nvme::NvmeStatus;
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The controller completed the command with an error status; see the status for what to fix.
    #[error("controller returned an error status: {0}")]
    Status(#[from] NvmeStatus),
    /// The completion did not arrive in time; the controller is hung or gone. This queue pair is now poisoned: recreate the namespace handle.
    #[error("no completion within {0:?}; the queue pair is poisoned, reopen the namespace")]
    Timeout(Duration),
    /// An earlier timeout left this queue pair in an unknown state; reopen the namespace.
    #[error("queue pair {0} is poisoned by an earlier timeout; reopen the namespace")]
    Poisoned(u16),
    /// Every slot of the submission queue is in use; retry later or use a deeper queue.
    #[error("submission queue {0} is full; retry later or create deeper queues")]
    QueueFull(u16),
    /// The request reaches past the end of the namespace; keep offsets below the namespace size.
    #[error("offset {offset} + {len} bytes is past the namespace end ({size} bytes)")]
    OutOfRange { offset: u64, len: u64, size: u64 },
    /// A request argument is unusable (alignment, size, queue depth); the message says which.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The controller did not reach the wanted state (CSTS.RDY) in time; check the device is present and not in a fatal state.
    #[error("controller did not become {state} within {waited:?}")]
    ControllerTimeout {
        state: &'static str,
        waited: Duration,
    },
    /// The controller reports a fatal status (CSTS.CFS); reset it (or reload the driver) before use.
    #[error("controller fatal status (CSTS.CFS) set; reset the controller")]
    ControllerFatal,
    /// Every cache line is pinned by a reader; give the cache more lines or release references sooner.
    #[error("all {0} cache lines are referenced; enlarge the cache")]
    CacheExhausted(usize),
    /// An operating-system call failed; the message names the call and the path.
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    /// The VFIO layer failed (binding, container, region mapping); check the device is bound to vfio-pci and the IOMMU is on.
    #[error("vfio: {0}")]
    Vfio(String),
}

impl Error {
    pub(crate) fn io(what: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io {
            what: what.into(),
            source,
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
