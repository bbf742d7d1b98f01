//! Device memory oversubscription, the decisions only: the state each vGPU's pager
//! reports ([`MemState`]), where evicted bytes go ([`Tier`]), and the [`Planner`] that
//! decides whether a reservation fits and, if not, whose memory to evict and where.
//!
//! The pager that moves the bytes lives in the backend (`vgpu_backend::pager`); vgpud
//! runs a planner per GPU across worker processes.

mod plan;

pub use plan::{Member, Planner, Step, Tried};

/// Where evicted bytes go.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Tier {
    /// The GPU's temporal swap area in device memory (fast to evict and restore).
    Device,
    /// Host memory.
    Host,
}

/// One vGPU's device memory at one moment, as its pager reports it. Byte counts are
/// absolute, so a lost or failed update corrects itself with the next report.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemState {
    /// Bytes charged by live allocations (resident or not).
    pub used: u64,
    /// Bytes of them backed by device memory now.
    pub resident: u64,
    /// Bytes held in the GPU's swap area.
    pub device_swap: u64,
    /// Bytes held in host memory.
    pub host_swap: u64,
    /// Bytes moved out of device memory so far (device swap and host).
    pub swap_out_bytes: u64,
    /// Bytes moved back so far.
    pub swap_in_bytes: u64,
    /// Time spent moving bytes out, in nanoseconds.
    pub swap_out_ns: u64,
    /// Time spent moving bytes back, in nanoseconds.
    pub swap_in_ns: u64,
    /// Pieces evicted so far.
    pub evictions: u64,
    /// Pieces restored so far.
    pub restores: u64,
}
