//! Moving a running vGPU between physical GPUs at a kernel boundary, with identical device
//! addresses, so the guest never notices (DCUDA, seed 003).
//!
//! The vGPU's worker serves the guest through a [`Migratable`] backend: it forwards every
//! operation to the current GPU's backend and records what a migration needs: the
//! allocations and which of them each operation may have written (copy destinations,
//! launch pointers declared write or read-write), which pieces are swapped out
//! (decommitted), and the modules and functions loaded (guest-visible handles are ours, so
//! they survive the move). It offers the [`Paging`](vgpu_backend::Paging) capability of
//! the backend serving now, so a pager above it swaps through it. [`Migratable::migrate`]
//! needs the target to be [`Relocatable`](vgpu_backend::Relocatable) (allocations placed
//! at their addresses, the address range handed over at the switch); it then
//!
//! 1. pre-copies every allocation to the target while the guest runs, and re-sends what
//!    was written since, round after round, until the rest fits the downtime budget;
//! 2. stops dispatching (new operations wait; running ones finish: a kernel boundary);
//! 3. copies the rest, reloads modules and carries their variables' bytes
//!    (docs/migration.md, "Module variables"), re-registers guest memory, switches;
//! 4. resumes. Any failure before the switch drops the target and leaves the vGPU on its
//!    source, working (rollback).

mod globals;
#[cfg(test)]
mod globals_tests;
mod layer;
mod migratable;
#[cfg(test)]
mod occupancy_tests;
mod remote;
#[cfg(test)]
mod remote_tests;
mod report;
pub mod screen;
#[cfg(test)]
mod tests;
pub mod wire;

pub use globals::MAX_VARIABLES;
pub use migratable::Migratable;
pub use remote::{Received, RemoteSender, Round, MAX_ALLOCS, MAX_FUNCTIONS, MAX_MODULES};
pub use report::{MigrateOptions, Mode, Phase, Progress, Report};

/// Why a migration did not happen. The vGPU stays on its source GPU, working.
#[derive(Debug, thiserror::Error)]
pub enum MigrationError {
    /// The target could not take the vGPU's memory or modules.
    #[error("the target GPU refused the vGPU ({what}): {source}; pick a target with room or free memory there")]
    Target {
        /// What was being done.
        what: String,
        /// The target backend's error.
        source: vgpu_backend::BackendError,
    },
    /// Reading the source failed.
    #[error("reading the vGPU's memory on its source GPU failed: {0}")]
    Source(vgpu_backend::BackendError),
    /// The vGPU maps shared device memory, which stays on its GPU.
    #[error("the vGPU has {0} shared memory mapping(s); shared objects live on one GPU, so detach them (SHM_DT) before migrating")]
    SharedMappings(usize),
    /// The vGPU holds objects of CUDA's virtual memory management API, which a move to
    /// another host does not carry (a migration between GPUs of one host does).
    #[error("the vGPU holds {0} virtual memory object(s) (reserved address ranges, physical allocations, mappings: cuMemAddressReserve, cuMemCreate, cuMemMap); a move to another host does not carry them, so release them (cuMemUnmap, cuMemRelease, cuMemAddressFree), end the program, or move the vGPU to another GPU of this host")]
    VirtualMemory(usize),
    /// Another migration of this vGPU is running.
    #[error("a migration of this vGPU is already running; wait for it to finish")]
    Busy,
    /// The stream to or from another host's worker broke or carried something invalid.
    #[error("the vGPU state stream failed: {0}")]
    Stream(String),
    /// The other end refused (its reason).
    #[error("the other worker refused the vGPU's state: {0}")]
    Refused(String),
}
