//! How the library waits for the device: the clock and back-off of every stream, and a
//! watch on the worker's socket so that a worker that dies surfaces as
//! CUDA_ERROR_DEVICE_UNAVAILABLE within milliseconds instead of a wait until the timeout.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::OnceLock;

use guest_driver::linux::selftest;
use guest_driver::process::ProcessTransport;

use crate::transport::AnyTransport;

static GONE: AtomicBool = AtomicBool::new(false);
static PEER: OnceLock<ProcessTransport> = OnceLock::new();
static LAST_CHECK: AtomicU64 = AtomicU64::new(0);

/// Waits shorter than this spin.
const SPIN_NS: u64 = 50_000;
/// Waits shorter than this yield the CPU; longer ones sleep briefly.
const YIELD_NS: u64 = 1_000_000;
/// How often a long wait checks the worker's socket.
const CHECK_EVERY_NS: u64 = 1_000_000;

/// Watches `t`'s worker (process transport only: a VM's device has no socket to watch).
pub fn watch(t: &AnyTransport) {
    if let AnyTransport::Process(p) = t {
        let _ = PEER.set(p.clone());
    }
}

/// Whether the worker is gone for good.
pub fn gone() -> bool {
    GONE.load(Ordering::Relaxed)
}

/// The streams' clock. Once the worker is gone it jumps past every timeout, so a wait in
/// progress gives up at its next clock read.
pub fn now_ns() -> u64 {
    if gone() {
        u64::MAX / 2
    } else {
        selftest::now_ns()
    }
}

/// Between polls of a used ring: spin, then yield, then sleep; check the worker now and
/// then.
pub fn relax(waited_ns: u64) {
    if waited_ns < SPIN_NS {
        std::hint::spin_loop();
        return;
    }
    if waited_ns < YIELD_NS {
        std::thread::yield_now();
    } else {
        std::thread::sleep(std::time::Duration::from_micros(20));
    }
    let now = selftest::now_ns();
    let last = LAST_CHECK.load(Ordering::Relaxed);
    if now.saturating_sub(last) < CHECK_EVERY_NS {
        return;
    }
    LAST_CHECK.store(now, Ordering::Relaxed);
    if PEER.get().is_some_and(ProcessTransport::peer_gone) && !GONE.swap(true, Ordering::Relaxed) {
        tracing::error!(
            "the vGPU's worker hung up: every call now answers CUDA_ERROR_DEVICE_UNAVAILABLE"
        );
    }
}
