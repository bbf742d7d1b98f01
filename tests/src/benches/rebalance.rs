//! `vgpu-bench rebalance`: a trace of VMs arriving with mixed workloads
//! (compute-heavy, copy-heavy, bursty, idle) on 2 and 4 GPUs, run three ways in one
//! process: static placement (the least compute committed, with no measured load),
//! placement only (`gpu: "auto"`: measured load and free memory), and placement plus the
//! rebalancer (live migration). A light-load trace then compares consolidation with static
//! placement: GPU-hours with no vGPU (which can be powered down or lent out) and an energy
//! proxy.
//!
//! This is a fluid simulation in virtual time, not the daemon: each GPU's compute and copy
//! engines are shared by weighted max-min (weights = shares, as BAND's guarantee with work
//! conservation), a VM progresses at the rate its scarcest engine allows, and a migration
//! costs its resident bytes of pre-copy plus a pause, at one of two profiles: the
//! conservative one (12 GB/s, 50 ms) or the one measured between two H200s (168 GB/s,
//! 2 ms; docs/PERFORMANCE.md), each with the rebalancer settings it allows. The decisions
//! are the real policy's (`vgpu_scheduler::rebalance`, the code vgpud runs), fed the demand
//! vgpud would measure (busy + queue wait per engine) every 250 ms. A clairvoyant repacker
//! (free, instant moves every step) is run beside them as a reference. The trace is
//! deterministic (fixed seeds), so every run prints the same figures.

use vgpu_scheduler::clock::{Nanos, MS};
use vgpu_scheduler::rebalance::{
    place, Demand, GpuView, Mode, PlaceCandidate, RebalanceConfig, Rebalancer, VgpuView,
};

use crate::bench::Figure;

const GIB: u64 = 1 << 30;
const STEP: Nanos = 50 * MS;
const ROUND: Nanos = 250 * MS;

/// What a migration costs, and the rebalancer settings (vgpud's flags) used with it.
#[derive(Clone, Copy, Debug)]
struct Profile {
    name: &'static str,
    /// Pre-copy rate, bytes/s.
    bandwidth: f64,
    /// Stop-and-copy pause.
    downtime: Nanos,
    /// `--rebalance-window-ms` (every cool-down scales with it).
    window: Nanos,
    /// `--rebalance-smoothing-ms`.
    smoothing: Nanos,
}

/// The bench's original cost model: 12 GB/s of pre-copy (a PCIe-class copy) and a 50 ms
/// pause (the migration downtime goal), with a 1 s window and the default smoothing (a quarter of it).
const CONSERVATIVE: Profile = Profile {
    name: "12 GB/s, 50 ms pause, 1 s window",
    bandwidth: 12e9,
    downtime: 50 * MS,
    window: 1000 * MS,
    smoothing: 250 * MS,
};

/// Measured between two H200s over NVLink (docs/PERFORMANCE.md, "Live migration between
/// two H200s"): pre-copy 168 GB/s (the lowest rate measured at 1 GiB or more; 281 GB/s at
/// 16 GiB) and a 2 ms pause (1.86 ms at 4 GiB, 2.02 ms at 16 GiB). A move of 4 GiB then
/// lands in about 26 ms instead of 0.36 s, so the rebalancer may react sooner: a 500 ms
/// window (severe overload after 250 ms) and no smoothing beyond the 250 ms interval's own
/// average (50 ms time constant).
const H200: Profile = Profile {
    name: "H200-measured 168 GB/s, 2 ms, 0.5 s window",
    bandwidth: 168e9,
    downtime: 2 * MS,
    window: 500 * MS,
    smoothing: 50 * MS,
};
/// DCUDA (SoCC 2019), seed 003: overload-time reduction, completion-time gain, and energy
/// saved under light load, against static assignment.
const DCUDA_OVERLOAD: f64 = 78.3;
const DCUDA_COMPLETION: f64 = 42.1;
const DCUDA_ENERGY: f64 = 13.3;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Compute,
    Copy,
    Bursty,
    Idle,
}

const KINDS: [Kind; 4] = [Kind::Compute, Kind::Copy, Kind::Bursty, Kind::Idle];

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Compute => "compute-heavy",
            Kind::Copy => "copy-heavy",
            Kind::Bursty => "bursty",
            Kind::Idle => "idle",
        }
    }
}

#[derive(Clone, Debug)]
struct Job {
    arrival: Nanos,
    kind: Kind,
    /// Per-mille shares.
    share: u32,
    memory: u64,
    resident: u64,
    /// Seconds of progress it needs.
    work: f64,
}

