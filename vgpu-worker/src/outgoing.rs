//! Whole-VM migration, the source worker's half: on vgpud's `migrate_out` the vGPU's
//! state streams to the destination worker (`vgpu_migration::RemoteSender`): device
//! memory pre-copied while the VM runs, the rest at the VM's stop. The stop is the vmm
//! stopping the rings (vhost-user `GET_VRING_BASE`): the first ring's stop waits here
//! until the destination holds the state, so the VM and its vGPU stop once, together.
//! When the state does not get there, that ring's stop fails, and the vmm rolls the VM
//! back (it runs on here, its vGPU whole).

use std::fs::File;
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

use vgpu_api::control::{MigrationDone, MigrationProgress, ReplyBody, WorkerMessage};
use vgpu_device::{Memory, VgpuVhostBackend};
use vhost::vhost_user::message::{
    VhostTransferStateDirection, VhostTransferStatePhase, VhostUserProtocolFeatures,
};
use vhost_user_backend::VhostUserBackend;
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::event::{EventConsumer, EventNotifier};

use crate::control::ControlState;
use crate::memlink::ControlOut;

/// How long the source waits on one write or read of the stream.
const STREAM_TIMEOUT: Duration = Duration::from_secs(30);
/// How long the VM's stop waits for the requests in flight.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);
/// Between pre-copy rounds once the rest fits the downtime budget.
const IDLE_ROUND: Duration = Duration::from_millis(20);

#[derive(Default)]
struct State {
    /// A move is under way.
    armed: bool,
    /// The VM stopped: finish now.
    stop: bool,
    /// vgpud gave the move up.
    cancelled: bool,
    /// How the last move ended (for the rings stopped after the first).
    result: Option<Result<(), String>>,
    /// Queue threads serving the guest right now.
    in_flight: usize,
    /// The same, per queue.
    inside: Vec<usize>,
    /// The guest's requests wait: the vGPU's state is on its way or went to the
    /// destination (until the move is given up).
    frozen: bool,
}

/// The outgoing move as the ring-stop hook and the sending thread share it.
#[derive(Default)]
pub struct Outgoing {
    state: Mutex<State>,
    changed: Condvar,
}

impl Outgoing {
    fn arm(&self) -> bool {
        let mut s = vgpu_sync::lock(&self.state);
        if s.armed {
            return false;
        }
        s.armed = true;
        s.stop = false;
        s.cancelled = false;
        s.result = None;
        true
    }

    /// Gives up the move under way (its thread ends at its next step).
    pub fn cancel(&self) -> bool {
        let mut s = vgpu_sync::lock(&self.state);
        let was = s.armed;
        s.cancelled = true;
        // The VM runs on here: its requests go on.
        s.frozen = false;
        self.changed.notify_all();
        was
    }

    /// The frontend is gone: nothing is held back any more (the worker ends).
    pub fn release(&self) {
        vgpu_sync::lock(&self.state).frozen = false;
        self.changed.notify_all();
    }

    /// Waits up to `wait` for the stop; whether to finish now, or Err when cancelled.
    fn stop_wanted(&self, wait: Duration) -> Result<bool, String> {
        let s = vgpu_sync::lock(&self.state);
        let (s, _) = self
            .changed
            .wait_timeout_while(s, wait, |s| !s.stop && !s.cancelled)
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if s.cancelled {
            return Err("vgpud gave the move up".into());
        }
        Ok(s.stop)
    }

    fn done(&self, result: Result<(), String>) {
        let mut s = vgpu_sync::lock(&self.state);
        s.armed = false;
        s.result = Some(result);
        self.changed.notify_all();
    }

