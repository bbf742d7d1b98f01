//! A discrete-event simulation of vGPUs sharing one GPU under a policy, in virtual time:
//! the tests' and the benchmark's model of "two guests run spin kernels of different
//! lengths". Each vGPU is a closed loop: every stream submits a request, waits for it,
//! thinks, submits the next. The device runs each vGPU's granted requests one at a time, in
//! grant order; since the schedulers let one vGPU hold a resource at a time, that is the
//! device's order, except after a deadline overrun: then the late request keeps running
//! while the vGPU that got the resource back runs beside it (a GPU time-slices the
//! contexts of different processes; the model runs both at full speed). A hand-over may
//! cost the device time ([`run_switching`]): a request that follows another vGPU's on the
//! same engine starts that much later (a GPU's switch between two processes' contexts).

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, VecDeque};

use crate::clock::Nanos;
use crate::gpu::{GpuScheduler, Resource, ResourceGrant};
use crate::state::{Share, VgpuId};
use crate::SchedError;

/// How long one request runs.
#[derive(Clone, Copy, Debug)]
pub enum Burst {
    Fixed(Nanos),
    /// Uniform in [lo, hi].
    Uniform(Nanos, Nanos),
}

/// One vGPU's workload.
#[derive(Clone, Debug)]
pub struct Workload {
    pub vgpu: VgpuId,
    pub compute_share: Share,
    pub copy_share: Share,
    pub resource: Resource,
    pub burst: Burst,
    /// Gap between a completion and the stream's next submit (the guest's own time).
    pub think: Nanos,
    /// Requests in flight at once.
    pub streams: u32,
}

/// What a run measured.
#[derive(Clone, Debug, Default)]
pub struct Report {
    pub duration: Nanos,
    /// Busy time per vGPU and resource.
    pub busy: BTreeMap<(VgpuId, Resource), Nanos>,
    /// Busy fraction per vGPU per window, for each resource.
    pub windows: BTreeMap<(VgpuId, Resource), Vec<f64>>,
    pub completed: BTreeMap<VgpuId, u64>,
    /// Scheduler calls made (submit + complete + tick).
    pub calls: u64,
    /// Longest time a request of each vGPU waited between its submit and its grant.
    pub max_wait: BTreeMap<VgpuId, Nanos>,
    /// Requests that started after another vGPU's on the same engine.
    pub handovers: u64,
}

impl Report {
    /// Fraction of the run a vGPU kept a resource busy.
    pub fn utilization(&self, vgpu: VgpuId, r: Resource) -> f64 {
        self.busy.get(&(vgpu, r)).copied().unwrap_or(0) as f64 / self.duration.max(1) as f64
    }

    /// A vGPU's share of the resource's busy time (what "gets 70%" means when the
    /// resource is saturated).
    pub fn share_of_busy(&self, vgpu: VgpuId, r: Resource) -> f64 {
        let total: Nanos = self
            .busy
            .iter()
            .filter(|((_, rr), _)| *rr == r)
            .map(|(_, b)| *b)
            .sum();
        self.busy.get(&(vgpu, r)).copied().unwrap_or(0) as f64 / total.max(1) as f64
    }

    /// Largest absolute error, in fraction points, between a vGPU's windowed share of
    /// busy time and `target`.
    pub fn max_window_error(&self, vgpu: VgpuId, r: Resource, target: f64) -> f64 {
        let Some(mine) = self.windows.get(&(vgpu, r)) else {
            return f64::NAN;
        };
        let n = mine.len();
        (0..n)
            .map(|i| {
                let total: f64 = self
                    .windows
                    .iter()
                    .filter(|((_, rr), _)| *rr == r)
                    .map(|(_, w)| w.get(i).copied().unwrap_or(0.0))
                    .sum();
                if total <= 0.0 {
                    0.0
                } else {
                    (mine[i] / total - target).abs()
                }
            })
            .fold(0.0, f64::max)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    /// Workload `i` (an index into the workloads) submits.
    Arrive(usize),
    /// The device finished the running request of a vGPU's lane on `resource`.
    Done(Resource, VgpuId),
    Tick,
}

/// A tiny deterministic generator (xorshift64*), so runs repeat exactly.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn burst(&mut self, b: Burst) -> Nanos {
        match b {
            Burst::Fixed(n) => n,
            Burst::Uniform(lo, hi) if hi > lo => lo + self.next() % (hi - lo + 1),
            Burst::Uniform(lo, _) => lo,
        }
    }
}

