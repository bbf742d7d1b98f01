//! The worker's side: ask, wait for the grant, report the completion.

use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use vgpu_scheduler::gpu::Resource;
use vgpu_scheduler::Nanos;
use vmm_sys_util::eventfd::EventFd;

use crate::shm::{index, Completion, Page, LEASE_OPEN, LEASE_QUIET, SLOTS};
use crate::{futex, time, Gate, GrantError};

/// How long an acquirer spins on the grant word before sleeping on it: a grant usually
/// comes back within the daemon's wake-up time, and spinning that long saves a second
/// wake-up on our side.
const SPIN: Duration = Duration::from_micros(30);
/// How long an acquirer woken without a grant spins before sleeping again: the daemon
/// wakes the next vGPU's waiter just before the holder's work is expected to end
/// (`server::handover`), and the grant then follows within about this long.
const HANDOVER_SPIN: Duration = Duration::from_micros(200);
/// A grant slower than this is worth a log line (the daemon is stuck or gone).
const SLOW: Duration = Duration::from_secs(10);
/// Completions a quiet holder pushes past half a ring between two doorbells while the
/// daemon has not read its ring yet (see `GrantClient::quiet_completion`).
const QUIET_RE_RING: u64 = 512;

/// A worker's grant channel.
pub struct GrantClient {
    page: Page,
    doorbell: EventFd,
    /// Grants this worker has consumed, per resource (compared with `granted`).
    taken: [AtomicU32; 2],
    /// Replaced by another channel (the vGPU moved GPUs): waiters go there.
    retired: std::sync::atomic::AtomicBool,
    /// Doorbells rung so far (a diagnostic: a lone holder's requests ring none).
    rung: AtomicU64,
}

impl GrantClient {
    /// Opens the channel from the descriptors vgpud passed (see `WorkerFds`).
    pub fn from_fds(page: OwnedFd, doorbell: OwnedFd) -> Result<Self, GrantError> {
        let page = Page::open(page)?;
        let taken = [
            AtomicU32::new(page.granted(Resource::Compute).load(Ordering::SeqCst)),
            AtomicU32::new(page.granted(Resource::Copy).load(Ordering::SeqCst)),
        ];
        // SAFETY: `doorbell` is an eventfd descriptor the daemon created and passed; we own
        // it and give up the OwnedFd, so it is closed exactly once (by the EventFd).
        let doorbell = unsafe {
            <EventFd as std::os::fd::FromRawFd>::from_raw_fd(std::os::fd::IntoRawFd::into_raw_fd(
                doorbell,
            ))
        };
        Ok(Self {
            page,
            doorbell,
            taken,
            retired: std::sync::atomic::AtomicBool::new(false),
            rung: AtomicU64::new(0),
        })
    }

    /// How many times this worker rang the daemon's doorbell.
    pub fn doorbells(&self) -> u64 {
        self.rung.load(Ordering::Relaxed)
    }

    fn ring(&self) {
        self.rung.fetch_add(1, Ordering::Relaxed);
        if let Err(e) = self.doorbell.write(1) {
            tracing::warn!("cannot ring the scheduler's doorbell: {e}");
        }
    }

    /// Takes one grant for `r` if one is available.
    fn try_take(&self, r: Resource) -> bool {
        let granted = self.page.granted(r);
        let taken = &self.taken[index(r)];
        loop {
            let g = granted.load(Ordering::Acquire);
            let t = taken.load(Ordering::Acquire);
            if (g.wrapping_sub(t) as i32) <= 0 {
                return false;
            }
            if taken
                .compare_exchange(t, t.wrapping_add(1), Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                return true;
            }
        }
    }

    /// Starts a request under the lease if one is open: `Some(quiet)`, quiet when the
    /// lease was the lone holder's at the start (no doorbell needed), or None.
    fn start_leased(&self, r: Resource) -> Option<bool> {
        let word = self.page.lease(r);
        let mut w = word.load(Ordering::Acquire);
        while w & LEASE_OPEN != 0 {
            // The count never reaches the quiet bit (2^62 starts), so adding one keeps
            // both bits as they were.
            match word.compare_exchange_weak(
                w,
                w.wrapping_add(1) | LEASE_OPEN,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return Some(w & LEASE_QUIET != 0),
                Err(cur) => w = cur,
            }
        }
        None
    }

