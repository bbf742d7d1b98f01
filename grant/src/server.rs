//! The daemon's side: one thread per GPU running its scheduler over every attached
//! worker's grant page.

use std::collections::BTreeMap;
use std::os::fd::{AsRawFd, OwnedFd};
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use vgpu_scheduler::gpu::{GpuScheduler, PolicyKind, QueueMode, Resource, ResourceGrant};
use vgpu_scheduler::{Config, Nanos, Share, VgpuId};
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::EventFd;
use vmm_sys_util::timerfd::TimerFd;

use crate::audit::{Books, Violation, MAX_IN_FLIGHT, MAX_VIOLATIONS};
use crate::shm::{resource, Page, LEASE_COUNT, LEASE_OPEN, LEASE_QUIET};
use crate::{futex, time, GrantError};

mod watch;
use watch::{catch_up, handover, next_watch, update_quiet};
const CONTROL: u64 = u64::MAX;
const TIMER: u64 = u64::MAX - 1;

/// Which policy and parameters a GPU runs.
#[derive(Clone, Copy, Debug)]
pub struct ServerConfig {
    pub policy: PolicyKind,
    pub mode: QueueMode,
    pub sched: Config,
    /// Poll for a holder's completion around its announced end while others wait (see
    /// `HANDOVER_EARLY`). It spins the GPU's thread and the next waiter for up to a few
    /// hundred µs per hand-over, which pays only where a core is free for them: on by
    /// default with 4 or more CPUs; `VGPU_HANDOVER_POLL=1` or `0` in vgpud's environment
    /// overrides.
    pub handover_poll: bool,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            policy: PolicyKind::Band,
            mode: QueueMode::Mrq,
            sched: Config::default(),
            handover_poll: default_handover_poll(),
        }
    }
}

fn default_handover_poll() -> bool {
    match std::env::var("VGPU_HANDOVER_POLL").as_deref() {
        Ok("1") => true,
        Ok("0") => false,
        _ => std::thread::available_parallelism().is_ok_and(|n| n.get() >= 4),
    }
}

/// What a worker needs to join: the grant page and the doorbell, to be inherited.
pub struct WorkerFds {
    pub page: OwnedFd,
    pub doorbell: OwnedFd,
}

/// A vGPU's use of the GPU as the scheduler accounted it.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct VgpuUsage {
    /// Utilization over the last period, 0..=1.
    pub compute_util: f64,
    pub copy_util: f64,
    /// Busy time since attach.
    pub compute_busy_ns: Nanos,
    pub copy_busy_ns: Nanos,
    /// Time since attach during which it had requests waiting for a grant (queue wait,
    /// the part of its demand the GPU could not serve).
    pub compute_wait_ns: Nanos,
    pub copy_wait_ns: Nanos,
    /// Times its work ran past its kernel deadline and the scheduler took the resource
    /// back.
    pub compute_overruns: u64,
    pub copy_overruns: u64,
    /// Completions its worker reported that the daemon did not believe.
    pub violations: u32,
}

struct Worker {
    page: Page,
    doorbell: EventFd,
    seen: [u64; 2],
    /// Lease starts accounted so far (the lease word's count).
    seen_leased: [u64; 2],
    /// Requests announced and not granted yet, per resource.
    pending: [u64; 2],
    /// Time with at least one request pending, per resource, up to `settled`.
    wait_ns: [Nanos; 2],
    settled: Nanos,
    /// Requests granted or leased and not completed, per resource: what a completion
    /// must match.
    books: [Books; 2],
    /// Completions not believed so far.
    violations: u32,
    /// Requests granted or started under a lease so far, per resource.
    starts: [u64; 2],
    /// `starts` at the last poll for a hand-over (see `handover`): one poll per request
    /// started, whatever the worker writes as its end estimate.
    polled: [u64; 2],
    /// Resources on which this thread set the lease's quiet bit (see `LEASE_QUIET`): the
    /// worker rings for none of its lease starts and completions there, so its page is
    /// read at every wake-up (`catch_up`).
    quiet: [bool; 2],
}

impl Worker {
    /// Accounts the time since the last event to the wait totals of the resources that had
    /// requests pending (two additions per event: the only cost of queue-wait monitoring).
    fn settle(&mut self, now: Nanos) {
        self.wait_ns = self.waited(now);
        self.settled = self.settled.max(now);
    }

