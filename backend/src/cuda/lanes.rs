//! Lanes: a stream with a batch's timing events and scratch memory, one per operation in
//! flight.
//!
//! Each backend call takes a lane from the pool for its duration, so calls from different
//! guest queues (each served by its own thread) run on different streams and overlap on the
//! GPU (copies on the copy engines beside kernels), while one queue's requests, which the
//! device runs one after the other, reuse a warm lane. The pool grows to the number of
//! calls ever in flight at once (at most the queue count plus callers of `synchronize`) and
//! creates nothing on the per-request path after that.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use super::driver::{Context, CuError, DevBuf, Event, Stream};
use super::modules::Held;
use super::signal::Signal;
use crate::sync::lock;

/// One stream and what an operation on it needs.
#[derive(Debug)]
pub struct Lane {
    /// The stream the operation's work goes on.
    pub stream: Stream,
    /// A batch's timing events, recorded in order on the stream (grown to the most a
    /// batch used, then kept).
    pub marks: Vec<Event>,
    /// What the kernels queued on the stream point into, held until they have finished
    /// (emptied by whoever queued them; the capacity stays).
    pub held: Vec<Held>,
    /// The word a lone kernel's (or a batch of one run's) end is read from (`signal.rs`);
    /// `None` when the driver would not give one, or would not write it: the stream is
    /// asked instead.
    pub signal: Option<Signal>,
    scratch: Option<DevBuf>,
    ctx: Arc<Context>,
}

impl Lane {
    fn new(ctx: &Arc<Context>) -> Result<Self, CuError> {
        Ok(Self {
            stream: Stream::new(ctx)?,
            marks: Vec::new(),
            held: Vec::new(),
            signal: Signal::new(ctx)
                .inspect_err(|e| {
                    tracing::debug!(error = %e, "no host word for kernel ends on a new lane; its waits ask the stream")
                })
                .ok(),
            scratch: None,
            ctx: ctx.clone(),
        })
    }

    /// Makes sure batch timing event `index` exists (created once, kept with the lane).
    pub fn mark(&mut self, index: usize) -> Result<(), CuError> {
        while self.marks.len() <= index {
            self.marks.push(Event::new(&self.ctx)?);
        }
        Ok(())
    }

    /// At least `len` bytes of device scratch memory owned by this lane (grown to the next
    /// power of two, at least 64 KiB, and kept).
    pub fn scratch(&mut self, len: usize) -> Result<u64, CuError> {
        match &self.scratch {
            Some(b) if b.len() >= len => Ok(b.ptr()),
            _ => {
                // Work queued on this lane's stream may still use the old buffer.
                self.stream.synchronize()?;
                self.scratch = None;
                let size = len.max(64 << 10).checked_next_power_of_two().unwrap_or(len);
                let b = DevBuf::new(&self.ctx, size)?;
                let p = b.ptr();
                self.scratch = Some(b);
                Ok(p)
            }
        }
    }
}

/// A lone kernel's time in nanoseconds: from `t`, taken right before its launch call, to
/// now, when its end was seen. Two timing events around a lone kernel would add about
/// 2.3 µs to its round trip, about 30 % of a null kernel's (`backend_null_kernel_roundtrip`
/// in `backend/tests/cuda_bench.rs` against its anchor with the events); a batch's runs
/// keep theirs ([`Lane::marks`]), recorded once per run of one function.
pub fn host_ns(t: Instant) -> u64 {
    u64::try_from(t.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

/// The pool.
#[derive(Debug)]
pub struct Lanes {
    ctx: Arc<Context>,
    free: Mutex<Vec<Lane>>,
}

/// A lane borrowed from the pool; it goes back when dropped.
#[derive(Debug)]
pub struct LaneGuard<'a> {
    pool: &'a Lanes,
    lane: Option<Lane>,
}

impl Lanes {
    /// An empty pool for `ctx`.
    pub fn new(ctx: Arc<Context>) -> Self {
        Self {
            ctx,
            free: Mutex::new(Vec::new()),
        }
    }

    /// A free lane, created when none is free. The caller has bound the context.
    pub fn take(&self) -> Result<LaneGuard<'_>, CuError> {
        let lane = lock(&self.free).pop();
        let lane = match lane {
            Some(l) => l,
            None => {
                let l = Lane::new(&self.ctx)?;
                tracing::debug!("new CUDA stream lane");
                l
            }
        };
        Ok(LaneGuard {
            pool: self,
            lane: Some(lane),
        })
    }
}

impl std::ops::Deref for LaneGuard<'_> {
    type Target = Lane;
    fn deref(&self) -> &Lane {
        // The lane is only taken out in Drop.
        self.lane.as_ref().unwrap_or_else(|| unreachable!())
    }
}

impl std::ops::DerefMut for LaneGuard<'_> {
    fn deref_mut(&mut self) -> &mut Lane {
        self.lane.as_mut().unwrap_or_else(|| unreachable!())
    }
}

impl Drop for LaneGuard<'_> {
    fn drop(&mut self) {
        if let Some(lane) = self.lane.take() {
            lock(&self.pool.free).push(lane);
        }
    }
}
