//! A batch: the launches a queue thread takes one after the other off its ring, run under
//! one grant, then answered in ring order. Each queue keeps its batch between doorbells
//! ([`Vgpu::batch`]), so that a warm queue reuses its items.

use std::cell::Cell;
use std::time::Instant;

use vgpu_backend::LaunchStats;
use virtio_queue::desc::split::Descriptor;

use super::{outcome, Checked, Ran};
use crate::chain::GuestMem;
use crate::config::BatchLimits;
use crate::device::{elapsed_ns, Outcome, Vgpu};
use crate::error::RequestError;
use crate::kernel_times::KernelTimes;
use crate::request::{Body, Received};
use crate::timeline;

/// One request of a batch.
#[derive(Debug)]
struct Item {
    /// The chain's head index (for the used ring).
    head: u16,
    /// When it came off the available ring (timeline clock; 0: not recorded).
    kick: u64,
    /// When it came off the available ring.
    start: Instant,
    /// The guest's request id.
    id: u64,
    /// Where its response goes.
    resp: Descriptor,
    /// Bytes of its writable data descriptors.
    data_writable_len: u64,
    /// The launch, when it passed the checks.
    launch: Option<Box<Checked>>,
    /// Its answer: the error of its checks, else the kernel's once the batch ran.
    outcome: Option<Outcome>,
    /// The used length of its completion (set when it is answered: perhaps from inside the
    /// backend's call, [`Vgpu::run_batch_then`]).
    used: Cell<u32>,
}

impl Item {
    /// Whether it went to the GPU under the batch's grant.
    fn ran(&self) -> bool {
        self.launch.is_some()
    }
}

/// The launches a queue thread is gathering, and then their completions.
#[derive(Debug, Default)]
pub(crate) struct LaunchBatch {
    items: Vec<Item>,
    /// Launches that passed the checks.
    launches: usize,
    /// Their expected times together, as the batch limit counts them.
    window_ns: u64,
    /// The batch's grant on the timeline: asked, granted, backend call ended, released.
    stages: [u64; 4],
}

impl LaunchBatch {
    /// Empties the batch (keeping its memory).
    pub fn clear(&mut self) {
        self.items.clear();
        self.launches = 0;
        self.window_ns = 0;
        self.stages = [0; 4];
    }

    /// Requests in the batch.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// Whether it holds no request.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// Adds the launch `r` (checked when it was read; one that failed its checks joins
    /// with its error, to be answered in order). Returns it
    /// when it does not join: it is not an answerable launch, or the batch is full
    /// (launches, or expected time: see [`crate::BatchLimits`]); the caller serves it after
    /// the batch.
    pub fn stage<'m>(
        &mut self,
        limits: &BatchLimits,
        times: &KernelTimes,
        r: Received<'m>,
    ) -> Option<Received<'m>> {
        if !r.is_launch() || self.items.len() >= usize::from(limits.max_launches) {
            return Some(r);
        }
        let Some(resp) = r.layout.response else {
            return Some(r);
        };
        let mut window = 0;
        if matches!(r.body, Body::Launch(_)) {
            let expect = times.expect(r.function());
            // A kernel not timed yet counts as the whole window.
            window = if expect == 0 {
                limits.max_expected_ns
            } else {
                expect
            };
            if self.launches > 0 && self.window_ns.saturating_add(window) > limits.max_expected_ns {
                return Some(r);
            }
        }
        let head = r.chain.head_index();
        let (launch, outcome) = match r.body {
            Body::Launch(c) => {
                self.launches += 1;
                self.window_ns = self.window_ns.saturating_add(window);
                (Some(c), None)
            }
            Body::Refused(e) => (None, Some(Err(e))),
            Body::Unanswerable | Body::Other(_) => return Some(r),
        };
        self.items.push(Item {
            head,
            kick: r.kick,
            start: r.start,
            id: r.id,
            resp,
            data_writable_len: r.layout.data_writable_len,
            launch,
            outcome,
            used: Cell::new(0),
        });
        None
    }

    /// The completions, in ring order: (head index, used length).
    pub fn completions(&self) -> impl Iterator<Item = (u16, u32)> + '_ {
        self.items.iter().map(|i| (i.head, i.used.get()))
    }

    /// Puts every request of the batch on the timeline, completed at `used`.
    pub fn record_timeline(&self, vgpu: u32, queue: u16, used: u64) {
        if !timeline::enabled() {
            return;
        }
        let [asked, granted, backend_end, released] = self.stages;
        for i in &self.items {
            let stages = if i.ran() {
                (1, asked, granted, backend_end, released)
            } else {
                (0, 0, 0, 0, 0)
            };
            timeline::push(timeline::Record {
                vgpu,
                queue,
                resource: stages.0,
                kick: i.kick,
                asked: stages.1,
                granted: stages.2,
                backend_end: stages.3,
                released: stages.4,
                used,
            });
        }
    }
}

