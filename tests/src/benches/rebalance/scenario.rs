//! One loaded scenario (heavy or DCUDA-like): every policy over the same traces, the
//! table, and the figures beside static placement and DCUDA.

use crate::bench::Figure;

use super::super::shared::fig;
use super::sim::{simulate, Outcome, Policy};
use super::workload::{trace, KINDS};
use super::{pct_less, Profile, CONSERVATIVE, DCUDA_COMPLETION, DCUDA_OVERLOAD, H200, SEEDS};

/// The short names of the runs in figures, in [`runs`] order.
const SHORT: [&str; 5] = [
    "",
    "placement only",
    "rebalancing 12GB/s",
    "rebalancing H200",
    "clairvoyant",
];

/// A load: its label, GPUs, VMs per trace, and mean gap between arrivals (s).
#[derive(Clone, Copy, Debug)]
pub(super) struct Scenario {
    pub(super) label: &'static str,
    pub(super) gpus: u32,
    pub(super) n: usize,
    pub(super) gap: f64,
}

/// One policy's run over every trace: its name, the aggregate, and each trace's outcome.
struct Agg {
    name: String,
    total: Outcome,
    per: Vec<Outcome>,
}

/// The runs compared: static placement first (the base), the clairvoyant repacker last.
fn runs() -> [(String, Policy, Profile); 5] {
    [
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
    ]
}

/// Runs every policy on the scenario's traces; prints its table and lines and returns
/// its figures.
pub(super) fn run(sc: Scenario) -> Vec<Figure> {
    let Scenario {
        label,
        gpus,
        n,
        gap,
    } = sc;
    let pfx = if label == "heavy" { "" } else { "dcuda-like " };
    let agg: Vec<Agg> = runs()
        .into_iter()
        .map(|(name, p, prof)| {
            let (total, per) = aggregate_per_trace(sc, p, prof);
            Agg { name, total, per }
        })
        .collect();
    println!(
        "\n{label} load, {gpus} GPUs, {} VMs per trace × {} traces (compute-heavy, copy-heavy, bursty, idle; arrivals every {gap:.1} s on average)",
        n,
        SEEDS.len()
    );
    println!(
        "  {:<58} {:>14} {:>12} {:>12} {:>11}",
        "policy", "overload GPU-s", "avg compl s", "p95 compl s", "migrations"
    );
    for a in &agg {
        let o = &a.total;
        println!(
            "  {:<58} {:>14.1} {:>12.1} {:>12.1} {:>11}",
            a.name, o.overload_s, o.mean_completion_s, o.p95_completion_s, o.migrations
        );
    }
    let mut figures = policy_figures(sc, pfx, &agg);
    figures.extend(reductions(gpus, pfx, &agg));
    figures.extend(class_gains(gpus, pfx, &agg));
    figures
}

/// One policy over every trace of the scenario: overload summed, completion times
/// averaged, migrations and classes summed; and each trace's outcome.
pub(super) fn aggregate_per_trace(
    sc: Scenario,
    p: Policy,
    prof: Profile,
) -> (Outcome, Vec<Outcome>) {
    let mut o = Outcome::default();
    let mut per = Vec::new();
    for &s in &SEEDS {
        let r = simulate(
            &trace(s * 1000 + u64::from(sc.gpus), sc.n, sc.gap, false),
            sc.gpus,
            p,
            prof,
        );
        o.overload_s += r.overload_s;
        o.host_overload_s += r.host_overload_s;
        o.mean_completion_s += r.mean_completion_s / SEEDS.len() as f64;
        o.p95_completion_s += r.p95_completion_s / SEEDS.len() as f64;
        o.migrations += r.migrations;
        for k in 0..KINDS.len() {
            o.by_kind[k].0 += r.by_kind[k].0;
            o.by_kind[k].1 += r.by_kind[k].1;
        }
        per.push(r);
    }
    (o, per)
}

/// One policy over every trace of the scenario, aggregated.
pub(super) fn aggregate(sc: Scenario, p: Policy, prof: Profile) -> Outcome {
    aggregate_per_trace(sc, p, prof).0
}