    /// Wait totals as of `now`.
    fn waited(&self, now: Nanos) -> [Nanos; 2] {
        let dt = now.saturating_sub(self.settled);
        let mut w = self.wait_ns;
        for (w, &p) in w.iter_mut().zip(&self.pending) {
            if p > 0 {
                *w = w.saturating_add(dt);
            }
        }
        w
    }
}

fn resource_index(r: Resource) -> usize {
    match r {
        Resource::Compute => 0,
        Resource::Copy => 1,
    }
}

struct State {
    sched: GpuScheduler,
    workers: BTreeMap<VgpuId, Worker>,
    /// Workers detached for what they wrote on their page, and why.
    expelled: BTreeMap<VgpuId, String>,
}

struct Shared {
    state: Mutex<State>,
    handover_poll: bool,
    epoll: Epoll,
    control: EventFd,
    timer: Mutex<TimerFd>,
    stop: AtomicBool,
    /// Why the scheduler thread ended before it was asked to (a panic, `epoll` failing).
    ended: Mutex<Option<String>>,
    /// Makes the thread panic at its next wake-up (how a test stands in for a bug).
    #[cfg(test)]
    panic_next: AtomicBool,
}

/// Changes of hands of one GPU's engines.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Handovers {
    pub compute: u64,
    pub copy: u64,
}