impl Vgpu {
    /// Runs the batch's launches under one grant, then writes every response (in order);
    /// the caller puts the completions in the used ring.
    pub(crate) fn run_batch(&self, queue: u16, mem: &GuestMem, batch: &mut LaunchBatch) {
        self.execute_batch(batch);
        self.answer_batch(queue, mem, batch);
    }

    /// Asks for the lines of the batch's checked launches together. The launch runner does
    /// this first: the queue thread checked them on another core, and read one after the
    /// other each would wait for its own transfer.
    pub(crate) fn prefetch_launches(batch: &LaunchBatch) {
        for c in batch.items.iter().filter_map(|i| i.launch.as_deref()) {
            c.prefetch();
        }
    }

    /// Runs the batch's launches under one grant and keeps each one's outcome. It touches
    /// no guest memory, so a queue's launch runner may do it while the queue thread gathers
    /// the next batch (`vhost/burst.rs`).
    pub(crate) fn execute_batch(&self, batch: &mut LaunchBatch) {
        self.execute_batch_with(batch, &mut |_, _| false);
    }

    /// [`Vgpu::execute_batch`], handing the batch and the backend's results to `ended` the
    /// moment its kernels were seen finished, from inside the backend's call
    /// ([`vgpu_backend::Backend::launch_then`]). When `ended` answered the batch (true), no
    /// outcome is kept; returns whether it did.
    fn execute_batch_with(
        &self,
        batch: &mut LaunchBatch,
        ended: &mut dyn FnMut(&LaunchBatch, &[vgpu_backend::Result<LaunchStats>]) -> bool,
    ) -> bool {
        if batch.launches == 0 {
            return false;
        }
        let mut answered = false;
        let Ran { results, stages } = {
            let b: &LaunchBatch = batch;
            let launches: Vec<&Checked> =
                b.items.iter().filter_map(|i| i.launch.as_deref()).collect();
            self.run_launches_then(&launches, &mut |results| answered = ended(b, results))
        };
        batch.stages = stages;
        if !answered {
            let mut results = results.into_iter();
            for i in batch.items.iter_mut().filter(|i| i.ran()) {
                i.outcome = Some(outcome(results.next()));
            }
        }
        answered
    }

    /// Writes the response of every request of an executed batch, in ring order.
    pub(crate) fn answer_batch(&self, queue: u16, mem: &GuestMem, batch: &mut LaunchBatch) {
        let share = busy_share(batch);
        for i in &mut batch.items {
            let outcome = i.outcome.take().unwrap_or_else(|| {
                Err(RequestError::Backend(vgpu_backend::BackendError::Device(
                    "the launch was not run; retry it".into(),
                )))
            });
            self.respond_item(queue, mem, i, outcome, share);
        }
    }

    /// [`Vgpu::run_batch`], answering the batch and handing it to `complete` (which puts
    /// its completions in the used ring) the moment its kernels were seen finished, from
    /// inside the backend's call ([`vgpu_backend::Backend::launch_then`]): the backend's
    /// cleanup, the grant's release and the kernel-time records come after the guest has
    /// its answer, so a lone launch's round trip does not wait for them. Only a batch
    /// whose every request went to the GPU and succeeded is answered so; any other is
    /// answered after the call, as [`Vgpu::run_batch`] does, and `complete` is not called.
    /// Returns what `complete` returned, or `None` when the caller completes the batch.
    pub(crate) fn run_batch_then<T>(
        &self,
        queue: u16,
        mem: &GuestMem,
        batch: &mut LaunchBatch,
        complete: impl FnOnce(&LaunchBatch) -> T,
    ) -> Option<T> {
        let all_ran = batch.launches == batch.items.len();
        let mut complete = Some(complete);
        let mut completed = None;
        let answered = self.execute_batch_with(batch, &mut |b, results| {
            let all_ok = results.len() == b.items.len() && results.iter().all(Result::is_ok);
            let Some(complete) = complete.take().filter(|_| all_ran && all_ok) else {
                return false;
            };
            let share = busy_share(b);
            for (i, r) in b.items.iter().zip(results) {
                let device_ns = r.as_ref().map_or(0, |s| s.device_ns);
                self.respond_item(queue, mem, i, Ok([device_ns, 0, 0, 0]), share);
            }
            completed = Some(complete(b));
            true
        });
        if !answered {
            self.answer_batch(queue, mem, batch);
        }
        completed
    }

    /// Writes the response of one launch of a batch and keeps its used length.
    fn respond_item(&self, queue: u16, mem: &GuestMem, i: &Item, outcome: Outcome, share: u64) {
        i.used.set(self.respond(
            queue,
            mem,
            (&i.resp, i.data_writable_len),
            (i.id, vgpu_proto::Opcode::Launch.name()),
            outcome,
            || share,
        ));
    }
}

/// Each request's part of the batch's time so far: the batch counts once in the busy time.
fn busy_share(batch: &LaunchBatch) -> u64 {
    let first = batch.items.first().map(|i| i.start);
    first.map_or(0, elapsed_ns) / (batch.items.len().max(1) as u64)
}
