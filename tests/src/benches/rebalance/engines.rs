//! One step of the fluid model: each GPU's compute and copy engines shared by weighted
//! max-min among the VMs on it, their progress, and the overload, idleness and energy
//! accounted; and the clairvoyant repacker run beside the policies.

use vgpu_scheduler::clock::Nanos;
use vgpu_scheduler::rebalance::Demand;

use super::sim::{Outcome, Vm};
use super::workload::Job;
use super::{GIB, STEP};

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

/// The step starting at `now`: shares each GPU's engines, advances the VMs, and accounts
/// overload and idleness.
pub(super) fn step(jobs: &[Job], vms: &mut [Option<Vm>], gpus: u32, now: Nanos, out: &mut Outcome) {
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
        share_gpu(jobs, vms, g, now, out);
    }
}

/// GPU `g`'s engines over the step starting at `now`, shared among the VMs on it.
fn share_gpu(jobs: &[Job], vms: &mut [Option<Vm>], g: u32, now: Nanos, out: &mut Outcome) {
    let dt = STEP as f64 / 1e9;
    let on: Vec<usize> = (0..jobs.len())
        .filter(|&j| vms[j].is_some_and(|vm| vm.done.is_none() && vm.gpu == g))
        .collect();
    if on.is_empty() {
        out.idle_gpu_h += dt / 3600.0;
        return;
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

/// Clairvoyant repacking: the VMs by decreasing demand at this instant, each to the GPU it
/// fits best (shares, memory, and both engines at most 1 after), else to the most loaded
/// GPU it may join, so an overload that cannot be avoided stays on as few GPUs as possible.
pub(super) fn oracle_repack(jobs: &[Job], vms: &mut [Option<Vm>], gpus: u32) {
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
}
