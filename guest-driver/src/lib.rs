//! The crate a guest installs to drive a vGPU: a `no_std` virtio-mmio modern driver and
//! split virtqueues over a [`Transport`] (payloads: identity-mapped MMIO; feature `std`:
//! the Linux userspace transport in [`linux`]), and on top of them the vGPU request API.
//!
//! Initialisation, in the order virtio 1.x 3.1.1 demands:
//!
//! ```ignore
//! let mut dev = VirtioMmio::probe(transport)?;
//! dev.negotiate(0, feature::RING_EVENT_IDX)?;
//! let size = dev.pick_queue_size(0, 64)?;
//! let mut q: SplitQueue = SplitQueue::allocate(dev.transport(), size)?;
//! dev.activate_queue(0, &mut q)?;
//! dev.driver_ok()?;
//! let token = q.add(&[Buffer::readable(req, n), Buffer::writable(resp, m)])?;
//! dev.kick(0, &mut q);
//! while q.pop_used()?.is_none() {}
//! ```
#![cfg_attr(not(any(test, feature = "std")), no_std)]

pub mod error;
#[cfg(any(test, feature = "std"))]
pub mod linux;
pub mod mmio;
#[cfg(feature = "process")]
pub mod process;
pub mod queue;
mod ring;
pub mod spec;
pub mod transport;
pub mod vgpu;

/// Hints the CPU to bring the cache line at `p` in, or with `write` to take it for
/// writing: the device wrote or read it last from another core, and asking for several
/// such lines at once, or before they are needed, overlaps their transfers.
#[inline(always)]
pub(crate) fn prefetch(p: *const u8, write: bool) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch reads nothing the program sees and never faults, whatever the
    // address (PREFETCHW for a write; a CPU without it treats the instruction as a no-op).
    unsafe {
        use core::arch::x86_64::{_mm_prefetch, _MM_HINT_ET0, _MM_HINT_T0};
        if write {
            _mm_prefetch::<_MM_HINT_ET0>(p.cast())
        } else {
            _mm_prefetch::<_MM_HINT_T0>(p.cast())
        }
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (p, write);
}

#[cfg(test)]
mod fake;
#[cfg(test)]
mod tests;

pub use error::{Error, Result};
pub use mmio::VirtioMmio;
pub use queue::{Buffer, SplitQueue, Token, Used};
pub use ring::Layout as QueueLayout;
pub use spec::feature;
pub use transport::{DmaRegion, Transport};
pub use vgpu::{Stream, StreamOptions, Ticket, VgpuDevice};
