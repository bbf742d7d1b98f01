//! The simulation's loop: arrivals and admission (static placement or vgpud's
//! placement), the rebalancer's rounds and the migrations they start, then each step's
//! sharing of the engines (`engines`), until every VM is done.

use vgpu_scheduler::clock::{Nanos, MS};
use vgpu_scheduler::rebalance::{
    place, Demand, GpuView, Mode, PlaceCandidate, RebalanceConfig, Rebalancer, VgpuView,
};

use super::engines::{oracle_repack, step};
use super::workload::{Job, Kind, KINDS};
use super::{Profile, GIB, ROUND, STEP};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Policy {
    Static,
    Placement,
    Rebalance,
    Consolidate,
    /// A reference, not a policy: every step it repacks all VMs from scratch knowing their
    /// demand at that instant, with free and instant moves.
    Oracle,
}

impl Policy {
    pub(super) fn name(self) -> &'static str {
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
pub(super) struct Vm {
    pub(super) gpu: u32,
    pub(super) progress: f64,
    /// Moving to this GPU; switches at `switch_at`.
    pub(super) moving: Option<(u32, Nanos)>,
    pub(super) paused_until: Nanos,
    pub(super) done: Option<Nanos>,
    /// What it wanted and got over the last step (for the measured demand).
    pub(super) want: Demand,
}

impl Vm {
    /// The fraction of the step starting at `now` in which it runs (not paused by a
    /// migration's stop-and-copy).
    pub(super) fn active(&self, now: Nanos) -> f64 {
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

/// Runs `jobs` on `gpus` GPUs under `policy`, migrations costing what `prof` says.
pub(super) fn simulate(jobs: &[Job], gpus: u32, policy: Policy, prof: Profile) -> Outcome {
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
    loop {
        // Arrivals join the admission queue; admit what fits, in order.
        while next_arrival < jobs.len() && jobs[next_arrival].arrival <= now {
            waiting.push(next_arrival);
            next_arrival += 1;
        }
        waiting = admit(jobs, &mut vms, waiting, gpus, policy, &reb);
        // The rebalancer's round.
        if now % ROUND == 0 && policy != Policy::Static {
            let round = reb.observe(now, &gpu_views(jobs, &vms, gpus), &vgpu_views(jobs, &vms));
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
        step(jobs, &mut vms, gpus, now, &mut out);
        out.gpu_h += f64::from(gpus) * (STEP as f64 / 1e9) / 3600.0;
        now += STEP;
        let all_done = next_arrival == jobs.len()
            && waiting.is_empty()
            && vms.iter().all(|v| v.is_some_and(|vm| vm.done.is_some()));
        if all_done || now > 24 * 3600 * 1000 * MS {
            break;
        }
    }
    completions(jobs, &vms, &mut out);
    out
}

/// Admits the `waiting` VMs that fit, in order, each on the GPU `policy` picks; returns
/// those still waiting.
fn admit(
    jobs: &[Job],
    vms: &mut [Option<Vm>],
    waiting: Vec<usize>,
    gpus: u32,
    policy: Policy,
    reb: &Rebalancer,
) -> Vec<usize> {
    let mut still = Vec::new();
    for j in waiting {
        let gv = gpu_views(jobs, vms, gpus);
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
                    .map(|g| candidate(jobs, vms, j, g, reb))
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
    still
}

/// GPU `g` as vgpud's placement sees it for VM `j`: the measured load of the VMs on it
/// (their shares where nothing is measured yet) and the memory left after `j`.
fn candidate(
    jobs: &[Job],
    vms: &[Option<Vm>],
    j: usize,
    g: &GpuView,
    reb: &Rebalancer,
) -> PlaceCandidate {
    let (mut c, mut m, mut n) = (0.0, 0.0, 0);
    for (k, vm) in vms.iter().enumerate() {
        if !vm.is_some_and(|vm| vm.done.is_none() && vm.gpu == g.index) {
            continue;
        }
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
        free_memory_after: (g.memory - g.committed_memory - jobs[j].memory) as f64
            / g.memory as f64,
        occupied: n > 0,
    }
}

/// Each GPU as vgpud reports it to the rebalancer: what the live VMs on it (or moving to
/// it) committed.
fn gpu_views(jobs: &[Job], vms: &[Option<Vm>], gpus: u32) -> Vec<GpuView> {
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
}

/// Each live VM as vgpud reports it to the rebalancer, with the demand measured over the
/// last step.
fn vgpu_views(jobs: &[Job], vms: &[Option<Vm>]) -> Vec<VgpuView> {
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
}

/// The completion times of the VMs that finished: mean, 95th percentile, and per class.
fn completions(jobs: &[Job], vms: &[Option<Vm>], out: &mut Outcome) {
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
}

#[cfg(test)]
mod tests {
    use super::super::workload::trace;
    use super::super::{CONSERVATIVE, H200};
    use super::*;

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
