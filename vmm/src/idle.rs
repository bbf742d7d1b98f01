//! An idling vCPU woken by its devices: the vCPU idle port (docs/payload-abi.md) sleeps
//! the writing vCPU for the time it asks, or until one of the VM's devices raises a
//! used-buffer interrupt, whichever comes first. A ring-3 payload cannot `hlt`, so this is
//! its `hlt` with an interrupt to end it: a guest that waits for a long kernel gives its
//! host CPU back, and still sees the completion as soon as the worker writes it.
//!
//! Two paths wake a sleeping vCPU, so that neither can miss a completion:
//! - the devices' call eventfds themselves (the backend writes one when a guest that
//!   asked for an interrupt gets a completion): the vCPU thread polls them beside its own
//!   wake eventfd, without reading them (the VM's event loop reads them and raises the
//!   interrupt), which saves the event loop's hop;
//! - the generation: the event loop bumps it and writes the wake eventfd for every
//!   interrupt it raises. A vCPU notes the generation before it enters the guest; an idle
//!   request that finds it changed returns at once, as the interrupt may be for a
//!   completion the guest had not yet seen when it decided to idle.

//!
//! A vCPU thread woken from a deep sleep costs tens of microseconds on a nested host (the
//! idle core has to be woken first). On a host with cores to spare ([`IdleWake::new`]:
//! four or more), each vCPU learns how long its waits last ([`WaitClock`]: a closed-loop
//! guest waits about as long for each round's kernel) and, for a wait it expects to end
//! soon, sleeps until just before the expected end and then polls the devices' call
//! eventfds (at most [`POLL_WINDOW`]) instead of sleeping through: the completion is seen
//! within a microsecond or two, at the price of that window of one core per wait.

use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use vmm_sys_util::eventfd::EventFd;

/// How long before a wait's expected end its vCPU starts polling.
const POLL_LEAD: Duration = Duration::from_micros(20);
/// The longest a vCPU polls for one wait (from [`POLL_LEAD`] before its expected end).
pub const POLL_WINDOW: Duration = Duration::from_micros(80);

/// The VM's idle wake-up: see the module documentation.
pub struct IdleWake {
    generation: AtomicU64,
    wake: EventFd,
    /// The devices' call eventfds (clones), polled by idling vCPUs.
    calls: Vec<EventFd>,
    /// Whether vCPUs poll near a wait's expected end (the host has cores to spare).
    poll: bool,
}

impl IdleWake {
    /// A wake-up that also watches the devices' call eventfds `calls`; vCPUs poll near
    /// a wait's expected end on a host with four or more CPUs.
    pub fn new(calls: Vec<EventFd>) -> std::io::Result<Self> {
        let cpus = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
        Self::with_polling(calls, cpus >= 4)
    }

    /// [`IdleWake::new`] with polling near a wait's expected end on or off.
    pub fn with_polling(calls: Vec<EventFd>, poll: bool) -> std::io::Result<Self> {
        Ok(Self {
            generation: AtomicU64::new(0),
            wake: EventFd::new(libc::EFD_NONBLOCK)?,
            calls,
            poll,
        })
    }

