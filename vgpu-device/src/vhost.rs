//! The vhost-user backend of one vGPU: one worker thread per queue, in-order completion
//! within a queue, EVENT_IDX-aware completion signalling on the call eventfd.
//!
//! It implements `VhostUserBackend` (the `&self` flavour) rather than
//! `VhostUserBackendMut`: the latter is served through a `Mutex`/`RwLock` wrapper that
//! takes the lock for every `handle_event`, which would make a long kernel on one queue
//! block every other queue. All state here is internally synchronised instead.

use std::io;
use std::sync::atomic::{AtomicBool, AtomicU16, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use vgpu_backend::HostRegion;
use vhost::vhost_user::message::{VhostUserProtocolFeatures, VhostUserVirtioFeatures};
use vhost_user_backend::bitmap::BitmapMmapRegion;
use vhost_user_backend::{VhostUserBackend, VringRwLock, VringT};
use virtio_bindings::bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::bindings::virtio_ring::VIRTIO_RING_F_EVENT_IDX;
use virtio_queue::QueueT;
use vm_memory::{
    Address, GuestAddress, GuestAddressSpace, GuestMemoryAtomic, GuestMemoryBackend,
    GuestMemoryRegion, VolatileMemory,
};
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::event::{
    new_event_consumer_and_notifier, EventConsumer, EventFlag, EventNotifier,
};

use crate::chain::{Chain, GuestMem};
use crate::device::Vgpu;
use crate::launch::LaunchBatch;
use crate::memtable::check_memory_table;
use crate::request::Received;
use crate::timeline;
use vgpu_backend::sync::{lock, read, write};

mod burst;
mod prefetch;

/// Guest memory as vhost-user-backend hands it over.
pub type Memory = GuestMemoryAtomic<GuestMem>;
/// The vring type.
pub type Vring = VringRwLock<Memory>;

/// The vhost-user backend serving one vGPU.
pub struct VgpuVhostBackend {
    vgpu: Arc<Vgpu>,
    mem: RwLock<Memory>,
    event_idx: AtomicBool,
    config: Vec<u8>,
    /// Guest RAM regions registered with the backend (for direct copies).
    registered: Mutex<Vec<HostRegion>>,
    /// The last memory table that passed [`check_memory_table`], put back when a frontend
    /// offers one that does not.
    accepted: Mutex<GuestMem>,
    /// How long a queue thread keeps polling its ring after the last request before it
    /// sleeps on the kick eventfd (0: never polls). See [`VgpuVhostBackend::with_poll`].
    poll: Duration,
}

impl std::fmt::Debug for VgpuVhostBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VgpuVhostBackend")
            .field("vgpu", &self.vgpu)
            .finish()
    }
}

impl VgpuVhostBackend {
    /// A backend for `vgpu`; `mem` is the same `GuestMemoryAtomic` given to the daemon.
    pub fn new(vgpu: Arc<Vgpu>, mem: Memory) -> Self {
        let config = vgpu.config_space().to_bytes().to_vec();
        let accepted = Mutex::new((*mem.memory()).clone());
        timeline::init();
        Self {
            vgpu,
            mem: RwLock::new(mem),
            event_idx: AtomicBool::new(false),
            config,
            registered: Mutex::new(Vec::new()),
            accepted,
            poll: Duration::ZERO,
        }
    }

    /// Polls each ring for `poll` after its last request before sleeping (adaptive
    /// polling, like vhost's busy-poll). With EVENT_IDX the guest does not kick while the
    /// device polls (its avail_event stays behind), so a guest that sends its next request
    /// within the window saves a VM exit, an eventfd wake-up and a thread switch: several
    /// microseconds per request under nested virtualisation. Costs up to `poll` of one
    /// core per burst; off (0) by default.
    pub fn with_poll(mut self, poll: Duration) -> Self {
        self.poll = poll;
        self
    }

    /// The vGPU.
    /// Whether `vring`'s queue has nothing in hand: every request taken off the ring was
    /// answered, and, unless the ring is stopped, nothing waits there to be taken. A move
    /// stops the VM only when each queue a thread is inside of is quiet.
    pub fn quiet(&self, vring: &Vring) -> bool {
        let state = vring.get_ref();
        let queue = state.get_queue();
        if queue.next_avail() != queue.next_used() {
            return false;
        }
        if !queue.ready() {
            return true;
        }
        let atomic = read(&self.mem).clone();
        let guard = atomic.memory();
        let mem: &GuestMem = &guard;
        // A ring the device cannot read serves nothing more.
        queue
            .avail_idx(mem, Ordering::Acquire)
            .map_or(true, |idx| idx.0 == queue.next_avail())
    }