/// One vGPU's lane on a device engine: its granted requests run one after another.
#[derive(Default)]
struct Lane {
    /// Granted, not started: workload indices.
    queue: VecDeque<usize>,
    /// The running request: its workload index and start.
    running: Option<(usize, Nanos)>,
}

/// The workload of `vgpu` on `r` whose oldest request a grant takes (one with a request
/// waiting). Under SDQ every grant comes tagged with the compute engine, so a vGPU's
/// waiting copy request is found by its vGPU alone.
fn take_waiting(
    waiting: &mut [VecDeque<Nanos>],
    workloads: &[Workload],
    vgpu: VgpuId,
    r: Resource,
) -> (usize, Option<Nanos>) {
    let i = workloads
        .iter()
        .enumerate()
        .position(|(i, w)| w.vgpu == vgpu && w.resource == r && !waiting[i].is_empty())
        .or_else(|| {
            workloads
                .iter()
                .enumerate()
                .position(|(i, w)| w.vgpu == vgpu && !waiting[i].is_empty())
        })
        .or_else(|| workloads.iter().position(|w| w.vgpu == vgpu))
        .unwrap_or(0);
    let arrived = waiting.get_mut(i).and_then(VecDeque::pop_front);
    (i, arrived)
}

/// Runs `workloads` on a GPU scheduled by `sched` for `duration`, with `window`-long
/// measurement windows; hand-overs cost nothing.
pub fn run(
    sched: GpuScheduler,
    workloads: &[Workload],
    duration: Nanos,
    window: Nanos,
    seed: u64,
) -> Report {
    run_switching(sched, workloads, duration, window, seed, 0)
}

/// Starts request `j` of `v`'s lane on `ix` at `now`, or `switch_cost` later when another
/// vGPU's request ran last on that engine; returns its start.
#[allow(clippy::too_many_arguments)]
fn begin(
    lane: &mut Lane,
    j: usize,
    v: VgpuId,
    ix: Resource,
    now: Nanos,
    last_on: &mut BTreeMap<Resource, VgpuId>,
    switch_cost: Nanos,
    report: &mut Report,
) -> Nanos {
    let start = match last_on.insert(ix, v) {
        Some(prev) if prev != v => {
            report.handovers += 1;
            now + switch_cost
        }
        _ => now,
    };
    lane.running = Some((j, start));
    start
}

