//! The fast grant path (docs/architecture.md, "Processes and the data path"): workers ask
//! vgpud's schedulers for grants over a cheap path (shared memory, eventfd), never a socket
//! round trip per kernel.
//!
//! vgpud runs one [`GrantServer`] per physical GPU: a thread that owns the GPU's
//! [`GpuScheduler`](vgpu_scheduler::gpu::GpuScheduler). Each vGPU's worker holds a
//! [`GrantClient`] on a shared-memory page ([`shm`]):
//!
//! - the worker counts a request it wants to start in `submitted[resource]` and rings the
//!   daemon's eventfd (one `write(2)`);
//! - the daemon's scheduler grants by adding to `granted[resource]` and waking the futex on
//!   that word (one `futex(2)`);
//! - on completion the worker pushes `(resource, started, finished)` into a ring and rings
//!   the eventfd again;
//! - a holder alone on a resource starts under its lease and completes without ringing
//!   (the lease's quiet bit, [`shm::LEASE_QUIET`]): the daemon reads its page at each of
//!   its own wake-ups, and clears the bit as soon as another vGPU asks.
//!
//! The daemon trusts nothing it reads from the page ([`audit`]): it charges device time
//! from its own clock where the worker's claim does not fit the grant, ignores completions
//! it did not grant, and detaches a worker whose counters claim more requests than a guest
//! can have in flight, whose ring claims more entries than it holds, or that keeps
//! reporting impossible completions; that only hurts that vGPU. Kernel deadlines are the
//! scheduler's ([`vgpu_scheduler::Config::deadline`]): the server's thread takes the GPU
//! back from a holder whose work overruns, on its own clock.

pub mod audit;
mod client;
mod futex;
mod server;
pub mod shm;
pub mod time;

pub use client::{GrantClient, Permit, SwitchGate};
pub use server::{GrantServer, Handovers, ServerConfig, VgpuUsage, WorkerFds};
pub use vgpu_scheduler::gpu::Resource;

/// Why the grant path failed.
#[derive(Debug, thiserror::Error)]
pub enum GrantError {
    /// A system call failed.
    #[error("grant path: {what} failed: {source}")]
    Os {
        what: &'static str,
        source: std::io::Error,
    },
    /// The shared page is not ours (wrong magic or version).
    #[error("the grant page handed to this worker is not a vgpu grant page (magic/version mismatch); start the worker from vgpud")]
    BadPage,
    /// The scheduler refused.
    #[error(transparent)]
    Sched(#[from] vgpu_scheduler::SchedError),
    /// The vGPU is not attached.
    #[error("vGPU {0} has no grant channel on this GPU")]
    NotAttached(u32),
    /// A worker wrote what cannot be true on its grant page.
    #[error("the worker's grant page cannot be trusted: {0}")]
    Untrusted(String),
    /// The GPU's scheduler thread has stopped: nothing on this GPU is granted any more.
    #[error("this GPU's scheduler has stopped ({0}); restart vgpud (its VMs and workers are adopted by the next one)")]
    Stopped(String),
}

impl GrantError {
    pub(crate) fn os(what: &'static str) -> impl FnOnce(std::io::Error) -> Self {
        move |source| Self::Os { what, source }
    }
}

/// Something that decides when a worker's request may start. The device asks it before
/// every copy and kernel; the worker's standalone mode uses [`Ungated`].
pub trait Gate: Send + Sync {
    /// Blocks until a request on `resource` may start.
    fn acquire(&self, resource: Resource) -> Permit<'_>;

    /// As [`Gate::acquire`], for a request expected to run about `expect_ns` once started
    /// (0: unknown). The grant path publishes when it should end, so the scheduler can be
    /// ready to hand the resource on at that moment; the estimate decides nothing.
    fn acquire_for(&self, resource: Resource, expect_ns: vgpu_scheduler::Nanos) -> Permit<'_> {
        let _ = expect_ns;
        self.acquire(resource)
    }
}

/// A gate that lets everything through at once (a worker started by hand, or tests).
#[derive(Debug, Default, Clone, Copy)]
pub struct Ungated;

impl Gate for Ungated {
    fn acquire(&self, resource: Resource) -> Permit<'_> {
        Permit::ungated(resource)
    }
}