    pub fn vgpu(&self) -> &Arc<Vgpu> {
        &self.vgpu
    }

    /// Serves every available request of one vring, in order, signalling completions.
    fn process_vring(&self, queue: u16, vring: &Vring) -> io::Result<()> {
        let atomic = read(&self.mem).clone();
        let guard = atomic.memory();
        let mem: &GuestMem = &guard;
        let event_idx = self.event_idx.load(Ordering::Acquire);
        let batching = self.vgpu.config().batch.max_launches > 1;
        // End of the current polling window (set when the ring first runs dry).
        let mut deadline: Option<Instant> = None;
        // A chain taken off the ring that ended a batch: served next.
        let mut held = None;
        let mut guess = prefetch::Prefetch::new(vring, mem);
        loop {
            if event_idx {
                vring.disable_notification().map_err(io::Error::other)?;
            }
            loop {
                let r = match held.take() {
                    Some(r) => r,
                    None => match pop(vring, mem) {
                        Some(c) => {
                            let r = self.vgpu.receive(mem, c);
                            guess.learn(mem, r.chain.head_index(), r.layout.header);
                            r
                        }
                        None => break,
                    },
                };
                deadline = None;
                let r = if batching && r.is_launch() {
                    match self.serve_launches(queue, vring, mem, r)? {
                        Batched::Alone(r) => r,
                        Batched::Served(next) => {
                            held = next;
                            continue;
                        }
                        Batched::Stop => return Ok(()),
                    }
                } else {
                    r
                };
                let head = r.chain.head_index();
                timeline::begin(self.vgpu.config().vgpu_id, queue, r.kick);
                let used = self.vgpu.serve(queue, mem, r);
                if let Err(e) = vring.add_used(head, used) {
                    // The guest broke its own used ring; nothing more can be completed.
                    tracing::warn!(queue, error = %e, "cannot add to the used ring; stopping this queue until the next kick");
                    return Ok(());
                }
                match vring.needs_notification() {
                    Ok(true) => vring.signal_used_queue()?,
                    Ok(false) => {}
                    Err(e) => {
                        tracing::debug!(queue, error = %e, "cannot read the guest's used_event; not signalling")
                    }
                }
                timeline::end();
            }
            if !event_idx {
                return Ok(());
            }
            if !self.poll.is_zero() {
                let end = *deadline.get_or_insert_with(|| Instant::now() + self.poll);
                if posted_before(vring, mem, end, &guess) {
                    continue;
                }
            }
            match vring.enable_notification() {
                Ok(true) => continue, // more arrived while notifications were off
                Ok(false) => return Ok(()),
                Err(e) => {
                    tracing::warn!(queue, error = %e, "cannot re-enable notifications");
                    return Ok(());
                }
            }
        }
    }
}

/// Turns of [`posted_before`]'s spin between two reads of the clock.
const SPINS_PER_CLOCK_READ: u32 = 16;

/// Spins on `vring`'s available index, without its lock, until the guest posts past what
/// was taken off the ring (true) or `end` passes (false). A request is seen one load of
/// the index after it is posted: the lock, the queue's checks and the clock stay out of
/// the loop. A ring stopped or moved meanwhile costs at most the rest of the window (the
/// caller takes the lock and looks again).
fn posted_before(vring: &Vring, mem: &GuestMem, end: Instant, guess: &prefetch::Prefetch) -> bool {
    let (index, taken) = {
        let state = vring.get_ref();
        let queue = state.get_queue();
        if !queue.ready() {
            return false;
        }
        // The available ring's index follows its 16-bit flags.
        (
            GuestAddress(queue.avail_ring()).checked_add(2),
            queue.next_avail(),
        )
    };
    // The index's word, looked up once: each look is then one load, with no region
    // lookup or dirty-bitmap reference taken and dropped on the way.
    let Some(slice) = index.and_then(|i| mem.get_slice(i, 2).ok()) else {
        return false;
    };
    let Ok(posted) = slice.get_atomic_ref::<AtomicU16>(0) else {
        return false;
    };
    loop {
        for _ in 0..SPINS_PER_CLOCK_READ {
            if posted.load(Ordering::Acquire) != taken {
                guess.ask(taken);
                return true;
            }
            std::hint::spin_loop();
        }
        if Instant::now() >= end {
            return false;
        }
    }
}

/// The next chain on `vring`'s available ring. The vring lock is held only to pop: reading
/// and serving the request must not block the frontend's vring messages.
fn pop<'m>(vring: &Vring, mem: &'m GuestMem) -> Option<Chain<'m>> {
    vring.get_mut().get_queue_mut().pop_descriptor_chain(mem)
}