    /// A ring stops (the vmm's `GET_VRING_BASE`). During a move, the first one finishes
    /// it and waits for the outcome; an error fails the ring's stop (the vmm rolls back).
    ///
    /// Before that, the requests the guest sent before it stopped complete (their used
    /// entries land in guest RAM before the vmm sends it) and no new ones start: queue
    /// threads wait at their entry, and the stop waits until every queue a thread is
    /// inside of is `quiet(q)`: every request taken off its ring answered, and nothing
    /// left to take unless the ring is stopped (a stopped ring's untaken requests go to the
    /// destination with it). A request still in hand is always waited for, however long
    /// it runs (a kernel, a swap-in of an oversubscribed vGPU's pieces), up to
    /// [`DRAIN_TIMEOUT`]; past that the move is given up and the VM runs on here.
    fn ring_stopped(&self, ring: u32, quiet: impl Fn(usize) -> bool) -> io::Result<()> {
        let mut s = vgpu_sync::lock(&self.state);
        if !s.armed {
            return match s.result.take() {
                Some(Err(e)) => Err(io::Error::other(e)),
                Some(Ok(())) | None => Ok(()),
            };
        }
        // Requests the guest sent before it stopped complete here first (their used
        // entries land in guest RAM before the vmm sends it); none start after.
        s.frozen = true;
        let start = Instant::now();
        let mut drained = true;
        while s.in_flight > 0 {
            if s.inside
                .iter()
                .enumerate()
                .all(|(q, n)| *n == 0 || quiet(q))
            {
                break;
            }
            if start.elapsed() > DRAIN_TIMEOUT {
                drained = false;
                break;
            }
            s = self
                .changed
                .wait_timeout(s, Duration::from_millis(1))
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .0;
        }
        if !drained {
            s.cancelled = true;
            s.frozen = false;
            self.changed.notify_all();
            return Err(io::Error::other(
                "the vGPU's queues did not drain; the VM stays here",
            ));
        }
        tracing::info!(ring, "the VM stopped: sending the rest of the vGPU's state");
        s.stop = true;
        self.changed.notify_all();
        let mut s = self
            .changed
            .wait_while(s, |s| s.armed)
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match &s.result {
            Some(Err(e)) => {
                let e = io::Error::other(e.clone());
                s.frozen = false;
                self.changed.notify_all();
                Err(e)
            }
            Some(Ok(())) | None => Ok(()),
        }
    }

    /// A queue thread starts serving queue `q`: it waits while the guest's requests are
    /// held.
    fn enter(&self, q: usize) {
        let s = vgpu_sync::lock(&self.state);
        let mut s = self
            .changed
            .wait_while(s, |s| s.frozen)
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        s.in_flight += 1;
        if s.inside.len() <= q {
            s.inside.resize(q + 1, 0);
        }
        s.inside[q] += 1;
    }

    fn leave(&self, q: usize) {
        let mut s = vgpu_sync::lock(&self.state);
        s.in_flight = s.in_flight.saturating_sub(1);
        if let Some(n) = s.inside.get_mut(q) {
            *n = n.saturating_sub(1);
        }
        // Only a stop waits for queue threads to leave, and it sets `frozen` under this
        // lock before it waits: without one, a notify would be a system call per event
        // for nobody.
        if s.frozen {
            self.changed.notify_all();
        }
    }
}

impl ControlState {
    /// Starts sending the vGPU's state over `stream`; the reply goes out when it ends.
    pub fn start_migrate_out(
        self: &Arc<Self>,
        out: Arc<ControlOut>,
        id: u64,
        stream: OwnedFd,
        token: String,
        budget: Duration,
        stop_copy: bool,
    ) {
        let reply = move |body| WorkerMessage::Reply { id, body };
        if !self.outgoing.arm() {
            out.send(&reply(ReplyBody::Error {
                message: "a move of this vGPU to another host is already running".into(),
            }));
            return;
        }
        let st = self.clone();
        let spawned = std::thread::Builder::new()
            .name("migrate-out".into())
            .spawn(move || {
                let r = st.migrate_out(&out, stream, &token, budget, stop_copy);
                st.outgoing
                    .done(r.as_ref().map(|_| ()).map_err(Clone::clone));
                let body = match r {
                    Ok(report) => ReplyBody::Migrated { report },
                    Err(message) => ReplyBody::Error { message },
                };
                out.send(&reply(body));
            });
        if let Err(e) = spawned {
            self.outgoing
                .done(Err(format!("cannot start the sending thread: {e}")));
            tracing::error!(error = %e, "cannot start the migration thread");
        }
    }