/// Overload and completion times of each policy beside static placement, and the
/// rebalancers' migrations beside the VMs.
fn policy_figures(sc: Scenario, pfx: &str, agg: &[Agg]) -> Vec<Figure> {
    let gpus = sc.gpus;
    let base = &agg[0].total;
    let mut figures = Vec::new();
    for (i, a) in agg.iter().enumerate().skip(1) {
        let o = &a.total;
        for (what, value, anchor, unit) in [
            ("overload time", o.overload_s, base.overload_s, "GPU-s"),
            (
                "mean completion",
                o.mean_completion_s,
                base.mean_completion_s,
                "s",
            ),
            (
                "p95 completion",
                o.p95_completion_s,
                base.p95_completion_s,
                "s",
            ),
        ] {
            figures.push(fig(
                format!("rebalance {}{gpus}gpu {what}, {}", pfx, SHORT[i]),
                value,
                unit,
                "static placement",
                anchor,
            ));
        }
    }
    for i in [2, 3] {
        figures.push(Figure {
            name: format!("rebalance {}{gpus}gpu migrations, {}", pfx, SHORT[i]),
            value: agg[i].total.migrations as f64,
            unit: "moves".into(),
            anchor_name: "VMs".into(),
            anchor: (sc.n * SEEDS.len()) as f64,
            anchor_unit: "VMs".into(),
        });
    }
    figures
}

/// The rebalancers' and the clairvoyant repacker's overload-time reduction and mean
/// completion-time gain over static placement, beside DCUDA's.
fn reductions(gpus: u32, pfx: &str, agg: &[Agg]) -> Vec<Figure> {
    let base = &agg[0].total;
    let oracle = &agg[4].total;
    let oracle_red = pct_less(oracle.overload_s, base.overload_s);
    let mut figures = Vec::new();
    for i in [2, 3] {
        let o = &agg[i].total;
        let red = pct_less(o.overload_s, base.overload_s);
        let gain = pct_less(o.mean_completion_s, base.mean_completion_s);
        println!(
            "  {}: overload-time reduction {red:.1}% (DCUDA {DCUDA_OVERLOAD}%; clairvoyant repacking {oracle_red:.1}%), mean completion-time gain {gain:.1}% (DCUDA up to {DCUDA_COMPLETION}%)",
            SHORT[i]
        );
        figures.push(fig(
            format!(
                "rebalance {}{gpus}gpu overload-time reduction, {}",
                pfx, SHORT[i]
            ),
            red,
            "%",
            "DCUDA",
            DCUDA_OVERLOAD,
        ));
        figures.push(fig(
            format!(
                "rebalance {}{gpus}gpu mean completion-time gain, {}",
                pfx, SHORT[i]
            ),
            gain,
            "%",
            "DCUDA",
            DCUDA_COMPLETION,
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
    ));
    let best = &agg[3].total;
    println!(
        "  the host as a whole wanted more than its {gpus} GPUs have for {:.1} s: overload no placement avoids; of the avoidable {:.1} GPU-s, rebalancing (H200) removed {:.1}%",
        base.host_overload_s,
        base.overload_s - base.host_overload_s,
        100.0 * (base.overload_s - best.overload_s)
            / (base.overload_s - base.host_overload_s).max(1e-9)
    );
    figures
}

/// The mean of class `k`'s completion times in `o`.
fn class_mean(o: &Outcome, k: usize) -> f64 {
    o.by_kind[k].0 / o.by_kind[k].1.max(1) as f64
}

/// Completion-time gain per workload class and per trace (H200 rebalancing vs static):
/// DCUDA's "up to 42.1 %" is a best case over its workloads, so the best class and the
/// best trace are shown beside the mean over all VMs.
fn class_gains(gpus: u32, pfx: &str, agg: &[Agg]) -> Vec<Figure> {
    let (base, best) = (&agg[0].total, &agg[3].total);
    let mut figures = Vec::new();
    let mut line = String::from("  completion-time gain per class (mean over its VMs):");
    let mut best_class = f64::MIN;
    for (k, kind) in KINDS.iter().enumerate() {
        let g = pct_less(class_mean(best, k), class_mean(base, k));
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
        ));
    }
    println!("{}", line.trim_end_matches(','));
    let per_trace: Vec<f64> = agg[0]
        .per
        .iter()
        .zip(&agg[3].per)
        .map(|(s, r)| pct_less(r.mean_completion_s, s.mean_completion_s))
        .collect();
    let best_trace = per_trace.iter().copied().fold(f64::MIN, f64::max);
    let mut best_cell = f64::MIN;
    for (s, r) in agg[0].per.iter().zip(&agg[3].per) {
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
    for (what, value) in [
        ("best per-trace completion-time gain", best_trace),
        ("best class completion-time gain", best_class),
    ] {
        figures.push(fig(
            format!("rebalance {}{gpus}gpu {what}, rebalancing H200", pfx),
            value,
            "%",
            "DCUDA (best case)",
            DCUDA_COMPLETION,
        ));
    }
    figures
}