impl Job {
    /// What it wants at `progress` seconds into its work.
    fn demand(&self, progress: f64) -> Demand {
        match self.kind {
            Kind::Compute => Demand {
                compute: 0.9,
                copy: 0.1,
            },
            Kind::Copy => Demand {
                compute: 0.1,
                copy: 0.9,
            },
            Kind::Bursty => {
                if progress % 5.0 < 2.0 {
                    Demand {
                        compute: 0.95,
                        copy: 0.3,
                    }
                } else {
                    Demand {
                        compute: 0.05,
                        copy: 0.02,
                    }
                }
            }
            Kind::Idle => Demand {
                compute: 0.03,
                copy: 0.02,
            },
        }
    }
}

/// xorshift64*: a deterministic trace without a dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> f64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11) as f64 / (1u64 << 53) as f64
    }

    fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[((self.next() * xs.len() as f64) as usize).min(xs.len() - 1)]
    }
}

/// `n` VMs arriving about every `gap_s` seconds; `light` makes the mix mostly idle and
/// bursty with long lives.
fn trace(seed: u64, n: usize, gap_s: f64, light: bool) -> Vec<Job> {
    let mut r = Rng(seed);
    let mut t = 0.0;
    (0..n)
        .map(|_| {
            t += -gap_s * (1.0 - r.next()).ln();
            let kind = if light {
                r.pick(&[Kind::Idle, Kind::Idle, Kind::Bursty, Kind::Idle])
            } else {
                r.pick(&[Kind::Compute, Kind::Copy, Kind::Bursty, Kind::Idle])
            };
            // Shares are what the tenant bought, not what it uses (DCUDA's point: demand
            // estimated before the run is often wrong).
            let share = r.pick(&[100, 150, 200, 250]);
            let memory = r.pick(&[1, 2, 3, 4]) * GIB;
            let resident = (memory as f64 * (0.3 + 0.7 * r.next())) as u64;
            let work = match kind {
                Kind::Compute | Kind::Copy => 20.0 + 40.0 * r.next(),
                Kind::Bursty => 30.0 + 60.0 * r.next(),
                Kind::Idle => {
                    if light {
                        300.0 + 600.0 * r.next()
                    } else {
                        60.0 + 120.0 * r.next()
                    }
                }
            };
            Job {
                arrival: (t * 1e9) as Nanos,
                kind,
                share,
                memory,
                resident,
                work,
            }
        })
        .collect()
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Policy {
    Static,
    Placement,
    Rebalance,
    Consolidate,
    /// A reference, not a policy: every step it repacks all VMs from scratch knowing their
    /// demand at that instant, with free and instant moves.
    Oracle,
}

impl Policy {
    fn name(self) -> &'static str {
        match self {
            Policy::Static => "static placement",
            Policy::Placement => "placement only",
            Policy::Rebalance => "placement + rebalancing",
            Policy::Consolidate => "placement + consolidation",
            Policy::Oracle => "clairvoyant repacking",
        }
    }
}

#[derive(Clone, Copy, Debug)]
struct Vm {
    gpu: u32,
    progress: f64,
    /// Moving to this GPU; switches at `switch_at`.
    moving: Option<(u32, Nanos)>,
    paused_until: Nanos,
    done: Option<Nanos>,
    /// What it wanted and got over the last step (for the measured demand).
    want: Demand,
}

impl Vm {
    /// The fraction of the step starting at `now` in which it runs (not paused by a
    /// migration's stop-and-copy).
    fn active(&self, now: Nanos) -> f64 {
        let paused = self.paused_until.saturating_sub(now).min(STEP);
        1.0 - paused as f64 / STEP as f64
    }
}

/// What one run measured.
#[derive(Clone, Debug, Default)]
pub struct Outcome {
    /// GPU-seconds with demand above capacity (compute or copy), summed over GPUs.
    pub overload_s: f64,
    /// Seconds in which the VMs on the host wanted more than all its GPUs have (compute
    /// or copy): at least one GPU is overloaded then whatever the placement.
    pub host_overload_s: f64,
    pub mean_completion_s: f64,
    pub p95_completion_s: f64,
    /// Completion times per workload class (`KINDS` order): sum (s) and count.
    pub by_kind: [(f64, usize); 4],
    pub migrations: usize,
    /// GPU-hours with no vGPU on the GPU.
    pub idle_gpu_h: f64,
    pub gpu_h: f64,
    /// Energy proxy: an occupied GPU draws 0.35 + 0.65 × utilization, an empty one is
    /// powered down (0), GPU-hours.
    pub energy: f64,
}

