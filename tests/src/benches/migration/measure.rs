//! One migration with the guest running, and one plain copy of the same bytes.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use vgpu_backend::{BackendError, Relocatable};
use vgpu_migration::{MigrateOptions, Mode, Progress, Report};

use super::tap::Tap;
use super::vgpu::{guest, Vgpu};
use super::{Params, MIB};

pub(super) struct Run {
    pub(super) report: Report,
    /// The longest gap between two guest iterations (what the guest felt).
    pub(super) stall: Duration,
    /// Guest iterations during the run.
    pub(super) iterations: usize,
}

/// What the timeline plot needs of one migration (times since its start).
pub(super) struct Trace {
    pub(super) report: Report,
    pub(super) progress: Vec<Progress>,
    /// (time, bytes arrived so far) at the target.
    pub(super) arrived: Vec<(Duration, u64)>,
    /// (time, bytes placed so far) at the target (`alloc_at`: commit + zero).
    pub(super) placed: Vec<(Duration, u64)>,
    /// Guest iterations' ends.
    pub(super) guest: Vec<Duration>,
    pub(super) size: u64,
}

pub(super) fn migrate(
    p: Params,
    v: &mut Vgpu,
    mode: Mode,
    trace: bool,
) -> Result<(Run, Option<Trace>), String> {
    let size = v.bytes();
    let target = Tap::new(p, size + 64 * MIB);
    let opts = MigrateOptions {
        mode,
        ..MigrateOptions::default()
    };
    let stop = AtomicBool::new(false);
    let mut progress = Vec::new();
    let (m, hot, big) = (&*v.m, v.hot, &v.big);
    let (report, guest_out, start) = std::thread::scope(|s| {
        let g = s.spawn(|| guest(m, hot, big, &stop));
        // The guest runs a while first, and on the target after.
        std::thread::sleep(Duration::from_millis(30));
        let start = Instant::now();
        let r = m.migrate(target.clone(), &opts, |pr| progress.push(*pr));
        std::thread::sleep(Duration::from_millis(30));
        stop.store(true, Ordering::Relaxed);
        let out = g
            .join()
            .unwrap_or_else(|_| Err("the guest thread panicked".into()));
        (r, out, start)
    });
    let report = report.map_err(|e| format!("{mode:?} migration: {e}"))?;
    let (launches, ends) = guest_out?;
    v.launches += launches;
    let stall = ends
        .windows(2)
        .map(|w| w[1] - w[0])
        .max()
        .unwrap_or_default();
    let trace = trace.then(|| trace_since(start, report.clone(), progress, &target, &ends, size));
    // Only the vGPU holds its new GPU now (the old one is gone once unused).
    drop(target);
    Ok((
        Run {
            report,
            stall,
            iterations: ends.len(),
        },
        trace,
    ))
}

/// What the timeline plot needs of the migration that started at `start`.
fn trace_since(
    start: Instant,
    report: Report,
    progress: Vec<Progress>,
    target: &Tap,
    ends: &[Instant],
    size: u64,
) -> Trace {
    let cumulative = |log: Vec<(Instant, u64)>| {
        let mut total = 0;
        log.into_iter()
            .filter(|(t, _)| *t >= start)
            .map(|(t, n)| {
                total += n;
                (t - start, total)
            })
            .collect::<Vec<_>>()
    };
    Trace {
        report,
        progress,
        arrived: cumulative(target.log()),
        placed: cumulative(target.placed()),
        guest: ends
            .iter()
            .filter(|t| **t >= start)
            .map(|t| *t - start)
            .collect(),
        size,
    }
}

/// Places every allocation of `v` on a fresh sim GPU (`alloc_at`: the sim commits and
/// zeroes the memory then) and `copy_to_peer`s it there, no guest: what any migration has
/// to do. Returns (placing + copying, copying alone).
pub(super) fn plain_copy(p: Params, v: &Vgpu) -> Result<(Duration, Duration), String> {
    let e = |e: BackendError| e.to_string();
    let target = Tap::new(p, v.bytes() + 64 * MIB);
    let allocs = v.allocs();
    let src = v.m.current();
    let t = Instant::now();
    for (a, n) in &allocs {
        target.alloc_at(*a, *n).map_err(e)?;
    }
    let c = Instant::now();
    for (a, n) in &allocs {
        vgpu_backend::copy_to_peer(&*src, &*target, *a, *n).map_err(e)?;
    }
    Ok((t.elapsed(), c.elapsed()))
}
