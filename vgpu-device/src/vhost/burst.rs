//! A burst of launches: more than one batch posted back to back (a program's launch loop
//! on a stream). Served one batch at a time on the queue thread, the GPU would wait while
//! the thread answers one batch and takes and checks the next: about a microsecond per
//! launch each, in series with the backend's enqueueing. In a burst the queue gets a
//! launch runner, a scoped thread that lives while the burst lasts: it runs one batch
//! under its grant ([`Vgpu::execute_batch`]) while the queue thread takes and checks the
//! next one off the ring and answers each batch the runner hands back, in ring order
//! (docs/architecture.md, "Batched launches").
//!
//! One batch runs and one more may wait behind it, so the runner goes from one to the next
//! without waiting for this thread; a queue holds at most three batches of requests in
//! hand. A batch goes to the runner when it is full, or when the ring is empty and the
//! runner has room; while the runner is busy the thread looks at an empty ring a little
//! longer ([`BURST_SPIN`]) since a launch loop posts about as fast as the thread takes. A
//! request that is not a launch ends the burst: it is served after every launch before it
//! was answered, as it would be without the runner. A runner that cannot start leaves the
//! burst to the queue thread, one batch at a time.

use std::io;
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TryRecvError};
use std::thread;
use std::time::{Duration, Instant};

use super::{pop, restart, Batched, VgpuVhostBackend, Vring};
use crate::chain::GuestMem;
use crate::device::Vgpu;
use crate::launch::LaunchBatch;
use crate::request::Received;

/// Batches handed to the runner and not yet back: one running, one waiting behind it.
const MAX_IN_FLIGHT: usize = 2;

/// How long the queue thread looks at an empty ring for more launches while the runner is
/// busy, before it waits for the runner.
const BURST_SPIN: Duration = Duration::from_micros(50);