/// Weighted max-min share of one engine (capacity 1) among `(demand, weight)`.
fn waterfill(d: &[(f64, f64)]) -> Vec<f64> {
    let total: f64 = d.iter().map(|x| x.0).sum();
    if total <= 1.0 {
        return d.iter().map(|x| x.0).collect();
    }
    let mut a = vec![0.0; d.len()];
    let mut active: Vec<usize> = (0..d.len()).filter(|&i| d[i].0 > 0.0).collect();
    let mut left = 1.0;
    while !active.is_empty() {
        let w: f64 = active.iter().map(|&i| d[i].1).sum();
        let level = left / w;
        let (sat, rest): (Vec<usize>, Vec<usize>) =
            active.iter().partition(|&&i| d[i].0 <= level * d[i].1);
        if sat.is_empty() {
            for i in rest {
                a[i] = level * d[i].1;
            }
            break;
        }
        for i in sat {
            a[i] = d[i].0;
            left -= d[i].0;
        }
        active = rest;
    }
    a
}

fn simulate(jobs: &[Job], gpus: u32, policy: Policy, prof: Profile) -> Outcome {
    let mode = match policy {
        Policy::Static | Policy::Placement | Policy::Oracle => Mode::Off,
        Policy::Rebalance => Mode::Balance,
        Policy::Consolidate => Mode::Consolidate,
    };
    // What vgpud runs with `--rebalance-window-ms` and `--rebalance-smoothing-ms`.
    let mut cfg = RebalanceConfig::with_window(mode, prof.window);
    cfg.smoothing = prof.smoothing;
    let mut reb = Rebalancer::new(cfg);
    let mut vms: Vec<Option<Vm>> = vec![None; jobs.len()];
    let mut waiting: Vec<usize> = Vec::new();
    let mut next_arrival = 0;
    let mut now: Nanos = 0;
    let mut out = Outcome::default();
    let views = |vms: &[Option<Vm>]| -> Vec<GpuView> {
        (0..gpus)
            .map(|g| {
                let mut v = GpuView {
                    index: g,
                    speed: 1.0,
                    copy_rate: 1.0,
                    memory: 16 * GIB,
                    committed_memory: 0,
                    committed_compute: 0,
                    committed_copy: 0,
                    pool_free: 0,
                };
                for (j, vm) in vms.iter().enumerate() {
                    let Some(vm) = vm.filter(|vm| vm.done.is_none()) else {
                        continue;
                    };
                    if vm.gpu == g || vm.moving.is_some_and(|(t, _)| t == g) {
                        v.committed_compute += jobs[j].share;
                        v.committed_copy += jobs[j].share;
                        v.committed_memory += jobs[j].memory;
                    }
                }
                v
            })
            .collect()
    };
    let vgpu_views = |vms: &[Option<Vm>]| -> Vec<VgpuView> {
        vms.iter()
            .enumerate()
            .filter_map(|(j, vm)| {
                let vm = vm.filter(|vm| vm.done.is_none())?;
                Some(VgpuView {
                    id: j as u32,
                    gpu: vm.gpu,
                    memory: jobs[j].memory,
                    compute: jobs[j].share,
                    copy: jobs[j].share,
                    oversubscribe: false,
                    resident: jobs[j].resident,
                    demand: Some(vm.want),
                    movable: vm.moving.is_none(),
                })
            })
            .collect()
    };
    loop {
        // Arrivals join the admission queue; admit what fits, in order.
        while next_arrival < jobs.len() && jobs[next_arrival].arrival <= now {
            waiting.push(next_arrival);
            next_arrival += 1;
        }
        let mut still = Vec::new();
        for j in std::mem::take(&mut waiting) {
            let gv = views(&vms);
            let fits: Vec<&GpuView> = gv
                .iter()
                .filter(|g| {
                    g.committed_compute + jobs[j].share <= 1000
                        && g.committed_memory + jobs[j].memory <= g.memory
                })
                .collect();
            let pick = match policy {
                Policy::Static => fits
                    .iter()
                    .min_by_key(|g| (g.committed_compute, g.index))
                    .map(|g| g.index),
                _ => {
                    let cands: Vec<PlaceCandidate> = fits
                        .iter()
                        .map(|g| {
                            let (mut c, mut m, mut n) = (0.0, 0.0, 0);
                            for (k, vm) in vms.iter().enumerate() {
                                let Some(vm) =
                                    vm.filter(|vm| vm.done.is_none() && vm.gpu == g.index)
                                else {
                                    continue;
                                };
                                let _ = vm;
                                n += 1;
                                let d = reb.demand_on(k as u32, g).unwrap_or(Demand {
                                    compute: f64::from(jobs[k].share) / 1000.0,
                                    copy: f64::from(jobs[k].share) / 1000.0,
                                });
                                c += d.compute;
                                m += d.copy;
                            }
                            PlaceCandidate {
                                gpu: g.index,
                                load: f64::max(c, m),
                                add: f64::from(jobs[j].share) / 1000.0,
                                free_memory_after: (g.memory - g.committed_memory - jobs[j].memory)
                                    as f64
                                    / g.memory as f64,
                                occupied: n > 0,
                            }
                        })
                        .collect();
                    place(reb.config(), &cands)
                }
            };
            match pick {
                Some(g) => {
                    vms[j] = Some(Vm {
                        gpu: g,
                        progress: 0.0,
                        moving: None,
                        paused_until: 0,
                        done: None,
                        want: jobs[j].demand(0.0),
                    })
                }
                None => still.push(j),
            }
        }
        waiting = still;
        // The rebalancer's round.
        if now % ROUND == 0 && policy != Policy::Static {
            let round = reb.observe(now, &views(&vms), &vgpu_views(&vms));
            for d in round.decisions {
                if let Some(vm) = vms.get_mut(d.vgpu as usize).and_then(Option::as_mut) {
                    let precopy =
                        (jobs[d.vgpu as usize].resident as f64 / prof.bandwidth * 1e9) as Nanos;
                    vm.moving = Some((d.to, now + precopy));
                    out.migrations += 1;
                }
            }
        }
        if policy == Policy::Oracle {
            oracle_repack(jobs, &mut vms, gpus);
        }
        // Migrations that finish their pre-copy switch GPUs and pause briefly.
        for vm in vms.iter_mut().flatten() {
            if let Some((to, at)) = vm.moving {
                if at <= now {
                    vm.gpu = to;
                    vm.moving = None;
                    vm.paused_until = now + prof.downtime;
                }
            }
        }
        // Share each GPU's engines, progress, account overload and idleness.
        let dt = STEP as f64 / 1e9;
        let (mut hc, mut hm) = (0.0, 0.0);
        for (j, vm) in vms.iter().enumerate() {
            if let Some(vm) = vm.filter(|vm| vm.done.is_none()) {
                let a = vm.active(now);
                let d = jobs[j].demand(vm.progress);
                hc += a * d.compute;
                hm += a * d.copy;
            }
        }
        if hc > f64::from(gpus) + 1e-9 || hm > f64::from(gpus) + 1e-9 {
            out.host_overload_s += dt;
        }
        for g in 0..gpus {
            let on: Vec<usize> = (0..jobs.len())
                .filter(|&j| vms[j].is_some_and(|vm| vm.done.is_none() && vm.gpu == g))
                .collect();
            if on.is_empty() {
                out.idle_gpu_h += dt / 3600.0;
                continue;
            }
            let wants: Vec<Demand> = on
                .iter()
                .map(|&j| {
                    let vm = vms[j].unwrap_or_else(|| unreachable!());
                    let a = vm.active(now);
                    let d = jobs[j].demand(vm.progress);
                    Demand {
                        compute: a * d.compute,
                        copy: a * d.copy,
                    }
                })
                .collect();
            let w = |j: usize| f64::from(jobs[j].share).max(10.0);
            let ac = waterfill(
                &on.iter()
                    .zip(&wants)
                    .map(|(&j, d)| (d.compute, w(j)))
                    .collect::<Vec<_>>(),
            );
            let am = waterfill(
                &on.iter()
                    .zip(&wants)
                    .map(|(&j, d)| (d.copy, w(j)))
                    .collect::<Vec<_>>(),
            );
            let (sc, sm): (f64, f64) = (
                wants.iter().map(|d| d.compute).sum(),
                wants.iter().map(|d| d.copy).sum(),
            );
            if sc > 1.0 + 1e-9 || sm > 1.0 + 1e-9 {
                out.overload_s += dt;
            }
            let util = ac.iter().sum::<f64>().max(am.iter().sum::<f64>()).min(1.0);
            out.energy += (0.35 + 0.65 * util) * dt / 3600.0;
            for (k, &j) in on.iter().enumerate() {
                let d = wants[k];
                let mut rate: f64 = 1.0;
                if d.compute > 0.0 {
                    rate = rate.min(ac[k] / d.compute);
                }
                if d.copy > 0.0 {
                    rate = rate.min(am[k] / d.copy);
                }
                let Some(vm) = vms[j].as_mut() else {
                    continue;
                };
                // A VM paused for part of the step progresses in the rest of it.
                let a = vm.active(now);
                if a <= 0.0 {
                    rate = 0.0;
                }
                vm.want = d;
                vm.progress += rate * a * dt;
                if vm.progress >= jobs[j].work {
                    vm.done = Some(now + STEP);
                }
            }
        }
        out.gpu_h += f64::from(gpus) * dt / 3600.0;
        now += STEP;
        let all_done = next_arrival == jobs.len()
            && waiting.is_empty()
            && vms.iter().all(|v| v.is_some_and(|vm| vm.done.is_some()));
        if all_done || now > 24 * 3600 * 1000 * MS {
            break;
        }
    }
    let done: Vec<(Kind, f64)> = vms
        .iter()
        .zip(jobs)
        .filter_map(|(vm, j)| {
            vm.and_then(|vm| vm.done)
                .map(|d| (j.kind, (d - j.arrival) as f64 / 1e9))
        })
        .collect();
    for (i, k) in KINDS.iter().enumerate() {
        let t: Vec<f64> = done.iter().filter(|x| x.0 == *k).map(|x| x.1).collect();
        out.by_kind[i] = (t.iter().sum(), t.len());
    }
    let mut times: Vec<f64> = done.iter().map(|x| x.1).collect();
    times.sort_by(f64::total_cmp);
    out.mean_completion_s = times.iter().sum::<f64>() / times.len().max(1) as f64;
    out.p95_completion_s = times
        .get(((times.len() as f64 * 0.95).ceil() as usize).saturating_sub(1))
        .copied()
        .unwrap_or(0.0);
    out
}