/// What [`VgpuVhostBackend::serve_launches`] did.
enum Batched<'m> {
    /// The launch does not join a batch: serve it alone.
    Alone(Received<'m>),
    /// A batch was served; the request that ended it, taken off the ring, comes next.
    Served(Option<Received<'m>>),
    /// The used ring is broken: stop serving the queue until the next kick.
    Stop,
}

impl VgpuVhostBackend {
    /// Serves the launch `first` with the launches posted right behind it as one batch
    /// (`launch/batch.rs`), then completes them in ring order and signals the guest once.
    fn serve_launches<'m>(
        &self,
        queue: u16,
        vring: &Vring,
        mem: &'m GuestMem,
        first: Received<'m>,
    ) -> io::Result<Batched<'m>> {
        let vgpu = &self.vgpu;
        let Some(mut batch) = vgpu.batch(queue) else {
            return Ok(Batched::Alone(first));
        };
        let (limits, times) = (&vgpu.config().batch, &vgpu.kernel_times);
        if let Some(r) = batch.stage(limits, times, first) {
            return Ok(Batched::Alone(r));
        }
        let mut next = None;
        while let Some(chain) = pop(vring, mem) {
            next = batch.stage(limits, times, vgpu.receive(mem, chain));
            if next.is_some() {
                break;
            }
        }
        // The batch is full and more launches wait behind it: a burst, served with a
        // launch runner (`vhost/burst.rs`).
        if next.as_ref().is_some_and(Received::is_launch) {
            return self.serve_burst(queue, vring, mem, &mut batch, next);
        }
        // Answered and completed the moment its kernels end, before the backend's and
        // the grant's cleanup (`launch/batch.rs`).
        let early = vgpu.run_batch_then(queue, mem, &mut batch, |b| {
            (self.put_used(queue, vring, b), timeline::stamp())
        });
        let (completed, used_at) = match early {
            Some((completed, at)) => (completed?, at),
            None => (self.put_used(queue, vring, &batch)?, timeline::stamp()),
        };
        self.record_batch(queue, &batch, used_at);
        if !completed {
            return Ok(Batched::Stop);
        }
        Ok(Batched::Served(restart(next)))
    }

    /// Puts an answered batch's completions in the used ring, in order, signals the guest
    /// once and records the batch on the timeline. False when the used ring is broken.
    fn complete_batch(&self, queue: u16, vring: &Vring, batch: &LaunchBatch) -> io::Result<bool> {
        let completed = self.put_used(queue, vring, batch)?;
        self.record_batch(queue, batch, timeline::stamp());
        Ok(completed)
    }

    /// Puts an answered batch's completions in the used ring, in order, and signals the
    /// guest once. False when the used ring is broken.
    fn put_used(&self, queue: u16, vring: &Vring, batch: &LaunchBatch) -> io::Result<bool> {
        for (head, used) in batch.completions() {
            if let Err(e) = vring.add_used(head, used) {
                tracing::warn!(queue, error = %e, "cannot add to the used ring; stopping this queue until the next kick");
                return Ok(false);
            }
        }
        match vring.needs_notification() {
            Ok(true) => vring.signal_used_queue()?,
            Ok(false) => {}
            Err(e) => {
                tracing::debug!(queue, error = %e, "cannot read the guest's used_event; not signalling")
            }
        }
        Ok(true)
    }

    /// Puts a completed batch on the timeline, its completions at `used`.
    fn record_batch(&self, queue: u16, batch: &LaunchBatch, used: u64) {
        batch.record_timeline(self.vgpu.config().vgpu_id, queue, used);
        tracing::trace!(queue, requests = batch.len(), "batch done");
    }
}