    /// Whether a completion just pushed can go without a doorbell: the daemon said the
    /// holder is alone (it reads the page at its own wake-ups), and the ring did not just
    /// reach half full (then one doorbell, and one more each [`QUIET_RE_RING`] completions
    /// after while the daemon has not emptied it, so it never fills between two reads and
    /// the daemon is rung a few times per ring, not once per completion while it wakes).
    fn quiet_completion(&self, r: Resource) -> bool {
        // Pairs with the daemon's fence between clearing the quiet bit and reading the
        // ring: either it sees this completion, or this sees the bit cleared and rings.
        std::sync::atomic::fence(Ordering::SeqCst);
        if self.page.lease(r).load(Ordering::Relaxed) & LEASE_QUIET == 0 {
            return false;
        }
        let half = u64::from(SLOTS / 2);
        let queued = self.page.queued();
        queued < half || (queued - half) % QUIET_RE_RING != 0
    }

    /// Waits for a grant; false if the channel was retired first.
    fn wait_grant(&self, r: Resource) -> bool {
        let asked = Instant::now();
        let mut spin_until = asked + SPIN;
        let mut warned = false;
        loop {
            if self.try_take(r) {
                return true;
            }
            if self.retired.load(Ordering::Acquire) {
                return false;
            }
            if Instant::now() < spin_until {
                std::hint::spin_loop();
                continue;
            }
            let g = self.page.granted(r).load(Ordering::Acquire);
            if self.try_take(r) {
                return true;
            }
            if futex::wait(self.page.granted(r), g, Duration::from_millis(100)) {
                // Woken: a grant, or the daemon saying one is about to come.
                spin_until = Instant::now() + HANDOVER_SPIN;
            }
            if !warned && asked.elapsed() > SLOW {
                tracing::warn!(?r, "no grant from the scheduler for 10 s; is vgpud alive?");
                warned = true;
            }
        }
    }

    fn complete(&self, r: Resource, started: Nanos) {
        self.page.ends_at(r).store(0, Ordering::Relaxed);
        let c = Completion {
            resource: index(r) as u32,
            _pad: 0,
            started,
            finished: time::now(),
        };
        while !self.page.push(c) {
            // The daemon is behind by thousands of completions: give it time.
            self.ring();
            std::thread::sleep(Duration::from_micros(50));
        }
        if !self.quiet_completion(r) {
            self.ring();
        }
    }
}

impl GrantClient {
    /// Waits for leave to start a request on `resource` (under the open lease, or by a
    /// grant); the start time, or None if the channel was retired meanwhile.
    /// `expect_ns` (0: unknown) is how long the request should run: its end goes on the
    /// page for the daemon (`Page::ends_at`).
    fn begin(&self, resource: Resource, expect_ns: Nanos) -> Option<Nanos> {
        if let Some(quiet) = self.start_leased(resource) {
            let started = time::now();
            self.page
                .ends_at(resource)
                .store(ends_at(started, expect_ns), Ordering::Relaxed);
            if !quiet {
                self.ring();
            }
            return Some(started);
        }
        self.page.submitted(resource).fetch_add(1, Ordering::SeqCst);
        self.ring();
        if !self.wait_grant(resource) {
            return None;
        }
        let started = time::now();
        self.page
            .ends_at(resource)
            .store(ends_at(started, expect_ns), Ordering::Release);
        if expect_ns > 0 && self.page.polls().load(Ordering::Relaxed) != 0 {
            // It was granted, so others may wait: a daemon that polls around end
            // estimates learns this one now, not at the next event, and can be ready.
            self.ring();
        }
        Some(started)
    }
}

/// The end estimate of a request started at `started` expected to run `expect_ns` (0:
/// none).
fn ends_at(started: Nanos, expect_ns: Nanos) -> Nanos {
    if expect_ns == 0 {
        0
    } else {
        started.saturating_add(expect_ns)
    }
}