/// Clairvoyant repacking: the VMs by decreasing demand at this instant, each to the GPU it
/// fits best (shares, memory, and both engines at most 1 after), else to the most loaded
/// GPU it may join, so an overload that cannot be avoided stays on as few GPUs as possible.
fn oracle_repack(jobs: &[Job], vms: &mut [Option<Vm>], gpus: u32) {
    let dem: Vec<Demand> = (0..vms.len())
        .map(|j| jobs[j].demand(vms[j].map_or(0.0, |v| v.progress)))
        .collect();
    let mut live: Vec<usize> = (0..vms.len())
        .filter(|&j| vms[j].is_some_and(|vm| vm.done.is_none()))
        .collect();
    live.sort_by(|&a, &b| {
        let (da, db) = (dem[a], dem[b]);
        db.compute
            .max(db.copy)
            .total_cmp(&da.compute.max(da.copy))
            .then(a.cmp(&b))
    });
    let n = gpus as usize;
    let (mut c, mut m) = (vec![0.0f64; n], vec![0.0f64; n]);
    let (mut sh, mut mem) = (vec![0u32; n], vec![0u64; n]);
    for j in live {
        let d = dem[j];
        let ok = |g: usize| sh[g] + jobs[j].share <= 1000 && mem[g] + jobs[j].memory <= 16 * GIB;
        let fuller = |a: &usize, b: &usize| {
            (c[*a].max(m[*a]))
                .total_cmp(&c[*b].max(m[*b]))
                .then(b.cmp(a))
        };
        let g = (0..n)
            .filter(|&g| ok(g) && c[g] + d.compute <= 1.0 + 1e-9 && m[g] + d.copy <= 1.0 + 1e-9)
            .max_by(fuller)
            .or_else(|| (0..n).filter(|&g| ok(g)).max_by(fuller))
            .unwrap_or_else(|| vms[j].map_or(0, |v| v.gpu as usize));
        c[g] += d.compute;
        m[g] += d.copy;
        sh[g] += jobs[j].share;
        mem[g] += jobs[j].memory;
        if let Some(vm) = vms[j].as_mut() {
            vm.gpu = g as u32;
        }
    }
}

