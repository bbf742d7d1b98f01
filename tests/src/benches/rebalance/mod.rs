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

mod engines;
mod scenario;
mod sim;
mod workload;

use vgpu_scheduler::clock::{Nanos, MS};

use crate::bench::Figure;

use super::shared::fig;

use scenario::Scenario;
use sim::{simulate, Policy};
use workload::trace;

pub use sim::Outcome;

const GIB: u64 = 1 << 30;
const STEP: Nanos = 50 * MS;
const ROUND: Nanos = 250 * MS;

/// What a migration costs, and the rebalancer settings (vgpud's flags) used with it.
#[derive(Clone, Copy, Debug)]
struct Profile {
    /// How the run is named in the table.
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

/// The conservative cost model: 12 GB/s of pre-copy (a PCIe-class copy) and a 50 ms
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

/// Ten traces per size; the figures are their sums/means (with fewer, the reductions move
/// by up to ±10 points with the choice of seeds).
const SEEDS: [u64; 10] = [11, 23, 37, 41, 53, 67, 79, 83, 97, 101];

/// Runs every scenario; prints the table and returns the figures.
pub fn run() -> Vec<Figure> {
    let mut figures = Vec::new();
    println!("rebalance: fluid simulation in virtual time with vgpud's placement and rebalancing policy (see docs/PERFORMANCE.md)");
    for sc in scenarios() {
        figures.extend(scenario::run(sc));
    }
    figures.extend(light_load());
    println!();
    figures
}

/// The heavy loads on 2 and 4 GPUs, then the DCUDA-like load of each (noted as found).
fn scenarios() -> Vec<Scenario> {
    let sizes = [(2u32, 40usize, 14.0f64), (4, 80, 7.0)];
    let mut scenarios: Vec<Scenario> = sizes
        .iter()
        .map(|&(gpus, n, gap)| Scenario {
            label: "heavy",
            gpus,
            n,
            gap,
        })
        .collect();
    for (gpus, n, gap) in sizes {
        let (g, u) = dcuda_like_gap(gpus, n, gap);
        println!(
            "DCUDA-like load on {gpus} GPUs: one VM per {g:.1} s on average ({:.2}x the heavy gap); {:.1}% of static placement's overload is unavoidable (at most {:.1}% wanted)",
            g / gap,
            100.0 * u,
            100.0 - DCUDA_OVERLOAD
        );
        scenarios.push(Scenario {
            label: "DCUDA-like",
            gpus,
            n,
            gap: g,
        });
    }
    scenarios
}

/// The share of static placement's overload that no placement can avoid (the host as a
/// whole wanted more than all its GPUs have), over the traces of a size.
fn unavoidable_share(gpus: u32, n: usize, gap: f64) -> f64 {
    let sc = Scenario {
        label: "",
        gpus,
        n,
        gap,
    };
    let o = scenario::aggregate(sc, Policy::Static, CONSERVATIVE);
    o.host_overload_s / o.overload_s.max(1e-9)
}

/// DCUDA-like load: DCUDA removed 78.3 % of static assignment's overload, so on its
/// workloads at most 21.7 % of that overload was unavoidable. Our notes on the paper
/// (seed 003) give neither its arrival rate nor its trace, so this picks the heaviest load (the
/// shortest mean gap between arrivals, same mix, same VMs, same seeds) whose unavoidable
/// share under *static placement* is at most 21.7 %. Only the static runs choose it, so
/// it favours no policy; every policy then runs the same traces.
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

/// Light load: consolidation beside static placement on one trace of mostly idle VMs.
fn light_load() -> Vec<Figure> {
    let mut figures = Vec::new();
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
    ));
    figures.push(fig(
        "rebalance light load GPU-hours freed by consolidation".into(),
        freed,
        "GPU-h",
        "GPU-hours of the run",
        co.gpu_h,
    ));
    figures.push(fig(
        "rebalance light load energy saved vs static".into(),
        saved,
        "%",
        "DCUDA",
        DCUDA_ENERGY,
    ));
    figures.push(fig(
        "rebalance light load mean completion, consolidation".into(),
        co.mean_completion_s,
        "s",
        "static placement",
        st.mean_completion_s,
    ));
    figures
}

fn pct_less(ours: f64, base: f64) -> f64 {
    if base > 0.0 {
        100.0 * (base - ours) / base
    } else {
        0.0
    }
}
