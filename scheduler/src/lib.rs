//! The host's policies, without I/O: who may use a GPU's compute engine and its copy engine
//! next, so that every vGPU gets the bandwidth it was promised although GPU work is
//! non-preemptive and bursty (Gdev §5, seed 000); whether a vGPU fits a GPU; where vGPUs
//! go and when they move; and whose device memory to evict when a GPU is oversubscribed.
//!
//! - [`admission`]: the one admission rule (memory share, oversubscribed pool, compute and
//!   copy shares per mille of [`admission::WHOLE`]), for vgpud and the rebalancer alike.
//! - [`band`]: Gdev's BAND scheduler (Figure 2): a budget (a balance carried across
//!   periods), a vGPU gives the resource up only when its budget is spent *and* its
//!   utilization exceeds its share, and time-buffering (a short wait for the idle holder)
//!   before handing the resource to a vGPU that is over its share.
//! - [`credit`]: Xen's Credit scheduler, the baseline BAND improves on.
//! - [`fifo`]: arrival order, no accounting: the overhead baseline.
//! - [`gpu`]: one GPU's schedulers, MRQ (compute and copy separate) or SDQ (one queue).
//! - [`memory`]: device memory oversubscription: the pager's reported state and the
//!   [`memory::Planner`] that picks victims and swap tiers (Gdev §4).
//! - [`mapping`]: software queues onto a fixed number of hardware slots, by HEFT upward
//!   rank or round-robin with a quantum (seed 002).
//! - [`rebalance`]: placement of new vGPUs and live-migration decisions across GPUs
//!   (overload windows, benefit per byte moved, hysteresis, consolidation; seed 003).
//! - [`simulate`]: a discrete-event driver that runs any policy in virtual time.
//!
//! Every scheduling policy is a [`Policy`]: events in (`submit`, `complete`, `tick`), grants
//! out. Every vGPU has a kernel deadline ([`Config::deadline`]): a holder whose work runs
//! past it without a completion loses the resource (`tick` hands it on) and pays for its
//! late work as it runs. Time comes from the caller (or a [`Clock`]), so tests run in virtual time and the
//! daemon in real time.

pub mod admission;
pub mod band;
pub mod clock;
pub mod credit;
mod exclusive;
pub mod fifo;
pub mod gpu;
pub mod mapping;
pub mod memory;
pub mod rebalance;
pub mod simulate;
mod state;

pub use clock::{Clock, MonotonicClock, Nanos, VirtualClock};
pub use state::{Config, Share, VgpuId, DEFAULT_DEADLINE};

/// Index of a physical GPU.
pub type GpuIndex = u32;

/// Why a scheduler request was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SchedError {
    /// The vGPU is not registered with this scheduler.
    #[error("vGPU {0} is not scheduled on this GPU; create it first")]
    UnknownVgpu(VgpuId),
    /// The vGPU is registered already.
    #[error("vGPU {0} is already scheduled on this GPU")]
    Duplicate(VgpuId),
    /// A share outside 0..=1, or shares summing past 1.
    #[error("share {share} for vGPU {vgpu} is invalid: shares are fractions in [0, 1] and the shares on one GPU sum to at most 1 (now {total} with it)")]
    BadShare {
        vgpu: VgpuId,
        share: f64,
        total: f64,
    },
    /// A completion for a vGPU with nothing running.
    #[error("vGPU {0} reported a completion but has nothing running")]
    NothingRunning(VgpuId),
}

/// What the scheduler tells the dispatcher to do next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grant {
    /// The vGPU whose requests may start now.
    pub vgpu: VgpuId,
    /// How many of its pending requests may start.
    pub count: u32,
}

/// A scheduling policy for one resource (a compute engine or a copy engine) of one GPU.
///
/// The dispatcher calls `submit` when a request arrives, `complete` when a granted request
/// finishes (with the time it really started), and `tick` when the deadline returned by
/// `next_deadline` passes. Each call returns the grants it makes: requests that may start.
pub trait Policy: Send {
    /// The policy's name, for reports.
    fn name(&self) -> &'static str;
    /// Adds a vGPU with its share and priority.
    fn add(&mut self, vgpu: VgpuId, share: Share, now: Nanos) -> Result<(), SchedError>;
    /// Removes a vGPU (its VM died or was deleted); its pending requests are forgotten.
    fn remove(&mut self, vgpu: VgpuId, now: Nanos) -> Vec<Grant>;
    /// Changes a vGPU's share at run time.
    fn set_share(&mut self, vgpu: VgpuId, share: Share) -> Result<(), SchedError>;
    /// A request of `vgpu` arrives.
    fn submit(&mut self, vgpu: VgpuId, now: Nanos) -> Result<Vec<Grant>, SchedError>;
    /// A granted request of `vgpu` that started at `started` finished at `now`.
    fn complete(
        &mut self,
        vgpu: VgpuId,
        started: Nanos,
        now: Nanos,
    ) -> Result<Vec<Grant>, SchedError>;
    /// Time passed; handles period boundaries and waits that expired.
    fn tick(&mut self, now: Nanos) -> Vec<Grant>;
    /// When `tick` must be called next at the latest.
    fn next_deadline(&self) -> Option<Nanos>;
    /// The vGPU's utilization of this resource over the last period, 0..=1.
    fn utilization(&self, vgpu: VgpuId, now: Nanos) -> Option<f64>;
    /// Total busy time accounted to `vgpu` since it was added.
    fn busy_total(&self, vgpu: VgpuId) -> Option<Nanos>;
    /// Until when `vgpu` holds the resource and may start requests without asking.
    fn lease(&self, _vgpu: VgpuId, _now: Nanos) -> Option<Nanos> {
        None
    }
    /// `count` requests of `vgpu` started under its lease without asking: they are
    /// running now and will complete like granted ones.
    fn start_leased(&mut self, vgpu: VgpuId, count: u32, now: Nanos) -> Result<(), SchedError>;
    /// Sets `vgpu`'s kernel deadline (0: the configured default).
    fn set_deadline(&mut self, vgpu: VgpuId, deadline: Nanos) -> Result<(), SchedError>;
    /// How many times `vgpu` overran its deadline and lost the resource.
    fn overruns(&self, vgpu: VgpuId) -> Option<u64>;
    /// The waiting vGPU that would get the resource if its holder released it now (`None`:
    /// nobody waits, or the policy grants on arrival). A hint for the grant path, which
    /// wakes that vGPU's worker just before the holder's work is expected to end; it
    /// decides nothing.
    fn next_in_line(&self, _now: Nanos) -> Option<VgpuId> {
        None
    }
}