    fn migrate_out(
        &self,
        out: &ControlOut,
        stream: OwnedFd,
        token: &str,
        budget: Duration,
        stop_copy: bool,
    ) -> Result<MigrationDone, String> {
        let stream = UnixStream::from(stream);
        for set in [
            stream.set_read_timeout(Some(STREAM_TIMEOUT)),
            stream.set_write_timeout(Some(STREAM_TIMEOUT)),
        ] {
            set.map_err(|e| format!("the stream to the destination: {e}"))?;
        }
        let started = Instant::now();
        let mut tx = self
            .migratable
            .send_to(stream, token.as_bytes())
            .map_err(|e| e.to_string())?;
        if let Some(p) = &self.pager {
            // Every byte of an oversubscribed vGPU goes, swapped pieces read where they are.
            tx = tx.through(p);
        }
        let mut last = Instant::now();
        if stop_copy {
            // The daemon stops the VM once it hears that this move is taken.
            out.send(&WorkerMessage::Migration {
                progress: MigrationProgress {
                    phase: "stop_copy".into(),
                    rounds: 0,
                    bytes: 0,
                    total: tx.total(),
                    dirty: 0,
                    elapsed_ms: started.elapsed().as_secs_f64() * 1e3,
                },
            });
        }
        loop {
            if stop_copy {
                // Stop-and-copy: nothing moves until the VM stops; then everything does.
                if self.outgoing.stop_wanted(IDLE_ROUND)? {
                    break;
                }
                continue;
            }
            let round = tx.precopy_round().map_err(|e| e.to_string())?;
            if last.elapsed() >= Duration::from_millis(100) {
                last = Instant::now();
                out.send(&WorkerMessage::Migration {
                    progress: MigrationProgress {
                        phase: "precopy".into(),
                        rounds: tx.rounds(),
                        bytes: tx.bytes(),
                        total: tx.total(),
                        dirty: round.dirty,
                        elapsed_ms: started.elapsed().as_secs_f64() * 1e3,
                    },
                });
            }
            let converged = round.dirty == 0 || round.expect <= budget;
            let wait = if converged {
                IDLE_ROUND
            } else {
                Duration::ZERO
            };
            if self.outgoing.stop_wanted(wait)? {
                break;
            }
        }
        let r = tx.finish().map_err(|e| e.to_string())?;
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        Ok(MigrationDone {
            rounds: r.rounds,
            precopy_bytes: r.precopy_bytes,
            stop_bytes: r.stop_bytes,
            total: r.total,
            downtime_ms: ms(r.downtime),
            drain_ms: ms(r.drain),
            elapsed_ms: ms(r.elapsed),
            timeline: r
                .timeline
                .iter()
                .map(|(p, a, b)| (p.name().to_string(), ms(*a), ms(*b)))
                .collect(),
        })
    }
}

/// The device's vhost-user backend with the ring-stop hook of an outgoing move.
#[derive(Clone)]
pub struct Hooked {
    inner: Arc<VgpuVhostBackend>,
    outgoing: Arc<Outgoing>,
    /// Each queue's vring, as its thread first serves it (one queue per thread).
    vrings: Arc<Vec<OnceLock<Vring>>>,
}

impl Hooked {
    pub fn new(inner: Arc<VgpuVhostBackend>, outgoing: Arc<Outgoing>) -> Self {
        let queues = inner.num_queues();
        Self {
            inner,
            outgoing,
            vrings: Arc::new((0..queues).map(|_| OnceLock::new()).collect()),
        }
    }

    /// Whether queue `q` has no request in hand (see [`VgpuVhostBackend::quiet`]); a
    /// queue whose thread never served it has none.
    fn quiet(&self, q: usize) -> bool {
        self.vrings
            .get(q)
            .and_then(OnceLock::get)
            .is_none_or(|v| self.inner.quiet(v))
    }
}

type Bitmap = <VgpuVhostBackend as VhostUserBackend>::Bitmap;
type Vring = <VgpuVhostBackend as VhostUserBackend>::Vring;

impl VhostUserBackend for Hooked {
    type Bitmap = Bitmap;
    type Vring = Vring;

    fn num_queues(&self) -> usize {
        self.inner.num_queues()
    }

    fn max_queue_size(&self) -> usize {
        self.inner.max_queue_size()
    }

    fn features(&self) -> u64 {
        self.inner.features()
    }

    fn acked_features(&self, features: u64) {
        self.inner.acked_features(features)
    }

    fn protocol_features(&self) -> VhostUserProtocolFeatures {
        self.inner.protocol_features()
    }

    fn reset_device(&self) {
        self.inner.reset_device()
    }

    fn set_event_idx(&self, enabled: bool) {
        self.inner.set_event_idx(enabled)
    }

    fn get_config(&self, offset: u32, size: u32) -> Vec<u8> {
        self.inner.get_config(offset, size)
    }

    fn set_config(&self, offset: u32, buf: &[u8]) -> io::Result<()> {
        self.inner.set_config(offset, buf)
    }

    fn update_memory(&self, mem: Memory) -> io::Result<()> {
        self.inner.update_memory(mem)
    }

    fn set_backend_req_fd(&self, backend: vhost::vhost_user::Backend) {
        self.inner.set_backend_req_fd(backend)
    }

    fn queues_per_thread(&self) -> Vec<u64> {
        self.inner.queues_per_thread()
    }

