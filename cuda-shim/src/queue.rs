//! One vGPU queue as the library uses it: a guest-driver stream plus the requests enqueued
//! on it and not yet waited for (in order), the bounce buffers they hold, and the first
//! error an asynchronous request reported (returned by the next synchronising call, as
//! CUDA reports asynchronous errors).

use std::collections::VecDeque;

use guest_driver::vgpu::Stream;
use guest_driver::{DmaRegion, Ticket, Transport};

use crate::error::map_error;
use crate::transport::AnyTransport;
use crate::types::CUresult;

/// Descriptors of each of the library's queues, and so (two per request at least) up to
/// half as many requests in flight on it. Launches on a stream are posted without waiting;
/// the worker gathers up to `vgpu-worker --max-batch` (64) of them into one batch and runs
/// the next batch while it gathers another (a burst), which needs more than one batch's
/// requests in flight: 128 is two batches.
pub const STREAM_CAPACITY: usize = 256;

/// One of the library's queues as the guest driver drives it.
pub type LibStream = Stream<AnyTransport, STREAM_CAPACITY>;

struct Pending {
    ticket: Ticket,
    seq: u64,
    /// A bounce buffer the request reads or writes; freed once it completed.
    keep: Option<DmaRegion>,
}

pub struct Queue {
    stream: LibStream,
    pending: VecDeque<Pending>,
    next_seq: u64,
    /// Every request with a sequence number below this one has completed.
    done_seq: u64,
    error: Option<CUresult>,
}

// SAFETY: the stream's raw pointers point into DMA memory the transport keeps mapped for
// its whole life; a queue is only ever used under its mutex, one thread at a time.
unsafe impl Send for Queue {}

impl Queue {
    pub fn new(stream: LibStream) -> Self {
        Queue {
            stream,
            pending: VecDeque::new(),
            next_seq: 0,
            done_seq: 0,
            error: None,
        }
    }

    pub fn stream(&mut self) -> &mut LibStream {
        &mut self.stream
    }

    pub fn is_idle(&self) -> bool {
        self.pending.is_empty()
    }

    /// Whether request `seq` has completed (as far as this queue has seen).
    pub fn completed(&self, seq: u64) -> bool {
        seq < self.done_seq
    }

    fn finish(&mut self, t: &AnyTransport, p: Pending, outcome: guest_driver::Result<[u64; 4]>) {
        if let Err(e) = outcome {
            let code = map_error(&e);
            tracing::debug!(error = %e, code, "asynchronous request failed");
            self.error.get_or_insert(code);
        }
        if let Some(region) = p.keep {
            // SAFETY: the request using the region completed (or the stream reset the
            // device, which stops all DMA).
            unsafe { t.dma_free(region) };
        }
        self.done_seq = self.done_seq.max(p.seq + 1);
    }

    /// Waits for the oldest outstanding request.
    fn wait_oldest(&mut self, t: &AnyTransport) {
        if let Some(p) = self.pending.pop_front() {
            let outcome = self.stream.wait(p.ticket);
            self.finish(t, p, outcome);
        }
    }

    /// Makes room for one more request.
    fn room(&mut self, t: &AnyTransport) {
        while !self.pending.is_empty() && self.stream.outstanding() >= self.stream.capacity() {
            self.stream.submit();
            self.wait_oldest(t);
        }
    }

    /// Runs a synchronous stream call (it enqueues, submits and waits for its own request)
    /// once there is room for it: free slots and, when earlier requests hold the ring's
    /// descriptors, after waiting for them.
    pub fn call<R>(
        &mut self,
        t: &AnyTransport,
        mut f: impl FnMut(&mut LibStream) -> guest_driver::Result<R>,
    ) -> Result<R, CUresult> {
        self.room(t);
        loop {
            match f(&mut self.stream) {
                Err(guest_driver::Error::QueueFull) if !self.pending.is_empty() => {
                    self.stream.submit();
                    self.wait_oldest(t);
                }
                other => return other.map_err(|e| map_error(&e)),
            }
        }
    }

