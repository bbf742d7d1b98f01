//! The hard limit on a guest kernel's run time (docs/scheduler.md): the wait for a PTX
//! kernel ends, and a kernel past the limit costs the vGPU its context, not the guest its
//! answer.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::driver::Completion;
use super::CudaGpu;
use crate::error::{BackendError, Result};
use crate::sync::lock;

/// Longest a guest PTX kernel may run by default (20 s): below the guest driver's 30 s
/// request timeout, so the guest is answered, and far above the scheduler's 2 s kernel
/// deadline, past which the vGPU's neighbours run beside the kernel anyway.
pub const DEFAULT_KERNEL_LIMIT: Duration = Duration::from_secs(20);

/// The worker's exit status after a guest kernel ran past its hard limit. A GPU cannot
/// stop one kernel without its context, so the worker answers the launch with
/// `KERNEL_FAULT` naming the limit, and exits with this status a moment later: the driver
/// destroys the context (and the kernel) with the process, which frees the GPU, and vgpud
/// marks the vGPU failed for this reason. Its neighbours are untouched (their contexts
/// live in their own workers).
pub const EXIT_KERNEL_HARD_LIMIT: i32 = 75;

/// How long a kernel's wait queries its end event back to back, before it yields between
/// two queries: about a null kernel's round trip on the GPU.
const WAIT_SPIN: Duration = Duration::from_micros(20);

/// How long the worker keeps running after answering a launch that ran past its hard
/// limit: time for the answer to reach the guest before the worker exits.
const HARD_LIMIT_GRACE: Duration = Duration::from_millis(500);

impl CudaGpu {
    /// Sets the hard limit on a guest PTX kernel's run time ([`DEFAULT_KERNEL_LIMIT`]
    /// unless set; see [`EXIT_KERNEL_HARD_LIMIT`]).
    pub fn with_kernel_limit(mut self, limit: Duration) -> Self {
        self.kernel_limit = limit;
        self
    }

    /// Waits for a guest kernel that cannot have started before `t` (alone: its launch
    /// call; in a batch: when the kernel before it was seen finished), allowed `limit` from
    /// then: `end` is the kernel's stream, an event recorded after it, or a host word the
    /// stream writes after it (`signal.rs`: the first [`WAIT_SPIN`] reads only the word,
    /// with no driver call). Polls, so that the wait can end: the wait's first [`WAIT_SPIN`] spinning, up to 50 µs by yielding,
    /// then in sleeps of 0.5 % of the wait so far (10 µs to 1 ms) with the thread's timer
    /// slack at 1 µs, so that a completion is noticed within about 10 µs of a 1 ms kernel's
    /// end and 50 µs of a 10 ms one's (Linux's default 50 µs slack would add that much to
    /// every sleep). The phases count from the wait's start, not from `t`: a batch's wait
    /// starts after its kernels were queued, which takes longer than the spin for a batch
    /// of short ones, and a sleep then would notice their end up to 10 µs late.
    pub(super) fn wait_kernel_until(
        &self,
        end: &impl Completion,
        kernel: &str,
        t: Instant,
        limit: Duration,
    ) -> Result<()> {
        fine_timer_slack();
        let waiting = Instant::now();
        if spin_on_signal(end, waiting) {
            return Ok(());
        }
        loop {
            if end.finished().map_err(|e| self.kernel_err(e, kernel))? {
                return Ok(());
            }
            let ran = t.elapsed();
            if ran >= limit {
                return Err(self.past_hard_limit(kernel, ran));
            }
            let waited = waiting.elapsed();
            if waited < WAIT_SPIN {
                // A short kernel ends within microseconds: a yield (a system call) between
                // two queries would notice that up to one yield late.
                std::hint::spin_loop();
            } else if waited < Duration::from_micros(50) {
                std::thread::yield_now();
            } else {
                std::thread::sleep(
                    (waited / 200).clamp(Duration::from_micros(10), Duration::from_millis(1)),
                );
            }
        }
    }

    /// A guest kernel ran past the hard limit: the context is given up (every later
    /// request fails), and the worker exits with [`EXIT_KERNEL_HARD_LIMIT`] once the
    /// answer is on its way.
    fn past_hard_limit(&self, kernel: &str, ran: Duration) -> BackendError {
        let why = format!(
            "{kernel} ran past the hard limit of {} s on the GPU ({ran:.1?}) and cannot be \
             stopped without its context; the vGPU's GPU context is given up",
            self.kernel_limit.as_secs_f64()
        );
        if !self.lost.swap(true, Ordering::AcqRel) {
            *lock(&self.lost_why) = why.clone();
            tracing::error!(
                exit = EXIT_KERNEL_HARD_LIMIT,
                "{why}; the worker exits so that the driver frees the GPU"
            );
            std::thread::spawn(|| {
                std::thread::sleep(HARD_LIMIT_GRACE);
                // `_exit`, not `exit`: no atexit handler may wait on the GPU (the driver's
                // own teardown might wait for the kernel that never ends); the kernel
                // driver destroys the context with the process, as for a killed one.
                // SAFETY: ends the process at once; nothing of it runs after this call.
                unsafe { libc::_exit(EXIT_KERNEL_HARD_LIMIT) };
            });
        }
        BackendError::KernelFault(why)
    }
}

/// Loads of a signal word between two reads of the clock while spinning on it.
const SIGNAL_LOADS_PER_CLOCK_READ: u32 = 32;

/// Spins on `end`'s host word, when it has one, for the rest of [`WAIT_SPIN`] after
/// `waiting`: true when the word says the work finished. No driver call in between, so the
/// end is seen as soon as the GPU's write lands; a fault, which leaves the word alone, is
/// found by the caller's queries after the spin.
fn spin_on_signal(end: &impl Completion, waiting: Instant) -> bool {
    if end.signalled().is_none() {
        return false;
    }
    loop {
        for _ in 0..SIGNAL_LOADS_PER_CLOCK_READ {
            if end.signalled() == Some(true) {
                return true;
            }
            std::hint::spin_loop();
        }
        if waiting.elapsed() >= WAIT_SPIN {
            return false;
        }
    }
}

/// Sets this thread's timer slack to 1 µs, once per thread (the kernel waits' sleeps are
/// short and their lateness is GPU idle time). Best effort: a refusal leaves the default.
fn fine_timer_slack() {
    std::thread_local! {
        static SET: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    }
    SET.with(|set| {
        if !set.replace(true) {
            // SAFETY: prctl with integer arguments; it changes only this thread's timer
            // slack and touches no memory.
            let rc = unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1000, 0, 0, 0) };
            if rc != 0 {
                tracing::debug!(
                    "cannot set the timer slack: {}",
                    std::io::Error::last_os_error()
                );
            }
        }
    });
}
