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
//! idle core has to be woken, then the guest entered again). The payload runtime keeps
//! that off a closed loop's path: it learns how long its waits last and asks to idle only
//! until shortly before a wait's expected end, then spins in the guest through it
//! (`guests/runtime/src/wait.rs`). Here an idle request is a plain sleep with an interrupt
//! to end it.

use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use vmm_sys_util::eventfd::EventFd;

/// The VM's idle wake-up: see the module documentation.
pub struct IdleWake {
    generation: AtomicU64,
    wake: EventFd,
    /// The devices' call eventfds (clones), polled by idling vCPUs.
    calls: Vec<EventFd>,
}

impl IdleWake {
    /// A wake-up that also watches the devices' call eventfds `calls`.
    pub fn new(calls: Vec<EventFd>) -> std::io::Result<Self> {
        Ok(Self {
            generation: AtomicU64::new(0),
            wake: EventFd::new(libc::EFD_NONBLOCK)?,
            calls,
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
