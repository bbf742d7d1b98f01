//! A burst of launches: more than one batch posted back to back (a program's launch loop
//! on a stream). Served one batch at a time on the queue thread, the GPU would wait while
//! the thread answers one batch and takes and checks the next: about a microsecond per
//! launch each, in series with the backend's enqueueing. In a burst the queue gets a
//! launch runner, a scoped thread that lives while the burst lasts: it runs one batch
//! under its grant ([`Vgpu::execute_batch`]) while the queue thread takes and checks the
//! next one off the ring and answers the one before, in ring order
//! (docs/architecture.md, "Batched launches").
//!
//! One batch runs while the next waits for the runner behind it and the one before is
//! answered: completions stay in ring order and a queue holds at most three batches of
//! requests in hand. A request that is
//! not a launch ends the burst: it is served after every launch before it was answered,
//! as it would be without the runner. A runner that cannot start leaves the burst to the
//! queue thread, one batch at a time.

use std::io;
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::thread;

use super::{pop, restart, Batched, VgpuVhostBackend, Vring};
use crate::chain::GuestMem;
use crate::device::Vgpu;
use crate::launch::LaunchBatch;
use crate::request::Received;

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
        let (to_runner, runner_in) = sync_channel::<LaunchBatch>(1);
        let (runner_out, from_runner) = sync_channel::<LaunchBatch>(1);
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

    /// The burst's loop: the runner runs one batch while this thread gathers the next and
    /// answers the one before.
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
        while burst.in_flight > 0 {
            let mut gathered = std::mem::take(&mut burst.spare);
            gathered.clear();
            // Only launches join; anything else waits until every batch was answered.
            if next.as_ref().is_none_or(Received::is_launch) {
                if let Some(r) = next.take() {
                    next = gathered.stage(limits, times, r);
                }
                while next.is_none() {
                    let Some(chain) = pop(vring, mem) else { break };
                    next = gathered.stage(limits, times, vgpu.receive(mem, chain));
                }
            }
            // Queued behind the running batch: the runner goes on without waiting for this
            // thread.
            if !gathered.is_empty() {
                burst.send(gathered)?;
            }
            let mut done = burst.recv()?;
            vgpu.answer_batch(queue, mem, &mut done);
            let completed = self.complete_batch(queue, vring, &done)?;
            burst.spare = done;
            if !completed {
                return Ok(Batched::Stop);
            }
        }
        // The queue's own batch keeps its memory for the next doorbell.
        *first = std::mem::take(&mut burst.spare);
        Ok(Batched::Served(restart(next)))
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
        vgpu.execute_batch(&mut batch);
        if done.send(batch).is_err() {
            return;
        }
    }
}