fn pct_less(ours: f64, base: f64) -> f64 {
    if base > 0.0 {
        100.0 * (base - ours) / base
    } else {
        0.0
    }
}

fn fig(
    name: String,
    value: f64,
    unit: &str,
    anchor_name: &str,
    anchor: f64,
    anchor_unit: &str,
) -> Figure {
    Figure {
        name,
        value,
        unit: unit.into(),
        anchor_name: anchor_name.into(),
        anchor,
        anchor_unit: anchor_unit.into(),
    }
}

/// Ten traces per size; the figures are their sums/means. (Three before 2026-11-29: the
/// reductions then moved by up to ±10 points with the choice of seeds.)
const SEEDS: [u64; 10] = [11, 23, 37, 41, 53, 67, 79, 83, 97, 101];

/// The share of static placement's overload that no placement can avoid (the host as a
/// whole wanted more than all its GPUs have), over the three traces of a size.
fn unavoidable_share(gpus: u32, n: usize, gap: f64) -> f64 {
    let (mut host, mut over) = (0.0, 0.0);
    for &s in &SEEDS {
        let r = simulate(
            &trace(s * 1000 + u64::from(gpus), n, gap, false),
            gpus,
            Policy::Static,
            CONSERVATIVE,
        );
        host += r.host_overload_s;
        over += r.overload_s;
    }
    host / over.max(1e-9)
}