    fn exit_event(&self, thread_index: usize) -> Option<(EventConsumer, EventNotifier)> {
        self.inner.exit_event(thread_index)
    }

    fn stop_vring(&self, queue_index: u32) -> io::Result<()> {
        self.inner.stop_vring(queue_index)?;
        self.outgoing.ring_stopped(queue_index, |q| self.quiet(q))
    }

    fn handle_event(
        &self,
        device_event: u16,
        evset: EventSet,
        vrings: &[Self::Vring],
        thread_id: usize,
    ) -> io::Result<()> {
        // One queue per thread: the thread index is the queue's.
        if let (Some(slot), Some(v)) = (
            self.vrings.get(thread_id),
            vrings.get(usize::from(device_event)),
        ) {
            slot.get_or_init(|| v.clone());
        }
        self.outgoing.enter(thread_id);
        let r = self
            .inner
            .handle_event(device_event, evset, vrings, thread_id);
        self.outgoing.leave(thread_id);
        r
    }

    fn set_device_state_fd(
        &self,
        direction: VhostTransferStateDirection,
        phase: VhostTransferStatePhase,
        file: File,
    ) -> io::Result<Option<File>> {
        self.inner.set_device_state_fd(direction, phase, file)
    }

    fn check_device_state(&self) -> io::Result<()> {
        self.inner.check_device_state()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_ring_stop_waits_for_the_move_and_carries_its_outcome() {
        let o = Arc::new(Outgoing::default());
        // No move: rings stop at once.
        assert!(o.ring_stopped(0, |_| false).is_ok());
        for outcome in [Ok(()), Err("no room".to_string())] {
            assert!(o.arm());
            assert!(!o.arm(), "one move at a time");
            let sender = {
                let (o, outcome) = (o.clone(), outcome.clone());
                std::thread::spawn(move || {
                    while !o
                        .stop_wanted(Duration::from_millis(5))
                        .expect("not cancelled")
                    {}
                    o.done(outcome);
                })
            };
            let r = o.ring_stopped(0, |_| false);
            sender.join().expect("sender");
            assert_eq!(r.is_ok(), outcome.is_ok());
            // The next ring of the same stop hears the same outcome; a ring after that, none.
            assert_eq!(o.ring_stopped(1, |_| false).is_ok(), outcome.is_ok());
            assert!(o.ring_stopped(1, |_| false).is_ok());
        }
        // A cancelled move ends its sender.
        assert!(o.arm());
        assert!(o.cancel());
        assert!(o.stop_wanted(Duration::ZERO).is_err());
    }

    /// Starts a move and the sender that finishes it once the VM stops.
    fn armed(o: &Arc<Outgoing>) -> std::thread::JoinHandle<()> {
        assert!(o.arm());
        let o = o.clone();
        std::thread::spawn(move || {
            while !o
                .stop_wanted(Duration::from_millis(5))
                .expect("not cancelled")
            {}
            o.done(Ok(()));
        })
    }

    #[test]
    fn a_thread_left_on_a_quiet_queue_is_not_waited_for() {
        let o = Arc::new(Outgoing::default());
        // A queue thread inside on queue 0 that never leaves (it spins on its stopped
        // ring with nothing in hand): the stop goes on at once.
        o.enter(0);
        let sender = armed(&o);
        let t = Instant::now();
        let r = o.ring_stopped(0, |q| q == 0);
        sender.join().expect("sender");
        assert!(r.is_ok(), "{r:?}");
        assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
        o.leave(0);
    }

    #[test]
    fn a_request_in_hand_is_waited_for_however_long_it_serves_nothing() {
        let o = Arc::new(Outgoing::default());
        // A long request on queue 0 (a swap-in, a long kernel): nothing completes for
        // 300 ms, then it is answered. The stop must not go on before.
        o.enter(0);
        let answered = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let server = {
            let (o, answered) = (o.clone(), answered.clone());
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(300));
                answered.store(true, std::sync::atomic::Ordering::SeqCst);
                // The thread lingers on its ring a little before it leaves.
                std::thread::sleep(Duration::from_millis(100));
                o.leave(0);
            })
        };
        let sender = armed(&o);
        let r = o.ring_stopped(0, |_| answered.load(std::sync::atomic::Ordering::SeqCst));
        assert!(
            answered.load(std::sync::atomic::Ordering::SeqCst),
            "the VM stopped with a request in hand"
        );
        sender.join().expect("sender");
        server.join().expect("server");
        assert!(r.is_ok(), "{r:?}");
    }
}