/// One GPU's scheduler thread and its workers' channels.
pub struct GrantServer {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

/// `m` locked, also after a thread panicked holding it (the scheduler thread's end is
/// recorded and reported, not propagated).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl GrantServer {
    /// Starts the GPU's scheduler thread.
    pub fn start(config: ServerConfig, name: &str) -> Result<Self, GrantError> {
        let epoll = Epoll::new().map_err(GrantError::os("epoll_create"))?;
        let control = EventFd::new(libc::EFD_NONBLOCK).map_err(GrantError::os("eventfd"))?;
        let timer = TimerFd::new().map_err(|e| GrantError::Os {
            what: "timerfd_create",
            source: std::io::Error::from_raw_os_error(e.errno()),
        })?;
        epoll
            .ctl(
                ControlOperation::Add,
                control.as_raw_fd(),
                EpollEvent::new(EventSet::IN, CONTROL),
            )
            .map_err(GrantError::os("epoll_ctl"))?;
        epoll
            .ctl(
                ControlOperation::Add,
                timer.as_raw_fd(),
                EpollEvent::new(EventSet::IN, TIMER),
            )
            .map_err(GrantError::os("epoll_ctl"))?;
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                sched: GpuScheduler::new(config.policy, config.mode, config.sched),
                workers: BTreeMap::new(),
                expelled: BTreeMap::new(),
            }),
            epoll,
            control,
            timer: Mutex::new(timer),
            stop: AtomicBool::new(false),
            ended: Mutex::new(None),
            #[cfg(test)]
            panic_next: AtomicBool::new(false),
            handover_poll: config.handover_poll,
        });
        let s = shared.clone();
        let gpu = name.to_owned();
        let thread = std::thread::Builder::new()
            .name(format!("sched-{name}"))
            .spawn(move || {
                let why = match std::panic::catch_unwind(AssertUnwindSafe(|| run(&s))) {
                    Ok(None) => return,
                    Ok(Some(why)) => why,
                    Err(payload) => format!("it panicked: {}", panic_message(payload.as_ref())),
                };
                tracing::error!(
                    gpu,
                    "the scheduler thread stopped: {why}; nothing on this GPU is granted any \
                     more and no vGPU can attach to it until vgpud restarts"
                );
                *lock(&s.ended) = Some(why);
            })
            .map_err(GrantError::os("spawning the scheduler thread"))?;
        Ok(Self {
            shared,
            thread: Some(thread),
        })
    }

    /// Attaches a vGPU: its shares join the scheduler, and the returned descriptors go to
    /// its worker.
    pub fn attach(
        &self,
        vgpu: VgpuId,
        compute: Share,
        copy: Share,
    ) -> Result<WorkerFds, GrantError> {
        if let Some(why) = self.ended() {
            return Err(GrantError::Stopped(why));
        }
        let page = Page::create()?;
        page.polls()
            .store(u32::from(self.shared.handover_poll), Ordering::Release);
        let doorbell = EventFd::new(libc::EFD_NONBLOCK | libc::EFD_CLOEXEC)
            .map_err(GrantError::os("eventfd"))?;
        let fds = WorkerFds {
            page: page
                .file()
                .try_clone()
                .map_err(GrantError::os("dup of the grant page"))?
                .into(),
            doorbell: dup(&doorbell).map_err(GrantError::os("dup of the doorbell"))?,
        };
        let mut st = lock(&self.shared.state);
        st.sched.add(vgpu, compute, copy, time::now())?;
        st.expelled.remove(&vgpu);
        if let Err(e) = self.shared.epoll.ctl(
            ControlOperation::Add,
            doorbell.as_raw_fd(),
            EpollEvent::new(EventSet::IN, u64::from(vgpu)),
        ) {
            st.sched.remove(vgpu, time::now());
            return Err(GrantError::Os {
                what: "epoll_ctl",
                source: e,
            });
        }
        st.workers.insert(
            vgpu,
            Worker {
                page,
                doorbell,
                seen: [0, 0],
                seen_leased: [0, 0],
                pending: [0, 0],
                wait_ns: [0, 0],
                settled: time::now(),
                books: [Books::new(time::now()), Books::new(time::now())],
                violations: 0,
                starts: [0, 0],
                polled: [0, 0],
                quiet: [false, false],
            },
        );
        Ok(fds)
    }

    /// Sets vGPU `vgpu`'s kernel deadline (see `vgpu_scheduler::Config::deadline`; zero
    /// restores the GPU's default): work of it that runs this long without a completion
    /// loses the GPU to its neighbours and is charged as it runs.
    pub fn set_kernel_deadline(&self, vgpu: VgpuId, deadline: Duration) -> Result<(), GrantError> {
        let mut st = lock(&self.shared.state);
        if !st.workers.contains_key(&vgpu) {
            return Err(GrantError::NotAttached(vgpu));
        }
        let ns = deadline.as_nanos().min(u128::from(Nanos::MAX)) as Nanos;
        st.sched.set_deadline(vgpu, ns)?;
        // The holder's deadline may now come sooner than the armed timer.
        let _ = self.shared.control.write(1);
        Ok(())
    }

    /// Why this GPU's scheduler thread ended before it was asked to, if it did: from then
    /// on nothing is granted and [`GrantServer::attach`] refuses.
    pub fn ended(&self) -> Option<String> {
        lock(&self.shared.ended).clone()
    }

    /// Why the daemon detached vGPU `vgpu`'s worker from the grant path (what it wrote on
    /// its page could not be true), if it did; cleared when the vGPU attaches again.
    pub fn expelled(&self, vgpu: VgpuId) -> Option<String> {
        lock(&self.shared.state).expelled.get(&vgpu).cloned()
    }

    /// Detaches a vGPU (its worker exited): whatever it held passes on.
    pub fn detach(&self, vgpu: VgpuId) {
        let mut st = lock(&self.shared.state);
        detach_locked(&self.shared, &mut st, vgpu);
    }

    pub fn set_shares(&self, vgpu: VgpuId, compute: Share, copy: Share) -> Result<(), GrantError> {
        let mut st = lock(&self.shared.state);
        if !st.workers.contains_key(&vgpu) {
            return Err(GrantError::NotAttached(vgpu));
        }
        st.sched.set_shares(vgpu, compute, copy)?;
        Ok(())
    }

    /// The vGPU's accounted use.
    pub fn usage(&self, vgpu: VgpuId) -> Option<VgpuUsage> {
        let mut st = lock(&self.shared.state);
        let now = time::now();
        // A lone holder's work since the thread's last wake-up is on its page only. Read
        // here, it may move the scheduler's next deadline: the thread looks again.
        if catch_up(&self.shared, &mut st, now) {
            let _ = self.shared.control.write(1);
        }
        let w = st.workers.get(&vgpu)?;
        let waited = w.waited(now);
        Some(VgpuUsage {
            compute_util: st
                .sched
                .utilization(vgpu, Resource::Compute, now)
                .unwrap_or(0.0),
            copy_util: st
                .sched
                .utilization(vgpu, Resource::Copy, now)
                .unwrap_or(0.0),
            compute_busy_ns: st.sched.busy_total(vgpu, Resource::Compute).unwrap_or(0),
            copy_busy_ns: st.sched.busy_total(vgpu, Resource::Copy).unwrap_or(0),
            compute_wait_ns: waited[0],
            copy_wait_ns: waited[1],
            compute_overruns: st.sched.overruns(vgpu, Resource::Compute).unwrap_or(0),
            copy_overruns: st.sched.overruns(vgpu, Resource::Copy).unwrap_or(0),
            violations: w.violations,
        })
    }

    pub fn policy_name(&self) -> &'static str {
        lock(&self.shared.state).sched.policy_name()
    }

    /// How many times each engine (compute, copy) went from one vGPU to another since the
    /// server started ([`GpuScheduler::handovers`]).
    pub fn handovers(&self) -> Handovers {
        let st = lock(&self.shared.state);
        Handovers {
            compute: st.sched.handovers(Resource::Compute),
            copy: st.sched.handovers(Resource::Copy),
        }
    }
}

