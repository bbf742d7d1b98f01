//! LAUNCH: a launch is checked once when its request is read ([`check`]), then runs alone
//! or in a batch of the launches a queue posted together ([`batch`]); either way it reaches
//! the GPU through [`Vgpu::run_launches`], the one place launches take a hardware slot and
//! the GPU scheduler's grant.
//!
//! A guest that posts many launches per doorbell (the CUDA library does for launches on a
//! stream) would pay a grant, a backend call, a wait and a wake-up per kernel if each were
//! served alone. The queue thread instead takes the launches that are already available
//! one after the other ([`LaunchBatch`], bounded by [`crate::BatchLimits`]; one that failed
//! its checks joins with its error), asks the GPU's scheduler once for the whole batch,
//! hands the kernels to the backend in one
//! [`Backend::launch`](vgpu_backend::Backend::launch) and then completes every request in
//! ring order. Any other request ends the batch: a queue's requests are never reordered.

mod batch;
mod check;

use std::time::Instant;

use vgpu_backend::{BackendError, LaunchStats};
use vgpu_grant::Resource;

pub(crate) use batch::LaunchBatch;
pub(crate) use check::Checked;

use crate::device::{elapsed_ns, Outcome, Vgpu};
use crate::timeline;

/// What [`Vgpu::run_launches`] did: one result per launch, and when the grant was asked,
/// granted, the backend call ended and the grant was released (timeline clock; zeros when
/// the timeline is off).
pub(crate) struct Ran {
    pub results: Vec<vgpu_backend::Result<LaunchStats>>,
    pub stages: [u64; 4],
}

impl Vgpu {
    /// Runs checked launches in one backend call under one hardware slot (ranked by the
    /// first launch's HEFT rank) and one grant of the GPU's scheduler, asked for their
    /// usual times together; the grant's hold, the whole call, is charged to the vGPU.
    /// Records each kernel's usual time: its device time and an even part of what the call
    /// cost beyond the kernels (launch, wait, wake-up), so that a batch's estimate is the
    /// sum of its kernels'.
    pub(crate) fn run_launches(&self, launches: &[&Checked]) -> Ran {
        self.run_launches_then(launches, &mut |_| {})
    }

    /// [`Vgpu::run_launches`], calling `ended` with the backend's results as soon as the
    /// kernels were seen finished, still under the grant
    /// ([`vgpu_backend::Backend::launch_then`]).
    pub(crate) fn run_launches_then(
        &self,
        launches: &[&Checked],
        ended: &mut dyn FnMut(&[vgpu_backend::Result<LaunchStats>]),
    ) -> Ran {
        let rank = launches.first().map_or(0, |c| c.rank);
        // A batch is mostly runs of one function: its usual time is read once per run.
        let mut expect = 0u64;
        let mut last = None;
        for c in launches {
            let one = match last {
                Some((f, ns)) if f == c.function => ns,
                _ => self.kernel_times.expect(c.function),
            };
            last = Some((c.function, one));
            expect = expect.saturating_add(one);
        }
        let _slot = self.slots.as_ref().map(|s| s.acquire(rank));
        let asked = timeline::stamp();
        let permit = self.gate.acquire_for(Resource::Compute, expect);
        let granted = timeline::stamp();
        let call = Instant::now();
        let calls: Vec<_> = launches.iter().map(|c| c.launch()).collect();
        let results = self.backend.launch_then(&calls, ended);
        let wall = elapsed_ns(call);
        let backend_end = timeline::stamp();
        drop(permit);
        let stages = [asked, granted, backend_end, timeline::stamp()];
        let (ran, device_ns) = results
            .iter()
            .filter_map(|r| r.as_ref().ok())
            .fold((0u64, 0u64), |(n, t), s| {
                (n + 1, t.saturating_add(s.device_ns))
            });
        let overhead = wall.saturating_sub(device_ns) / ran.max(1);
        // Each kernel's time, recorded once per row of equal ones (one function, one time).
        let mut row: Option<(u64, u64, usize)> = None;
        for (c, r) in launches.iter().zip(&results) {
            let Ok(stats) = r else { continue };
            let ns = stats.device_ns.saturating_add(overhead);
            match &mut row {
                Some((f, t, n)) if *f == c.function && *t == ns => *n += 1,
                _ => {
                    if let Some((f, t, n)) = row.replace((c.function, ns, 1)) {
                        self.kernel_times.record_n(f, t, n);
                    }
                }
            }
        }
        if let Some((f, t, n)) = row {
            self.kernel_times.record_n(f, t, n);
        }
        self.stats.kernels_ran(ran, device_ns);
        Ran { results, stages }
    }

    /// A launch alone: a batch of one, on the request's own timeline record.
    pub(crate) fn launch_alone(&self, c: &Checked) -> Outcome {
        let Ran { results, stages } = self.run_launches(&[c]);
        timeline::note(Resource::Compute, stages);
        let stats = vgpu_backend::one_result(results)?;
        Ok([stats.device_ns, 0, 0, 0])
    }
}

/// The answer of a launch the backend answered `r` for.
fn outcome(r: Option<vgpu_backend::Result<LaunchStats>>) -> Outcome {
    let r = r.unwrap_or_else(|| {
        Err(BackendError::Device(
            "the backend answered fewer launches than it was given".into(),
        ))
    });
    Ok([r?.device_ns, 0, 0, 0])
}