/// The request that ended a batch: busy from now on, not while the batch ran.
fn restart(mut next: Option<Received<'_>>) -> Option<Received<'_>> {
    if let Some(r) = &mut next {
        r.start = Instant::now();
    }
    next
}

impl Drop for VgpuVhostBackend {
    fn drop(&mut self) {
        timeline::flush();
    }
}

/// The host mappings of the regions of `mem`.
fn host_regions(mem: &Memory) -> Vec<HostRegion> {
    let guard = mem.memory();
    GuestMemoryBackend::iter(&*guard)
        .map(|r| HostRegion {
            addr: r.as_ptr() as usize,
            len: usize::try_from(r.len()).unwrap_or(0),
        })
        .collect()
}

impl VhostUserBackend for VgpuVhostBackend {
    type Bitmap = BitmapMmapRegion;
    type Vring = Vring;

    fn num_queues(&self) -> usize {
        usize::from(self.vgpu.config().num_queues)
    }

    fn max_queue_size(&self) -> usize {
        usize::from(self.vgpu.config().queue_size)
    }

    fn features(&self) -> u64 {
        // LOG_ALL: every page this backend writes in guest RAM is marked in the frontend's
        // dirty log (`SET_LOG_BASE`, protocol feature LOG_SHMFD) while a migration runs.
        (1 << VIRTIO_F_VERSION_1)
            | (1 << VIRTIO_RING_F_EVENT_IDX)
            | VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits()
            | VhostUserVirtioFeatures::LOG_ALL.bits()
    }

    fn acked_features(&self, features: u64) {
        let logging = features & VhostUserVirtioFeatures::LOG_ALL.bits() != 0;
        tracing::debug!(
            features = format_args!("{features:#x}"),
            logging,
            "features acked"
        );
    }

    fn protocol_features(&self) -> VhostUserProtocolFeatures {
        VhostUserProtocolFeatures::CONFIG
            | VhostUserProtocolFeatures::MQ
            | VhostUserProtocolFeatures::LOG_SHMFD
    }

    fn reset_device(&self) {
        tracing::info!(
            vgpu = self.vgpu.config().vgpu_id,
            "frontend reset the device"
        );
    }

    fn set_event_idx(&self, enabled: bool) {
        self.event_idx.store(enabled, Ordering::Release);
    }

    fn get_config(&self, offset: u32, size: u32) -> Vec<u8> {
        let start = offset as usize;
        let end = start.saturating_add(size as usize).min(self.config.len());
        self.config
            .get(start..end)
            .map(<[u8]>::to_vec)
            .unwrap_or_default()
    }

    fn set_config(&self, offset: u32, _buf: &[u8]) -> io::Result<()> {
        tracing::debug!(offset, "refused a write to the read-only config space");
        Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            "the vGPU config space is read-only",
        ))
    }

    fn update_memory(&self, mem: Memory) -> io::Result<()> {
        let offered = (*mem.memory()).clone();
        if let Err(e) = check_memory_table(&offered) {
            // vhost-user-backend has already swapped the table in; put the accepted one
            // back before a queue thread touches the refused one, and fail the message.
            let previous = lock(&self.accepted).clone();
            match mem.lock() {
                Ok(guard) => guard.replace(previous),
                Err(poisoned) => poisoned.into_inner().replace(previous),
            }
            tracing::warn!(
                vgpu = self.vgpu.config().vgpu_id,
                error = %e,
                "refused the frontend's memory table"
            );
            return Err(io::Error::new(io::ErrorKind::PermissionDenied, e));
        }
        *lock(&self.accepted) = offered;
        let regions = host_regions(&mem);
        let backend = self.vgpu.backend();
        let mut registered = lock(&self.registered);
        // Every region is registered afresh: a new region may sit at an old one's address
        // with other pages behind it. Unregistering waits for copies still using them.
        let host = backend.host_memory();
        if let Some(h) = host {
            h.unregister(&registered);
        }
        registered.clear();
        *write(&self.mem) = mem;
        if let Some(Err(e)) = host.map(|h| h.register(&regions)) {
            tracing::warn!(error = %e, "guest memory not fully registered with the backend");
        }
        // Charged to the vGPU whether or not the backend pins it: the worker maps it all.
        let bytes = regions.iter().map(|r| r.len as u64).sum();
        self.vgpu.stats.pinned_host(bytes);
        // Unregistering an address that failed to register is a no-op.
        *registered = regions;
        tracing::debug!(regions = registered.len(), "guest memory table updated");
        Ok(())
    }

    fn queues_per_thread(&self) -> Vec<u64> {
        // One thread per queue: queues never wait for each other.
        (0..self.vgpu.config().num_queues)
            .map(|q| 1u64 << q)
            .collect()
    }

    fn exit_event(&self, _thread_index: usize) -> Option<(EventConsumer, EventNotifier)> {
        match new_event_consumer_and_notifier(EventFlag::NONBLOCK | EventFlag::CLOEXEC) {
            Ok(pair) => Some(pair),
            Err(e) => {
                tracing::error!(error = %e, "cannot create a vring thread exit eventfd");
                None
            }
        }
    }

    fn handle_event(
        &self,
        device_event: u16,
        evset: EventSet,
        vrings: &[Vring],
        thread_id: usize,
    ) -> io::Result<()> {
        if evset != EventSet::IN {
            tracing::debug!(?evset, "unexpected vring event");
            return Ok(());
        }
        // With one queue per thread, the thread index is the queue index and the event
        // indexes this thread's vrings.
        let Some(vring) = vrings.get(usize::from(device_event)) else {
            tracing::warn!(device_event, "event for an unknown vring");
            return Ok(());
        };
        let queue = u16::try_from(thread_id).unwrap_or(u16::MAX);
        self.process_vring(queue, vring)
    }
}