    /// The generation a vCPU notes before it enters the guest.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::SeqCst)
    }

    /// A device raised an interrupt: wakes every idling vCPU.
    pub fn notify(&self) {
        self.generation.fetch_add(1, Ordering::SeqCst);
        if let Err(e) = self.wake.write(1) {
            tracing::debug!("cannot wake idling vCPUs: {e}");
        }
    }

    /// Sleeps the calling vCPU thread up to `d`, or until a device interrupt after
    /// generation `since` (the one noted before the guest ran). Returns whether an
    /// interrupt ended the sleep.
    pub fn wait(&self, since: u64, d: Duration) -> bool {
        if self.generation() != since {
            return true;
        }
        self.sleep(d)
    }

    /// As [`IdleWake::wait`], for the vCPU whose waits `clock` times: when the wait is
    /// expected to end within `d`, sleeps until [`POLL_LEAD`] before that and then polls
    /// (module documentation); the clock learns from a wait an interrupt ended.
    pub fn wait_timed(&self, since: u64, d: Duration, clock: &mut WaitClock) -> bool {
        let now = Instant::now();
        let started = *clock.started.get_or_insert(now);
        if self.generation() != since {
            // An interrupt while the guest ran: the wait may be over already; it says
            // nothing of how long waits last.
            if started == now {
                clock.started = None;
            }
            return true;
        }
        let woke = {
            match clock.expected_end(started).filter(|_| self.poll) {
                // Expected to end within this sleep, and not long overdue (a wait longer
                // than usual sleeps through).
                Some(end) if end < now + d && end + POLL_WINDOW > now => {
                    let poll_from = end.checked_sub(POLL_LEAD).unwrap_or(end);
                    let deadline = now + d;
                    (poll_from > now && self.sleep(poll_from - now))
                        || self.poll_until((poll_from.max(now) + POLL_WINDOW).min(deadline), since)
                        || {
                            let left = deadline.saturating_duration_since(Instant::now());
                            !left.is_zero() && self.sleep(left)
                        }
                }
                _ => self.sleep(d),
            }
        };
        if woke {
            clock.ended(started.elapsed());
        }
        woke
    }

    /// Polls the wake-ups without sleeping until `until`; true when one came.
    fn poll_until(&self, until: Instant, since: u64) -> bool {
        let mut fds = self.pollfds();
        loop {
            if self.generation() != since || self.ppoll(&mut fds, Duration::ZERO) {
                return true;
            }
            if Instant::now() >= until {
                return false;
            }
            std::hint::spin_loop();
        }
    }

    /// Sleeps up to `d` on the wake-ups; true when one came.
    fn sleep(&self, d: Duration) -> bool {
        fine_timer_slack();
        self.ppoll(&mut self.pollfds(), d)
    }

    /// The wake eventfd and the call eventfds, for `ppoll`.
    fn pollfds(&self) -> Vec<libc::pollfd> {
        std::iter::once(self.wake.as_raw_fd())
            .chain(self.calls.iter().map(AsRawFd::as_raw_fd))
            .map(|fd: RawFd| libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            })
            .collect()
    }

    /// One `ppoll` of `fds` (from [`IdleWake::pollfds`]), up to `d`.
    fn ppoll(&self, fds: &mut [libc::pollfd], d: Duration) -> bool {
        for f in fds.iter_mut() {
            f.revents = 0;
        }
        let ts = libc::timespec {
            tv_sec: d.as_secs() as libc::time_t,
            tv_nsec: libc::c_long::from(d.subsec_nanos() as i32),
        };
        // SAFETY: `fds` is a valid array of `fds.len()` pollfds that outlives the call;
        // `ts` is a valid timespec; a NULL signal mask leaves the thread's mask alone.
        let n = unsafe {
            libc::ppoll(
                fds.as_mut_ptr(),
                fds.len() as libc::nfds_t,
                &ts,
                std::ptr::null(),
            )
        };
        if n <= 0 {
            return false;
        }
        if fds[0].revents & libc::POLLIN != 0 {
            // Drain the wake eventfd so the next sleep blocks again (EAGAIN: another vCPU
            // drained it first).
            let _ = self.wake.read();
        }
        true
    }
}

/// Sets the calling thread's timer slack to 1 µs, once per thread: an idle vCPU's sleep
/// ends when it asked (Linux's default 50 µs slack would add that to every wake-up by
/// time). Best effort: a refusal leaves the default.
fn fine_timer_slack() {
    std::thread_local! {
        static SET: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    }
    SET.with(|set| {
        if !set.replace(true) {
            // SAFETY: prctl with integer arguments; it changes only this thread's timer
            // slack.
            unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1000u64, 0u64, 0u64, 0u64) };
        }
    });
}

/// How long one vCPU's waits last: the start of the wait in progress (its first idle
/// request since an interrupt ended the last one) and the running average of the waits
/// an interrupt ended. Owned by the vCPU's thread.
#[derive(Debug, Default)]
pub struct WaitClock {
    started: Option<Instant>,
    average: Option<Duration>,
}

impl WaitClock {
    /// The expected end of a wait that started at `started`.
    fn expected_end(&self, started: Instant) -> Option<Instant> {
        self.average.map(|a| started + a)
    }