/// As [`run`], with each hand-over between vGPUs on an engine costing the device
/// `switch_cost` (not charged to anyone: the device is busy, nobody's work runs).
pub fn run_switching(
    mut sched: GpuScheduler,
    workloads: &[Workload],
    duration: Nanos,
    window: Nanos,
    seed: u64,
    switch_cost: Nanos,
) -> Report {
    let mut report = Report {
        duration,
        ..Default::default()
    };
    let mut rng = Rng(seed | 1);
    let mut events: BinaryHeap<Reverse<(Nanos, u64, Event)>> = BinaryHeap::new();
    let mut seq = 0u64;
    let mut push = |events: &mut BinaryHeap<Reverse<(Nanos, u64, Event)>>, t: Nanos, e: Event| {
        seq += 1;
        events.push(Reverse((t, seq, e)));
    };
    // A vGPU may have several workloads (compute and copy, say): it joins the scheduler
    // once, with the shares of its first workload.
    let mut added = std::collections::BTreeSet::new();
    for (i, w) in workloads.iter().enumerate() {
        if !added.contains(&w.vgpu) {
            // A vGPU the caller added already (with its own deadline, say) is kept.
            match sched.add(w.vgpu, w.compute_share, w.copy_share, 0) {
                Ok(()) | Err(SchedError::Duplicate(_)) => {}
                Err(_) => continue,
            }
            added.insert(w.vgpu);
        }
        for s in 0..w.streams {
            push(&mut events, u64::from(s), Event::Arrive(i));
        }
    }
    let nwin = duration.div_ceil(window.max(1)) as usize;
    // Submitted and not yet granted, per workload: their submit times.
    let mut waiting = vec![VecDeque::new(); workloads.len()];
    // Lanes queue workload indices, so each request keeps its burst and think time.
    let mut lanes: BTreeMap<(Resource, VgpuId), Lane> = BTreeMap::new();
    let mut scheduled_tick: Option<Nanos> = None;
    // Whose request ran last on each engine.
    let mut last_on: BTreeMap<Resource, VgpuId> = BTreeMap::new();

    // Adds busy time [from, to) to the per-window buckets.
    let account = |report: &mut Report, vgpu: VgpuId, r: Resource, from: Nanos, to: Nanos| {
        *report.busy.entry((vgpu, r)).or_default() += to - from;
        let w = report
            .windows
            .entry((vgpu, r))
            .or_insert_with(|| vec![0.0; nwin]);
        let mut t = from;
        while t < to {
            let i = (t / window) as usize;
            let end = ((i as u64 + 1) * window).min(to);
            if let Some(slot) = w.get_mut(i) {
                *slot += (end - t) as f64 / window as f64;
            }
            t = end;
        }
    };

    while let Some(Reverse((now, _, event))) = events.pop() {
        if now >= duration {
            break;
        }
        let grants: Vec<ResourceGrant> = match event {
            Event::Arrive(i) => {
                report.calls += 1;
                waiting[i].push_back(now);
                sched
                    .submit(workloads[i].vgpu, workloads[i].resource, now)
                    .unwrap_or_default()
            }
            Event::Done(ix, v) => {
                let lane = lanes.entry((ix, v)).or_default();
                let Some((i, started)) = lane.running.take() else {
                    continue;
                };
                account(&mut report, v, ix, started, now);
                *report.completed.entry(v).or_default() += 1;
                push(&mut events, now + workloads[i].think, Event::Arrive(i));
                report.calls += 1;
                let g = sched.complete(v, ix, started, now).unwrap_or_default();
                // Start the next queued request of this lane.
                if let Some(j) = lane.queue.pop_front() {
                    let start = begin(lane, j, v, ix, now, &mut last_on, switch_cost, &mut report);
                    push(
                        &mut events,
                        start + rng.burst(workloads[j].burst),
                        Event::Done(ix, v),
                    );
                }
                g
            }
            Event::Tick => {
                scheduled_tick = None;
                report.calls += 1;
                sched.tick(now)
            }
        };
        for g in grants {
            let (ix, v) = (g.resource, g.grant.vgpu);
            let lane = lanes.entry((ix, v)).or_default();
            for _ in 0..g.grant.count {
                let (j, arrived) = take_waiting(&mut waiting, workloads, v, ix);
                if let Some(t) = arrived {
                    let w = report.max_wait.entry(v).or_default();
                    *w = (*w).max(now - t);
                }
                lane.queue.push_back(j);
            }
            if lane.running.is_none() {
                if let Some(j) = lane.queue.pop_front() {
                    let start = begin(lane, j, v, ix, now, &mut last_on, switch_cost, &mut report);
                    push(
                        &mut events,
                        start + rng.burst(workloads[j].burst),
                        Event::Done(ix, v),
                    );
                }
            }
        }
        if let Some(d) = sched.next_deadline() {
            let d = d.max(now + 1);
            if scheduled_tick.is_none_or(|t| d < t) {
                scheduled_tick = Some(d);
                push(&mut events, d, Event::Tick);
            }
        }
    }
    // Requests still running at the end count up to the end; requests never granted
    // waited until the end.
    for ((ix, v), lane) in &lanes {
        if let Some((_, started)) = lane.running {
            if started < duration {
                account(&mut report, *v, *ix, started, duration);
            }
        }
    }
    for (i, w) in waiting.iter().enumerate() {
        if let Some(&t) = w.front() {
            let m = report.max_wait.entry(workloads[i].vgpu).or_default();
            *m = (*m).max(duration.saturating_sub(t));
        }
    }
    report
}