impl Drop for GrantServer {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        let _ = self.shared.control.write(1);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn dup(fd: &impl AsRawFd) -> std::io::Result<OwnedFd> {
    // SAFETY: the descriptor is open for the duration of this call (borrowed from `fd`).
    unsafe { std::os::fd::BorrowedFd::borrow_raw(fd.as_raw_fd()) }.try_clone_to_owned()
}

fn detach_locked(shared: &Shared, st: &mut State, vgpu: VgpuId) {
    if let Some(w) = st.workers.remove(&vgpu) {
        let _ = shared.epoll.ctl(
            ControlOperation::Delete,
            w.doorbell.as_raw_fd(),
            EpollEvent::default(),
        );
    }
    let grants = st.sched.remove(vgpu, time::now());
    apply(st, grants);
}

fn apply(st: &mut State, grants: Vec<ResourceGrant>) {
    let now = time::now();
    for g in grants {
        if let Some(w) = st.workers.get_mut(&g.grant.vgpu) {
            let i = resource_index(g.resource);
            // Recorded before the word moves: the worker cannot start before `now`.
            w.books[i].granted(u64::from(g.grant.count), now);
            w.starts[i] = w.starts[i].wrapping_add(u64::from(g.grant.count));
            let word = w.page.granted(g.resource);
            word.fetch_add(g.grant.count, Ordering::Release);
            futex::wake_all(word);
            w.settle(now);
            w.pending[i] = w.pending[i].saturating_sub(u64::from(g.grant.count));
        }
    }
    // Open the holders' leases (closing is `close_leases`' job, before any release).
    for (&vgpu, w) in &st.workers {
        for r in [Resource::Compute, Resource::Copy] {
            if st.sched.lease(vgpu, r, now).is_some() {
                w.page.lease(r).fetch_or(LEASE_OPEN, Ordering::AcqRel);
            }
        }
    }
}

/// Closes every lease the scheduler no longer grants, before the scheduler may hand the
/// resource on: clearing the open bit returns the exact number of requests the worker
/// started under it, which the scheduler then counts as running.
fn close_leases(st: &mut State, now: Nanos) {
    let State { sched, workers, .. } = st;
    for (&vgpu, w) in workers.iter_mut() {
        for (i, r) in [Resource::Compute, Resource::Copy].into_iter().enumerate() {
            let word = w.page.lease(r);
            if word.load(Ordering::Acquire) & LEASE_OPEN == 0 || sched.lease(vgpu, r, now).is_some()
            {
                continue;
            }
            let count = word.fetch_and(!(LEASE_OPEN | LEASE_QUIET), Ordering::AcqRel) & LEASE_COUNT;
            w.quiet[i] = false;
            // Not capped: a worker with short requests can start a whole ring's worth
            // and then some between two reads, and every one of them will complete (one
            // left out of the books reads as a completion nobody granted). An impossible
            // count gets the worker expelled at its next service, where the counts are
            // checked against what ended.
            let delta = count.wrapping_sub(w.seen_leased[i]);
            w.seen_leased[i] = count;
            w.books[i].leased(delta, now);
            w.starts[i] = w.starts[i].wrapping_add(delta);
            if delta > 0 {
                if let Err(e) = sched.start_leased(vgpu, r, delta as u32, now) {
                    tracing::debug!(vgpu, "lease close: {e}");
                }
            }
        }
    }
}

/// Reads what a worker announced; `Err` when its page is corrupt or its claims are
/// impossible often enough that it cannot be trusted.
fn service(st: &mut State, vgpu: VgpuId, now: Nanos) -> Result<(), GrantError> {
    let mut grants = Vec::new();
    let Some(w) = st.workers.get_mut(&vgpu) else {
        return Ok(());
    };
    let _ = w.doorbell.read();
    // The ring first: the worker counts a request (submit or lease start) before it can
    // push its completion, so every completion read here has its start in the counters
    // read next.
    let mut completions = Vec::new();
    while let Some(c) = w.page.pop()? {
        completions.push(c);
    }
    let read_at = time::now();
    // What the ring says ended, per resource: those requests are counted below (their
    // starts are in the counters) but no longer in flight. A worker whose requests are
    // short starts and completes thousands under one lease between two reads of its
    // page; without this they would read as that many in flight at once and get a
    // well-behaved worker expelled. Completions pushed since the ring was read are not
    // in flight either: the checks below also leave out what the ring holds when the
    // counters are read (at most its size, so a worker's claims stay bounded).
    let mut ended = [0u64; 2];
    for c in &completions {
        if let Some(r) = resource(c.resource) {
            ended[resource_index(r)] += 1;
        }
    }
    let mut submits = [0u64; 2];
    for (i, r) in [Resource::Compute, Resource::Copy].into_iter().enumerate() {
        let cur = w.page.submitted(r).load(Ordering::Acquire);
        let delta = cur.wrapping_sub(w.seen[i]);
        // More than a guest can have in flight: the counter is not a real one.
        let in_flight = delta
            .saturating_add(w.pending[i])
            .saturating_add(w.books[i].open())
            .saturating_sub(ended[i])
            .saturating_sub(w.page.queued());
        if in_flight > MAX_IN_FLIGHT {
            return Err(GrantError::Untrusted(format!(
                "{in_flight} requests in flight on {r:?}, more than the {MAX_IN_FLIGHT} a guest can have"
            )));
        }
        w.seen[i] = cur;
        submits[i] = delta;
    }
    w.settle(now);
    for (p, n) in w.pending.iter_mut().zip(submits) {
        *p = p.saturating_add(n);
    }
    let mut leased = [0u64; 2];
    for (i, r) in [Resource::Compute, Resource::Copy].into_iter().enumerate() {
        let count = w.page.lease(r).load(Ordering::Acquire) & LEASE_COUNT;
        let delta = count.wrapping_sub(w.seen_leased[i]);
        if delta
            .saturating_add(w.books[i].open())
            .saturating_sub(ended[i])
            .saturating_sub(w.page.queued())
            > MAX_IN_FLIGHT
        {
            return Err(GrantError::Untrusted(format!(
                "{delta} requests started under its lease on {r:?}, more than the {MAX_IN_FLIGHT} a guest can have"
            )));
        }
        w.seen_leased[i] = count;
        w.books[i].leased(delta, now);
        w.starts[i] = w.starts[i].wrapping_add(delta);
        leased[i] = delta;
    }
    // Each completion must match a request granted or leased, inside its window.
    let mut believed = Vec::with_capacity(completions.len());
    for c in &completions {
        let (interval, violation) = match resource(c.resource) {
            Some(r) => {
                let (iv, v) = w.books[resource_index(r)].complete(c, read_at);
                (iv.map(|iv| (r, iv)), v)
            }
            None => (None, Some(Violation::NoSuchResource(c.resource))),
        };
        if let Some(v) = violation {
            w.violations = w.violations.saturating_add(1);
            tracing::warn!(
                vgpu,
                violations = w.violations,
                "worker's grant page: {v}; not believed"
            );
            if w.violations > MAX_VIOLATIONS {
                return Err(GrantError::Untrusted(format!(
                    "{} completions that cannot be true (the last: {v})",
                    w.violations
                )));
            }
        }
        believed.extend(interval);
    }
    // The intervals (the worker's where believed, the daemon's otherwise) in the order
    // they ended, shifted together so that the last ends now: the scheduler's clock only
    // moves forward. Each keeps its place beside the others, so requests that ran one
    // after another (a quiet holder's since the last read) are charged one after another,
    // and requests that ran side by side (several queues) once for the time they overlap.
    believed.sort_by_key(|&(_, (_, finished))| finished);
    let last = believed.last().map_or(now, |&(_, (_, finished))| finished);
    let at = |t: Nanos| now.saturating_sub(last.saturating_sub(t));
    for (i, r) in [Resource::Compute, Resource::Copy].into_iter().enumerate() {
        if leased[i] > 0 {
            // As early as the first of them that already ended began (they started
            // before their completions), now when none ended.
            let first = believed
                .iter()
                .filter(|&&(cr, _)| cr == r)
                .map(|&(_, (started, _))| at(started))
                .min()
                .unwrap_or(now);
            st.sched.start_leased(vgpu, r, leased[i] as u32, first)?;
        }
    }
    // Completions before new submits, so the resource can change hands between a
    // worker's requests (Gdev's on_completion runs before the next on_arrival); requests
    // started under a lease were counted above, before their completions.
    for (r, (started, finished)) in believed {
        match st
            .sched
            .complete(vgpu, r, at(started).min(at(finished)), at(finished))
        {
            Ok(g) => grants.extend(g),
            Err(e) => tracing::debug!(vgpu, "ignored completion: {e}"),
        }
    }
    for (i, r) in [Resource::Compute, Resource::Copy].into_iter().enumerate() {
        for _ in 0..submits[i] {
            grants.extend(st.sched.submit(vgpu, r, now)?);
        }
    }
    apply(st, grants);
    Ok(())
}

/// [`service`], detaching the worker when its page cannot be trusted.
fn serve_or_expel(shared: &Shared, st: &mut State, vgpu: VgpuId, now: Nanos) {
    if let Err(e) = service(st, vgpu, now) {
        tracing::error!(
            vgpu,
            "worker's grant page cannot be trusted ({e}); detaching it"
        );
        detach_locked(shared, st, vgpu);
        st.expelled.insert(vgpu, e.to_string());
    }
}

fn arm_timer(shared: &Shared, st: &State, now: Nanos, handover: Option<Nanos>) {
    let next = match (st.sched.next_deadline(), handover) {
        (Some(d), Some(h)) => Some(d.min(h)),
        (d, h) => d.or(h),
    };
    if let Some(deadline) = next {
        let d = Duration::from_nanos(deadline.saturating_sub(now).max(1_000));
        let mut t = lock(&shared.timer);
        if let Err(e) = t.reset(d, None) {
            tracing::warn!("cannot arm the scheduler timer: {e}");
        }
    }
}

/// The text of a panic's payload.
fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_owned())
}