impl Gate for GrantClient {
    fn acquire(&self, resource: Resource) -> Permit<'_> {
        self.acquire_for(resource, 0)
    }

    fn acquire_for(&self, resource: Resource, expect_ns: Nanos) -> Permit<'_> {
        // A plain client is never retired (only a SwitchGate retires its old ones).
        let started = self.begin(resource, expect_ns).unwrap_or_else(time::now);
        Permit {
            client: Some(Holder::Ref(self)),
            resource,
            started,
        }
    }
}

/// A gate whose grant channel can be replaced (the vGPU moved to another GPU's
/// scheduler). Each permit keeps the channel it was granted on, so a switch while requests
/// run reports their completions where they started.
pub struct SwitchGate {
    current: std::sync::RwLock<std::sync::Arc<GrantClient>>,
    /// The worker is stopping: nobody will grant any more.
    closed: std::sync::atomic::AtomicBool,
}

impl SwitchGate {
    /// Starts on `client`.
    pub fn new(client: GrantClient) -> Self {
        Self {
            current: std::sync::RwLock::new(std::sync::Arc::new(client)),
            closed: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// The worker is stopping (vgpud told it to, or vgpud is gone and with it the
    /// scheduler): requests waiting for a grant, and any after them, run ungated, so the
    /// queues drain and the worker can exit instead of waiting for grants that never come.
    pub fn close(&self) {
        self.closed.store(true, Ordering::Release);
        let c = vgpu_sync::read(&self.current).clone();
        c.retired.store(true, Ordering::Release);
        for r in [Resource::Compute, Resource::Copy] {
            futex::wake_all(c.page.granted(r));
        }
    }

    /// Uses `client` for every request from now on; requests still waiting for a grant
    /// on the old channel move over (its scheduler is about to let the vGPU go).
    pub fn switch(&self, client: GrantClient) {
        let old = std::mem::replace(
            &mut *vgpu_sync::write(&self.current),
            std::sync::Arc::new(client),
        );
        old.retired.store(true, Ordering::Release);
        // Its waiters move over now, not at their next futex timeout.
        for r in [Resource::Compute, Resource::Copy] {
            futex::wake_all(old.page.granted(r));
        }
    }
}

impl SwitchGate {
    /// Scheduled again after a [`SwitchGate::close`] (a new vgpud attached the vGPU to its
    /// scheduler): `client` is the new grant channel; requests from now on wait for it.
    pub fn reopen(&self, client: GrantClient) {
        self.switch(client);
        self.closed.store(false, Ordering::Release);
    }
}

impl Gate for SwitchGate {
    fn acquire(&self, resource: Resource) -> Permit<'_> {
        self.acquire_for(resource, 0)
    }

    fn acquire_for(&self, resource: Resource, expect_ns: Nanos) -> Permit<'_> {
        loop {
            if self.closed.load(Ordering::Acquire) {
                return Permit::ungated(resource);
            }
            let c = vgpu_sync::read(&self.current).clone();
            if let Some(started) = c.begin(resource, expect_ns) {
                return Permit {
                    client: Some(Holder::Shared(c)),
                    resource,
                    started,
                };
            }
        }
    }
}

enum Holder<'a> {
    Ref(&'a GrantClient),
    Shared(std::sync::Arc<GrantClient>),
}

impl Holder<'_> {
    fn get(&self) -> &GrantClient {
        match self {
            Holder::Ref(c) => c,
            Holder::Shared(c) => c,
        }
    }
}

/// Leave to run one request; dropping it reports the completion.
pub struct Permit<'a> {
    client: Option<Holder<'a>>,
    resource: Resource,
    started: Nanos,
}

impl Permit<'_> {
    /// A permit nobody accounts (an ungated worker).
    pub fn ungated(resource: Resource) -> Self {
        Self {
            client: None,
            resource,
            started: time::now(),
        }
    }

    /// When the request was allowed to start.
    pub fn started(&self) -> Nanos {
        self.started
    }
}

impl Drop for Permit<'_> {
    fn drop(&mut self) {
        if let Some(c) = &self.client {
            c.get().complete(self.resource, self.started);
        }
    }
}
