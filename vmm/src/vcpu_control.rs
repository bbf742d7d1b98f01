//! Pausing and resuming the vCPU threads: a pause request kicks every vCPU out of KVM_RUN,
//! each completes its last exit (KVM_RUN with `immediate_exit`), saves its own state and
//! waits; a resume lets them go on, a shutdown ends them.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use kvm_ioctls::VcpuFd;

use crate::migration::snapshot::VcpuState;
use crate::migration::vcpu_state;
use crate::signals;

/// Why the vCPUs could not be paused.
#[derive(Debug, thiserror::Error)]
pub enum PauseError {
    #[error("vCPU {0} did not reach a safe point within {1:?}")]
    Timeout(usize, Duration),
    #[error("vCPU {0} has stopped (the guest is ending); nothing to pause")]
    Gone(usize),
    #[error("cannot save vCPU {0}: {1}")]
    Save(usize, String),
    #[error("the VM is already paused")]
    AlreadyPaused,
}

#[derive(Default)]
struct Ctl {
    pause: bool,
    stop: bool,
    /// Each vCPU's state while it is paused.
    states: Vec<Option<Result<VcpuState, String>>>,
    /// vCPU threads that ended.
    gone: Vec<bool>,
    /// The threads to kick (pthread ids), once spawned.
    threads: Vec<Option<libc::pthread_t>>,
}

/// Shared by the vCPU threads and whoever pauses them.
pub struct VcpuControl {
    ctl: Mutex<Ctl>,
    /// `ctl.pause`, readable without the lock on every vCPU exit.
    pause_flag: AtomicBool,
    cv: Condvar,
    msr_indices: Vec<u32>,
}

fn lock(m: &Mutex<Ctl>) -> MutexGuard<'_, Ctl> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl VcpuControl {
    /// Control for `count` vCPUs saving the MSRs in `msr_indices`.
    pub fn new(count: usize, msr_indices: Vec<u32>) -> Self {
        Self {
            ctl: Mutex::new(Ctl {
                states: vec![None; count],
                gone: vec![false; count],
                threads: vec![None; count],
                ..Default::default()
            }),
            cv: Condvar::new(),
            pause_flag: AtomicBool::new(false),
            msr_indices,
        }
    }

    /// Records vCPU `index`'s thread so a pause can kick it.
    pub fn register_thread(&self, index: usize, thread: libc::pthread_t) {
        if let Some(t) = lock(&self.ctl).threads.get_mut(index) {
            *t = Some(thread);
        }
    }

    /// True when the vCPU thread should come to its pause point.
    pub fn pause_requested(&self) -> bool {
        self.pause_flag.load(Ordering::SeqCst)
    }

    fn set_pause(&self, c: &mut Ctl, on: bool) {
        c.pause = on;
        self.pause_flag.store(on, Ordering::SeqCst);
    }

    /// Called by vCPU `index`'s thread when it ends for good.
    pub fn exited(&self, index: usize) {
        let mut c = lock(&self.ctl);
        if let Some(g) = c.gone.get_mut(index) {
            *g = true;
        }
        self.cv.notify_all();
    }

    /// The pause point of vCPU `index`'s thread: completes the pending exit, saves the
    /// state, waits for resume (true) or shutdown (false).
    pub fn pause_point(&self, vcpu: &mut VcpuFd, index: usize, parked: bool) -> bool {
        // A port or MMIO read is completed only by the next KVM_RUN; with immediate_exit
        // KVM completes it and returns EINTR without entering the guest.
        vcpu.set_kvm_immediate_exit(1);
        match vcpu.run() {
            Err(e) if e.errno() == libc::EINTR => {}
            Err(e) => tracing::warn!(vcpu = index, "completing the last exit failed: {e}"),
            Ok(exit) => tracing::warn!(
                vcpu = index,
                "unexpected exit while completing the last one: {exit:?}"
            ),
        }
        vcpu.set_kvm_immediate_exit(0);
        let state =
            vcpu_state::save_vcpu(vcpu, &self.msr_indices, parked).map_err(|e| e.to_string());
        let mut c = lock(&self.ctl);
        if let Some(s) = c.states.get_mut(index) {
            *s = Some(state);
        }
        self.cv.notify_all();
        while c.pause && !c.stop {
            c = self.cv.wait(c).unwrap_or_else(|p| p.into_inner());
        }
        if let Some(s) = c.states.get_mut(index) {
            *s = None;
        }
        !c.stop
    }

    /// Sleeps a parked vCPU thread up to `d`, waking early for a pause or a shutdown.
    pub fn idle_wait(&self, d: Duration) {
        let c = lock(&self.ctl);
        if c.pause || c.stop {
            return;
        }
        let _ = self.cv.wait_timeout(c, d);
    }

    /// True once the VM is shutting down.
    pub fn stopping(&self) -> bool {
        lock(&self.ctl).stop
    }

    /// Pauses every vCPU and returns their states, in order. On error the vCPUs that did
    /// pause are resumed.
    pub fn pause_all(&self, timeout: Duration) -> Result<Vec<VcpuState>, PauseError> {
        let deadline = Instant::now() + timeout;
        let mut c = lock(&self.ctl);
        if c.pause {
            return Err(PauseError::AlreadyPaused);
        }
        self.set_pause(&mut c, true);
        // Parked vCPUs wait on the condition variable, not in KVM_RUN.
        self.cv.notify_all();
        let result = loop {
            if let Some(i) = c.gone.iter().position(|&g| g) {
                break Err(PauseError::Gone(i));
            }
            let waiting: Vec<usize> = (0..c.states.len())
                .filter(|&i| c.states[i].is_none())
                .collect();
            if waiting.is_empty() {
                break Ok(());
            }
            if Instant::now() >= deadline {
                break Err(PauseError::Timeout(waiting[0], timeout));
            }
            for &i in &waiting {
                if let Some(t) = c.threads[i] {
                    // SAFETY: `t` is the pthread id of a vCPU thread that has not been
                    // joined (threads are joined only after the VM stops), so it is valid;
                    // the kick signal has a no-op handler installed.
                    unsafe { libc::pthread_kill(t, signals::vcpu_kick_signal()) };
                }
            }
            c = self
                .cv
                .wait_timeout(c, Duration::from_millis(1))
                .unwrap_or_else(|p| p.into_inner())
                .0;
        };
        if let Err(e) = result {
            self.set_pause(&mut c, false);
            self.cv.notify_all();
            return Err(e);
        }
        let mut out = Vec::with_capacity(c.states.len());
        for (i, s) in c.states.iter().enumerate() {
            match s {
                Some(Ok(s)) => out.push(s.clone()),
                failed => {
                    let e = match failed {
                        Some(Err(e)) => PauseError::Save(i, e.clone()),
                        _ => PauseError::Timeout(i, timeout),
                    };
                    self.set_pause(&mut c, false);
                    self.cv.notify_all();
                    return Err(e);
                }
            }
        }
        Ok(out)
    }

    /// Lets paused vCPUs run again.
    pub fn resume_all(&self) {
        self.set_pause(&mut lock(&self.ctl), false);
        self.cv.notify_all();
    }

    /// Ends every vCPU thread waiting at its pause point or parked.
    pub fn shutdown(&self) {
        lock(&self.ctl).stop = true;
        self.cv.notify_all();
    }
}