/// The scheduler thread's loop; returns `None` when asked to stop, or why it could not go
/// on.
fn run(shared: &Shared) -> Option<String> {
    let mut events = vec![EpollEvent::default(); 64];
    loop {
        let n = match shared.epoll.wait(-1, &mut events) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Some(format!("epoll_wait failed: {e}")),
        };
        if shared.stop.load(Ordering::SeqCst) {
            return None;
        }
        #[cfg(test)]
        if shared.panic_next.load(Ordering::SeqCst) {
            panic!("a bug in the scheduler");
        }
        // The time is read under the lock: the daemon's threads move the scheduler's clock
        // too (attach, detach), and work is booked up to this time.
        let mut st = lock(&shared.state);
        let now = time::now();
        catch_up(shared, &mut st, now);
        close_leases(&mut st, now);
        for ev in &events[..n] {
            match ev.data() {
                CONTROL => {
                    let _ = shared.control.read();
                }
                TIMER => {
                    let _ = lock(&shared.timer).wait();
                }
                id => {
                    let Ok(vgpu) = VgpuId::try_from(id) else {
                        continue;
                    };
                    serve_or_expel(shared, &mut st, vgpu, now);
                }
            }
        }
        let grants = st.sched.tick(now);
        // A holder that overran its deadline lost its lease in `tick`: close it before
        // anyone else is granted.
        close_leases(&mut st, now);
        apply(&mut st, grants);
        update_quiet(shared, &mut st, now);
        let mut ahead = handover(shared, &mut st);
        if ahead.is_none() {
            ahead = handover(shared, &mut st);
        }
        let now = time::now();
        let ahead = match (ahead, next_watch(&st, now)) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        arm_timer(shared, &st, now, ahead);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scheduler_thread_that_dies_says_why_and_attach_refuses() {
        let server = GrantServer::start(ServerConfig::default(), "test").unwrap();
        let share = Share::new(0.5);
        server.attach(1, share, share).unwrap();
        assert_eq!(server.ended(), None);
        server.shared.panic_next.store(true, Ordering::SeqCst);
        let _ = server.shared.control.write(1);
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while server.ended().is_none() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        let why = server.ended().expect("the thread's end is recorded");
        assert!(why.contains("a bug in the scheduler"), "{why}");
        match server.attach(2, share, share) {
            Err(e @ GrantError::Stopped(_)) => {
                assert!(e.to_string().contains("restart vgpud"), "{e}")
            }
            Err(e) => panic!("attach after the thread died: {e}"),
            Ok(_) => panic!("attach after the thread died succeeded"),
        }
        // Dropping the server still returns (the thread is gone, not stuck).
        drop(server);
    }
}
