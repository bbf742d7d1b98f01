//! The rebalancer in virtual time: rounds every 250 ms, vGPUs moved as decided, every move
//! checked against the admission rule.

mod consolidate;
mod detect;
mod moves;
mod swap;

use std::collections::BTreeMap;

use super::*;
use crate::admission::WHOLE;
use crate::clock::{Nanos, MS};

const GIB: u64 = 1 << 30;

fn gpus(n: u32) -> Vec<GpuView> {
    (0..n)
        .map(|i| GpuView {
            index: i,
            speed: 1.0,
            copy_rate: 1.0,
            memory: 16 * GIB,
            committed_memory: 0,
            committed_compute: 0,
            committed_copy: 0,
            pool_free: 0,
        })
        .collect()
}

fn v(id: VgpuId, gpu: GpuIndex, share: u32, resident: u64, compute: f64) -> VgpuView {
    VgpuView {
        id,
        gpu,
        memory: resident.max(GIB),
        compute: share,
        copy: share,
        oversubscribe: false,
        resident,
        demand: Some(Demand {
            compute,
            copy: 0.05,
        }),
        movable: true,
    }
}

/// Fills in committed shares and memory from the vGPUs.
fn commit_all(gs: &mut [GpuView], vs: &[VgpuView]) {
    for g in gs.iter_mut() {
        g.committed_compute = vs
            .iter()
            .filter(|v| v.gpu == g.index)
            .map(|v| v.compute)
            .sum();
        g.committed_copy = vs.iter().filter(|v| v.gpu == g.index).map(|v| v.copy).sum();
        g.committed_memory = vs
            .iter()
            .filter(|v| v.gpu == g.index)
            .map(|v| v.memory)
            .sum();
    }
}

fn cfg(mode: Mode) -> RebalanceConfig {
    RebalanceConfig {
        mode,
        ..RebalanceConfig::default()
    }
}

/// Runs rounds every 250 ms of virtual time for `secs`, moving vGPUs as decided;
/// `demand(t, vgpu)` gives each vGPU's compute demand at time t.
fn run(
    r: &mut Rebalancer,
    gs: &mut [GpuView],
    vs: &mut [VgpuView],
    from: Nanos,
    secs: u64,
    demand: impl Fn(Nanos, VgpuId) -> f64,
) -> Vec<Decision> {
    let mut all = Vec::new();
    let mut now = from;
    while now < from + secs * 1000 * MS {
        now += 250 * MS;
        for v in vs.iter_mut() {
            v.demand = Some(Demand {
                compute: demand(now, v.id),
                copy: 0.05,
            });
            v.movable = true;
        }
        commit_all(gs, vs);
        let round = r.observe(now, gs, vs);
        for d in &round.decisions {
            if let Some(x) = vs.iter_mut().find(|x| x.id == d.vgpu) {
                x.gpu = d.to;
            }
            // Every move on its own keeps every GPU within its shares and memory.
            commit_all(gs, vs);
            for g in gs.iter() {
                assert!(
                    g.committed_compute <= WHOLE
                        && g.committed_copy <= WHOLE
                        && g.committed_memory <= g.memory,
                    "{d:?} oversubscribes GPU {}: {g:?}",
                    g.index
                );
            }
        }
        all.extend(round.decisions);
    }
    all
}

/// No vGPU goes back to the GPU it left within the return cool-down.
fn assert_no_return(d: &[Decision], return_cooldown: Nanos) {
    let mut left: BTreeMap<VgpuId, (GpuIndex, Nanos)> = BTreeMap::new();
    for x in d {
        if let Some((g, at)) = left.get(&x.vgpu) {
            assert!(
                !(x.to == *g && x.at - at < return_cooldown),
                "vGPU {} went back to GPU {} after {} ms: {d:#?}",
                x.vgpu,
                g,
                (x.at - at) / MS
            );
        }
        left.insert(x.vgpu, (x.from, x.at));
    }
}