    /// A wait of `took` ended by an interrupt.
    fn ended(&mut self, took: Duration) {
        self.started = None;
        // An average over about the last four waits: a closed loop's waits repeat.
        self.average = Some(match self.average {
            Some(a) => (a * 3 + took) / 4,
            None => took,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Instant;

    #[test]
    fn an_idle_vcpu_sleeps_its_time_without_an_interrupt() {
        let w = IdleWake::new(Vec::new()).unwrap();
        let t = Instant::now();
        assert!(!w.wait(w.generation(), Duration::from_millis(20)));
        assert!(t.elapsed() >= Duration::from_millis(20));
    }

    #[test]
    fn an_interrupt_ends_the_sleep_at_once() {
        let w = Arc::new(IdleWake::new(Vec::new()).unwrap());
        let since = w.generation();
        let w2 = w.clone();
        let t = Instant::now();
        let h = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(30));
            w2.notify();
        });
        assert!(w.wait(since, Duration::from_secs(20)));
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "woken, not timed out"
        );
        h.join().unwrap();
        // Drained: the next sleep blocks again.
        let t = Instant::now();
        assert!(!w.wait(w.generation(), Duration::from_millis(10)));
        assert!(t.elapsed() >= Duration::from_millis(10));
    }

    #[test]
    fn an_interrupt_the_guest_may_not_have_seen_returns_at_once() {
        // The interrupt came after the vCPU noted the generation (while the guest ran),
        // and its wake eventfd was already drained by another vCPU: still no sleep.
        let w = IdleWake::new(Vec::new()).unwrap();
        let since = w.generation();
        w.notify();
        let _ = w.wake.read();
        let t = Instant::now();
        assert!(w.wait(since, Duration::from_secs(20)));
        assert!(t.elapsed() < Duration::from_secs(10));
    }

    #[test]
    fn a_vcpu_learns_how_long_its_waits_last_and_polls_at_their_end() {
        let w = Arc::new(IdleWake::with_polling(Vec::new(), true).unwrap());
        let mut clock = WaitClock::default();
        // Three waits of about 40 ms, each ended by an interrupt.
        for _ in 0..3 {
            let since = w.generation();
            let w2 = w.clone();
            let h = std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(40));
                w2.notify();
            });
            // The guest asks for 1 ms at a time, as a payload does, until woken.
            while !w.wait_timed(since, Duration::from_millis(1), &mut clock) {}
            h.join().unwrap();
        }
        let avg = clock.average.expect("learned");
        assert!(
            avg >= Duration::from_millis(40) && avg < Duration::from_secs(5),
            "{avg:?}"
        );
        // The next wait is expected to end after the same time: the vCPU sleeps until
        // just before, polls, and sees the interrupt.
        let since = w.generation();
        let w2 = w.clone();
        let t = Instant::now();
        let h = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(40));
            w2.notify();
        });
        while !w.wait_timed(since, Duration::from_millis(1), &mut clock) {}
        assert!(t.elapsed() >= Duration::from_millis(40));
        h.join().unwrap();
        // An interrupt already in before the vCPU idles ends the wait at once and teaches
        // the clock nothing.
        let before = clock.average;
        let since = w.generation();
        w.notify();
        assert!(w.wait_timed(since, Duration::from_secs(20), &mut clock));
        assert_eq!(clock.average, before);
    }

    #[test]
    fn the_average_follows_the_last_few_waits() {
        let mut c = WaitClock::default();
        c.ended(Duration::from_micros(1000));
        assert_eq!(c.average, Some(Duration::from_micros(1000)));
        for _ in 0..20 {
            c.ended(Duration::from_micros(200));
        }
        let a = c.average.unwrap();
        assert!(
            a < Duration::from_micros(210) && a >= Duration::from_micros(200),
            "{a:?}"
        );
        assert!(c.started.is_none());
    }

    #[test]
    fn a_device_call_wakes_the_vcpu_directly_and_is_left_for_the_event_loop() {
        let call = EventFd::new(libc::EFD_NONBLOCK).unwrap();
        let w = Arc::new(IdleWake::new(vec![call.try_clone().unwrap()]).unwrap());
        let since = w.generation();
        let t = Instant::now();
        let h = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(30));
            call.write(1).unwrap();
            call
        });
        assert!(w.wait(since, Duration::from_secs(20)));
        assert!(t.elapsed() < Duration::from_secs(10));
        let call = h.join().unwrap();
        assert_eq!(
            call.read().unwrap(),
            1,
            "the event loop still reads the call"
        );
    }
}
