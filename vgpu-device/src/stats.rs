//! Counters of one vGPU's device, for the daemon's stats and metrics.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Live counters (updated without locks on the request path).
#[derive(Debug, Default)]
pub struct Stats {
    requests: AtomicU64,
    errors: AtomicU64,
    bytes_htod: AtomicU64,
    bytes_dtoh: AtomicU64,
    bytes_dtod: AtomicU64,
    kernels: AtomicU64,
    kernel_ns: AtomicU64,
    busy_ns: AtomicU64,
    pinned_host_bytes: AtomicU64,
}

/// A copy of the counters at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StatsSnapshot {
    /// Requests completed (including failed ones).
    pub requests: u64,
    /// Requests answered with an error status (or without a usable response descriptor).
    pub errors: u64,
    /// Bytes copied guest to device.
    pub bytes_htod: u64,
    /// Bytes copied device to guest.
    pub bytes_dtoh: u64,
    /// Bytes copied or set within the device.
    pub bytes_dtod: u64,
    /// Kernels run to completion.
    pub kernels: u64,
    /// Device time of those kernels, ns.
    pub kernel_ns: u64,
    /// Time spent processing requests (all queues added up), ns.
    pub busy_ns: u64,
    /// Guest memory the worker maps and may pin in host memory for direct copies: the
    /// total of the frontend's accepted memory table.
    pub pinned_host_bytes: u64,
}

impl Stats {
    pub(crate) fn request(&self, ok: bool, busy_ns: u64) {
        self.requests.fetch_add(1, Relaxed);
        if !ok {
            self.errors.fetch_add(1, Relaxed);
        }
        self.busy_ns.fetch_add(busy_ns, Relaxed);
    }

    pub(crate) fn htod(&self, n: u64) {
        self.bytes_htod.fetch_add(n, Relaxed);
    }

    pub(crate) fn dtoh(&self, n: u64) {
        self.bytes_dtoh.fetch_add(n, Relaxed);
    }

    pub(crate) fn dtod(&self, n: u64) {
        self.bytes_dtod.fetch_add(n, Relaxed);
    }

    /// `n` kernels ran for `ns` together.
    pub(crate) fn kernels_ran(&self, n: u64, ns: u64) {
        if n > 0 {
            self.kernels.fetch_add(n, Relaxed);
            self.kernel_ns.fetch_add(ns, Relaxed);
        }
    }

    /// The frontend's accepted memory table now maps `bytes` of guest memory.
    pub(crate) fn pinned_host(&self, bytes: u64) {
        self.pinned_host_bytes.store(bytes, Relaxed);
    }

    /// The counters now.
    pub fn snapshot(&self) -> StatsSnapshot {
        StatsSnapshot {
            requests: self.requests.load(Relaxed),
            errors: self.errors.load(Relaxed),
            bytes_htod: self.bytes_htod.load(Relaxed),
            bytes_dtoh: self.bytes_dtoh.load(Relaxed),
            bytes_dtod: self.bytes_dtod.load(Relaxed),
            kernels: self.kernels.load(Relaxed),
            kernel_ns: self.kernel_ns.load(Relaxed),
            busy_ns: self.busy_ns.load(Relaxed),
            pinned_host_bytes: self.pinned_host_bytes.load(Relaxed),
        }
    }
}