impl VgpuVhostBackend {
    /// Serves `first`, a full batch, and the launches behind it on the ring (`next` is the
    /// first of them) with a launch runner. Returns the request that ended the burst.
    pub(super) fn serve_burst<'m>(
        &self,
        queue: u16,
        vring: &Vring,
        mem: &'m GuestMem,
        first: &mut LaunchBatch,
        next: Option<Received<'m>>,
    ) -> io::Result<Batched<'m>> {
        let vgpu: &Vgpu = &self.vgpu;
        let (to_runner, runner_in) = sync_channel::<LaunchBatch>(MAX_IN_FLIGHT);
        let (runner_out, from_runner) = sync_channel::<LaunchBatch>(MAX_IN_FLIGHT);
        thread::scope(|s| {
            let spawned = thread::Builder::new()
                .name(format!("vgpu{}-q{queue}-run", vgpu.config().vgpu_id))
                .spawn_scoped(s, move || run(vgpu, &runner_in, &runner_out));
            if let Err(e) = spawned {
                tracing::debug!(queue, error = %e, "cannot start a launch runner; serving the burst one batch at a time");
                vgpu.run_batch(queue, mem, first);
                if !self.complete_batch(queue, vring, first)? {
                    return Ok(Batched::Stop);
                }
                return Ok(Batched::Served(restart(next)));
            }
            let mut burst = Burst {
                to_runner,
                from_runner,
                in_flight: 0,
                spare: LaunchBatch::default(),
            };
            let r = self.pipeline(queue, vring, mem, &mut burst, first, next);
            // Dropping the sender ends the runner's loop; the scope joins it.
            drop(burst.to_runner);
            // Whatever the runner still holds was run; the queue stopped before answering.
            while burst.from_runner.recv().is_ok() {}
            r
        })
    }

    /// The burst's loop: the runner runs one batch, a second may wait behind it, and this
    /// thread gathers the next one and answers each as the runner hands it back.
    fn pipeline<'m>(
        &self,
        queue: u16,
        vring: &Vring,
        mem: &'m GuestMem,
        burst: &mut Burst,
        first: &mut LaunchBatch,
        mut next: Option<Received<'m>>,
    ) -> io::Result<Batched<'m>> {
        let vgpu: &Vgpu = &self.vgpu;
        let (limits, times) = (&vgpu.config().batch, &vgpu.kernel_times);
        burst.send(std::mem::take(first))?;
        let mut gathered = LaunchBatch::default();
        // Since when the ring has been found empty with the runner busy.
        let mut dry_since: Option<Instant> = None;
        loop {
            while let Some(done) = burst.try_recv()? {
                if !self.finish(queue, vring, mem, burst, done)? {
                    return Ok(Batched::Stop);
                }
            }
            // One more request into the batch being gathered: the launch that closed the
            // last one, else the next on the ring. Anything but a launch closes it and
            // waits until every launch before it was answered.
            let mut dry = false;
            match next.take() {
                Some(r) if gathered.is_empty() && r.is_launch() => {
                    next = gathered.stage(limits, times, r);
                    if next.is_none() {
                        continue;
                    }
                }
                Some(r) => next = Some(r),
                None => match pop(vring, mem) {
                    Some(chain) => {
                        dry_since = None;
                        next = gathered.stage(limits, times, vgpu.receive(mem, chain));
                        if next.is_none() {
                            continue;
                        }
                    }
                    None => dry = true,
                },
            }
            // The batch is closed or the ring is empty: it goes to the runner when the
            // runner has room.
            if !gathered.is_empty() && burst.in_flight < MAX_IN_FLIGHT {
                let spare = std::mem::take(&mut burst.spare);
                burst.send(std::mem::replace(&mut gathered, spare))?;
                gathered.clear();
                continue;
            }
            if burst.in_flight == 0 {
                break;
            }
            // The runner is busy. An empty ring may fill again soon (a program's launch
            // loop posts about as fast as this thread takes): look again for a while
            // before waiting for the runner.
            if dry && next.is_none() {
                let since = *dry_since.get_or_insert_with(Instant::now);
                if since.elapsed() < BURST_SPIN {
                    std::hint::spin_loop();
                    continue;
                }
            }
            let done = burst.recv()?;
            if !self.finish(queue, vring, mem, burst, done)? {
                return Ok(Batched::Stop);
            }
        }
        // The queue's own batch keeps its memory for the next doorbell.
        *first = std::mem::take(&mut burst.spare);
        Ok(Batched::Served(restart(next)))
    }

    /// Answers a batch the runner ran and completes it; false when the used ring is broken.
    fn finish(
        &self,
        queue: u16,
        vring: &Vring,
        mem: &GuestMem,
        burst: &mut Burst,
        mut done: LaunchBatch,
    ) -> io::Result<bool> {
        self.vgpu.answer_batch(queue, mem, &mut done);
        let completed = self.complete_batch(queue, vring, &done)?;
        burst.spare = done;
        Ok(completed)
    }
}

/// The queue thread's ends of a burst's two channels.
struct Burst {
    to_runner: SyncSender<LaunchBatch>,
    from_runner: Receiver<LaunchBatch>,
    /// Batches sent to the runner and not received back.
    in_flight: usize,
    /// A batch to gather the next one into (keeps its memory).
    spare: LaunchBatch,
}

impl Burst {
    fn send(&mut self, batch: LaunchBatch) -> io::Result<()> {
        self.to_runner.send(batch).map_err(|_| runner_gone())?;
        self.in_flight += 1;
        Ok(())
    }

    /// A batch the runner finished, if one is there already.
    fn try_recv(&mut self) -> io::Result<Option<LaunchBatch>> {
        match self.from_runner.try_recv() {
            Ok(b) => {
                self.in_flight -= 1;
                Ok(Some(b))
            }
            Err(TryRecvError::Empty) => Ok(None),
            Err(TryRecvError::Disconnected) => Err(runner_gone()),
        }
    }

    fn recv(&mut self) -> io::Result<LaunchBatch> {
        let b = self.from_runner.recv().map_err(|_| runner_gone())?;
        self.in_flight -= 1;
        Ok(b)
    }
}

fn runner_gone() -> io::Error {
    io::Error::other("the queue's launch runner stopped; the queue serves again at the next kick")
}

/// The runner: executes each batch it is handed and hands it back, until the queue thread
/// hangs up.
fn run(vgpu: &Vgpu, batches: &Receiver<LaunchBatch>, done: &SyncSender<LaunchBatch>) {
    for mut batch in batches {
        Vgpu::prefetch_launches(&batch);
        vgpu.execute_batch(&mut batch);
        if done.send(batch).is_err() {
            return;
        }
    }
}