    /// Enqueues a request (not yet submitted); `keep` is freed when it completes. Returns
    /// its sequence number. A ring without enough free descriptors first completes the
    /// oldest requests.
    pub fn enqueue(
        &mut self,
        t: &AnyTransport,
        mut f: impl FnMut(&mut LibStream) -> guest_driver::Result<Ticket>,
        keep: Option<DmaRegion>,
    ) -> Result<u64, CUresult> {
        self.enqueue_keeping(t, |s, _| f(s), keep)
    }

    /// [`Self::enqueue`] where the request also writes into `keep` (a header in the
    /// caller's DMA memory).
    pub fn enqueue_keeping(
        &mut self,
        t: &AnyTransport,
        mut f: impl FnMut(&mut LibStream, Option<&mut DmaRegion>) -> guest_driver::Result<Ticket>,
        mut keep: Option<DmaRegion>,
    ) -> Result<u64, CUresult> {
        self.room(t);
        let outcome = loop {
            match f(&mut self.stream, keep.as_mut()) {
                Err(guest_driver::Error::QueueFull) if !self.pending.is_empty() => {
                    self.stream.submit();
                    self.wait_oldest(t);
                }
                other => break other,
            }
        };
        match outcome {
            Ok(ticket) => {
                let seq = self.next_seq;
                self.next_seq += 1;
                self.pending.push_back(Pending { ticket, seq, keep });
                Ok(seq)
            }
            Err(e) => {
                if let Some(region) = keep {
                    // SAFETY: the request was never enqueued, so the device never saw it.
                    unsafe { t.dma_free(region) };
                }
                Err(map_error(&e))
            }
        }
    }

    /// Rings the doorbell for everything enqueued.
    pub fn submit(&mut self) {
        self.stream.submit();
    }

    /// Waits until request `seq` has completed.
    pub fn wait_until(&mut self, t: &AnyTransport, seq: u64) {
        self.stream.submit();
        while self.pending.front().is_some_and(|p| p.seq <= seq) {
            self.wait_oldest(t);
        }
    }

    /// Reaps what has completed without waiting.
    pub fn poll(&mut self, t: &AnyTransport) {
        self.stream.submit();
        while let Some(p) = self.pending.front() {
            match self.stream.try_take(p.ticket) {
                Ok(None) => break,
                Ok(Some(words)) => {
                    if let Some(p) = self.pending.pop_front() {
                        self.finish(t, p, Ok(words));
                    }
                }
                Err(e) => {
                    if let Some(p) = self.pending.pop_front() {
                        self.finish(t, p, Err(e));
                    }
                }
            }
        }
    }

    /// Waits for everything enqueued; returns (and clears) the first asynchronous error.
    pub fn sync(&mut self, t: &AnyTransport) -> Result<(), CUresult> {
        self.stream.submit();
        while !self.pending.is_empty() {
            self.wait_oldest(t);
        }
        self.take_error()
    }

    /// Waits for everything enqueued, leaving any asynchronous error for the next
    /// synchronising call on this queue.
    pub fn wait_all_quiet(&mut self, t: &AnyTransport) {
        self.stream.submit();
        while !self.pending.is_empty() {
            self.wait_oldest(t);
        }
    }

    /// Returns (and clears) the first asynchronous error seen.
    pub fn take_error(&mut self) -> Result<(), CUresult> {
        match self.error.take() {
            Some(code) => Err(code),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::STREAM_CAPACITY;

    /// The worker runs one batch while it gathers the next only when the library has more
    /// than one batch of launches in flight (`vgpu-device/src/vhost/burst.rs`).
    #[test]
    fn two_of_the_worker_s_default_batches_fit_in_flight() {
        let in_flight = STREAM_CAPACITY / 2;
        let batch = usize::from(vgpu_device::DEFAULT_MAX_BATCH);
        assert!(
            in_flight >= 2 * batch,
            "{in_flight} requests in flight per queue hold fewer than two batches of {batch}"
        );
    }
}