/// DCUDA-like load: DCUDA removed 78.3 % of static assignment's overload, so on its
/// workloads at most 21.7 % of that overload was unavoidable. Our notes on the paper
/// (seed 003) give neither its arrival rate nor its trace, so this picks the heaviest load (the
/// shortest mean gap between arrivals, same mix, same VMs, same seeds) whose unavoidable
/// share under *static placement* is at most 21.7 %. Only the static runs choose it, so
/// it favours no policy; all three policies then run the same traces.
fn dcuda_like_gap(gpus: u32, n: usize, heavy_gap: f64) -> (f64, f64) {
    let limit = 1.0 - DCUDA_OVERLOAD / 100.0;
    let mut last = (heavy_gap, unavoidable_share(gpus, n, heavy_gap));
    for k in [1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 4.0] {
        let gap = heavy_gap * k;
        let u = unavoidable_share(gpus, n, gap);
        last = (gap, u);
        if u <= limit {
            break;
        }
    }
    last
}

/// Runs every scenario; prints the table and returns the figures.
pub fn run() -> Vec<Figure> {
    let mut figures = Vec::new();
    println!("rebalance: fluid simulation in virtual time with vgpud's placement and rebalancing policy (see docs/PERFORMANCE.md)");
    let mut scenarios = Vec::new();
    for (gpus, n, gap) in [(2u32, 40usize, 14.0f64), (4, 80, 7.0)] {
        scenarios.push(("heavy", gpus, n, gap));
    }
    for (gpus, n, gap) in [(2u32, 40usize, 14.0f64), (4, 80, 7.0)] {
        let (g, u) = dcuda_like_gap(gpus, n, gap);
        println!(
            "DCUDA-like load on {gpus} GPUs: one VM per {g:.1} s on average ({:.2}x the heavy gap); {:.1}% of static placement's overload is unavoidable (at most {:.1}% wanted)",
            g / gap,
            100.0 * u,
            100.0 - DCUDA_OVERLOAD
        );
        scenarios.push(("DCUDA-like", gpus, n, g));
    }
    for (label, gpus, n, gap) in scenarios {
        let seeds = SEEDS;
        let pfx = if label == "heavy" { "" } else { "dcuda-like " };
        let runs: [(String, Policy, Profile); 5] = [
            (Policy::Static.name().into(), Policy::Static, CONSERVATIVE),
            (
                Policy::Placement.name().into(),
                Policy::Placement,
                CONSERVATIVE,
            ),
            (
                format!("rebalancing, {}", CONSERVATIVE.name),
                Policy::Rebalance,
                CONSERVATIVE,
            ),
            (
                format!("rebalancing, {}", H200.name),
                Policy::Rebalance,
                H200,
            ),
            (Policy::Oracle.name().into(), Policy::Oracle, CONSERVATIVE),
        ];
        // Per run: the aggregate and each trace's outcome.
        let mut agg: Vec<(String, Outcome, Vec<Outcome>)> = Vec::new();
        for (name, p, prof) in &runs {
            let mut o = Outcome::default();
            let mut per = Vec::new();
            for &s in &seeds {
                let r = simulate(
                    &trace(s * 1000 + u64::from(gpus), n, gap, false),
                    gpus,
                    *p,
                    *prof,
                );
                o.overload_s += r.overload_s;
                o.host_overload_s += r.host_overload_s;
                o.mean_completion_s += r.mean_completion_s / seeds.len() as f64;
                o.p95_completion_s += r.p95_completion_s / seeds.len() as f64;
                o.migrations += r.migrations;
                for k in 0..KINDS.len() {
                    o.by_kind[k].0 += r.by_kind[k].0;
                    o.by_kind[k].1 += r.by_kind[k].1;
                }
                per.push(r);
            }
            agg.push((name.clone(), o, per));
        }
        println!(
            "\n{label} load, {gpus} GPUs, {} VMs per trace × {} traces (compute-heavy, copy-heavy, bursty, idle; arrivals every {gap:.1} s on average)",
            n,
            seeds.len()
        );
        println!(
            "  {:<58} {:>14} {:>12} {:>12} {:>11}",
            "policy", "overload GPU-s", "avg compl s", "p95 compl s", "migrations"
        );
        for (name, o, _) in &agg {
            println!(
                "  {:<58} {:>14.1} {:>12.1} {:>12.1} {:>11}",
                name, o.overload_s, o.mean_completion_s, o.p95_completion_s, o.migrations
            );
        }
        let base = agg[0].1.clone();
        let short = [
            "",
            "placement only",
            "rebalancing 12GB/s",
            "rebalancing H200",
            "clairvoyant",
        ];
        for (i, (_, o, _)) in agg.iter().enumerate().skip(1) {
            figures.push(fig(
                format!("rebalance {}{gpus}gpu overload time, {}", pfx, short[i]),
                o.overload_s,
                "GPU-s",
                "static placement",
                base.overload_s,
                "GPU-s",
            ));
            figures.push(fig(
                format!("rebalance {}{gpus}gpu mean completion, {}", pfx, short[i]),
                o.mean_completion_s,
                "s",
                "static placement",
                base.mean_completion_s,
                "s",
            ));
            figures.push(fig(
                format!("rebalance {}{gpus}gpu p95 completion, {}", pfx, short[i]),
                o.p95_completion_s,
                "s",
                "static placement",
                base.p95_completion_s,
                "s",
            ));
        }
        for i in [2, 3] {
            figures.push(fig(
                format!("rebalance {}{gpus}gpu migrations, {}", pfx, short[i]),
                agg[i].1.migrations as f64,
                "moves",
                "VMs",
                (n * seeds.len()) as f64,
                "VMs",
            ));
        }
        let oracle = &agg[4].1;
        let oracle_red = pct_less(oracle.overload_s, base.overload_s);
        for i in [2, 3] {
            let o = &agg[i].1;
            let red = pct_less(o.overload_s, base.overload_s);
            let gain = pct_less(o.mean_completion_s, base.mean_completion_s);
            println!(
                "  {}: overload-time reduction {red:.1}% (DCUDA {DCUDA_OVERLOAD}%; clairvoyant repacking {oracle_red:.1}%), mean completion-time gain {gain:.1}% (DCUDA up to {DCUDA_COMPLETION}%)",
                short[i]
            );
            figures.push(fig(
                format!(
                    "rebalance {}{gpus}gpu overload-time reduction, {}",
                    pfx, short[i]
                ),
                red,
                "%",
                "DCUDA",
                DCUDA_OVERLOAD,
                "%",
            ));
            figures.push(fig(
                format!(
                    "rebalance {}{gpus}gpu mean completion-time gain, {}",
                    pfx, short[i]
                ),
                gain,
                "%",
                "DCUDA",
                DCUDA_COMPLETION,
                "%",
            ));
        }
        figures.push(fig(
            format!(
                "rebalance {}{gpus}gpu overload-time reduction, clairvoyant",
                pfx
            ),
            oracle_red,
            "%",
            "DCUDA",
            DCUDA_OVERLOAD,
            "%",
        ));
        let best = &agg[3].1;
        println!(
            "  the host as a whole wanted more than its {gpus} GPUs have for {:.1} s: overload no placement avoids; of the avoidable {:.1} GPU-s, rebalancing (H200) removed {:.1}%",
            base.host_overload_s,
            base.overload_s - base.host_overload_s,
            100.0 * (base.overload_s - best.overload_s)
                / (base.overload_s - base.host_overload_s).max(1e-9)
        );
        // Completion-time gain per workload class and per trace (H200 rebalancing vs
        // static): DCUDA's "up to 42.1 %" is a best case over its workloads, so the best
        // class and the best trace are shown beside the mean over all VMs.
        let class_mean = |o: &Outcome, k: usize| o.by_kind[k].0 / o.by_kind[k].1.max(1) as f64;
        let mut line = String::from("  completion-time gain per class (mean over its VMs):");
        let mut best_class = f64::MIN;
        for (k, kind) in KINDS.iter().enumerate() {
            let g = pct_less(class_mean(best, k), class_mean(&base, k));
            best_class = best_class.max(g);
            line += &format!(" {} {g:.1}%,", kind.name());
            figures.push(fig(
                format!(
                    "rebalance {}{gpus}gpu completion-time gain, {}, rebalancing H200",
                    pfx,
                    kind.name()
                ),
                g,
                "%",
                "DCUDA (best case)",
                DCUDA_COMPLETION,
                "%",
            ));
        }
        println!("{}", line.trim_end_matches(','));
        let per_trace: Vec<f64> = agg[0]
            .2
            .iter()
            .zip(&agg[3].2)
            .map(|(s, r)| pct_less(r.mean_completion_s, s.mean_completion_s))
            .collect();
        let best_trace = per_trace.iter().copied().fold(f64::MIN, f64::max);
        let mut best_cell = f64::MIN;
        for (s, r) in agg[0].2.iter().zip(&agg[3].2) {
            for k in 0..KINDS.len() {
                if s.by_kind[k].1 > 0 {
                    best_cell = best_cell.max(pct_less(class_mean(r, k), class_mean(s, k)));
                }
            }
        }
        println!(
            "  per trace: mean gain {:.1}%, best trace {best_trace:.1}%, best class within a trace {best_cell:.1}% (DCUDA up to {DCUDA_COMPLETION}%)",
            per_trace.iter().sum::<f64>() / per_trace.len().max(1) as f64
        );
        figures.push(fig(
            format!(
                "rebalance {}{gpus}gpu best per-trace completion-time gain, rebalancing H200",
                pfx
            ),
            best_trace,
            "%",
            "DCUDA (best case)",
            DCUDA_COMPLETION,
            "%",
        ));
        figures.push(fig(
            format!(
                "rebalance {}{gpus}gpu best class completion-time gain, rebalancing H200",
                pfx
            ),
            best_class,
            "%",
            "DCUDA (best case)",
            DCUDA_COMPLETION,
            "%",
        ));
    }
    // Light load: consolidation.
    let gpus = 4;
    let jobs = trace(4242, 16, 20.0, true);
    let st = simulate(&jobs, gpus, Policy::Static, CONSERVATIVE);
    let co = simulate(&jobs, gpus, Policy::Consolidate, CONSERVATIVE);
    println!("\nlight load, 4 GPUs, 16 mostly idle/bursty VMs");
    println!(
        "  {:<26} {:>12} {:>12} {:>12} {:>11}",
        "policy", "idle GPU-h", "energy", "avg compl s", "migrations"
    );
    for (p, o) in [(Policy::Static, &st), (Policy::Consolidate, &co)] {
        println!(
            "  {:<26} {:>12.3} {:>12.3} {:>12.1} {:>11}",
            p.name(),
            o.idle_gpu_h,
            o.energy,
            o.mean_completion_s,
            o.migrations
        );
    }
    let freed = co.idle_gpu_h - st.idle_gpu_h;
    let saved = pct_less(co.energy, st.energy);
    println!(
        "  GPU-hours freed by consolidation: {freed:.3} of {:.3} ({:.1}%); energy saved {saved:.1}% (DCUDA {DCUDA_ENERGY}%)",
        co.gpu_h,
        100.0 * freed / co.gpu_h.max(1e-9)
    );
    figures.push(fig(
        "rebalance light load idle GPU-hours, consolidation".into(),
        co.idle_gpu_h,
        "GPU-h",
        "static placement",
        st.idle_gpu_h,
        "GPU-h",
    ));
    figures.push(fig(
        "rebalance light load GPU-hours freed by consolidation".into(),
        freed,
        "GPU-h",
        "GPU-hours of the run",
        co.gpu_h,
        "GPU-h",
    ));
    figures.push(fig(
        "rebalance light load energy saved vs static".into(),
        saved,
        "%",
        "DCUDA",
        DCUDA_ENERGY,
        "%",
    ));
    figures.push(fig(
        "rebalance light load mean completion, consolidation".into(),
        co.mean_completion_s,
        "s",
        "static placement",
        st.mean_completion_s,
        "s",
    ));
    println!();
    figures
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waterfill_guarantees_weights_and_conserves_work() {
        let a = waterfill(&[(0.9, 1.0), (0.9, 1.0)]);
        assert!((a[0] - 0.5).abs() < 1e-9 && (a[1] - 0.5).abs() < 1e-9);
        let a = waterfill(&[(0.1, 1.0), (0.9, 1.0)]);
        assert!((a[0] - 0.1).abs() < 1e-9 && (a[1] - 0.9).abs() < 1e-9);
        let a = waterfill(&[(0.2, 1.0), (0.9, 3.0), (0.9, 1.0)]);
        assert!((a.iter().sum::<f64>() - 1.0).abs() < 1e-9, "{a:?}");
    }

    #[test]
    fn rebalancing_beats_static_on_a_small_trace() {
        let jobs = trace(7, 20, 5.0, false);
        let s = simulate(&jobs, 2, Policy::Static, CONSERVATIVE);
        for prof in [CONSERVATIVE, H200] {
            let r = simulate(&jobs, 2, Policy::Rebalance, prof);
            assert!(r.overload_s <= s.overload_s, "{s:?} {r:?}");
        }
    }

    #[test]
    fn a_pause_shorter_than_a_step_costs_only_its_share_of_the_step() {
        let vm = Vm {
            gpu: 0,
            progress: 0.0,
            moving: None,
            paused_until: 2 * MS,
            done: None,
            want: Demand::default(),
        };
        assert!((vm.active(0) - 0.96).abs() < 1e-9);
        assert!((vm.active(2 * MS) - 1.0).abs() < 1e-9);
        let vm = Vm {
            paused_until: 80 * MS,
            ..vm
        };
        assert_eq!(vm.active(0), 0.0);
    }
}
