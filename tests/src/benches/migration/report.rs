//! The medians of each size, their table, and the figures beside their anchors.

use crate::bench::{median, Figure};

use super::super::shared::fig;
use super::measure::Run;
use super::{label, ms, GIB, MIB};

/// The medians of one point.
pub(super) struct Point {
    pub(super) size: u64,
    pub(super) total_bytes: u64,
    /// Precopy, stop_copy.
    pub(super) modes: [Med; 2],
    /// Plain copy: placing + copying, ms.
    pub(super) plain: f64,
    /// Of which copying, ms.
    pub(super) plain_copy: f64,
}

pub(super) struct Med {
    pub(super) downtime: f64,
    pub(super) drain: f64,
    pub(super) elapsed: f64,
    pub(super) rounds: f64,
    pub(super) precopy_mib: f64,
    pub(super) stop_mib: f64,
    pub(super) stall: f64,
    pub(super) iterations: f64,
}

pub(super) fn med(runs: &[Run]) -> Med {
    let m = |f: &dyn Fn(&Run) -> f64| median(runs.iter().map(f).collect());
    Med {
        downtime: m(&|r| ms(r.report.downtime)),
        drain: m(&|r| ms(r.report.drain)),
        elapsed: m(&|r| ms(r.report.elapsed)),
        rounds: m(&|r| f64::from(r.report.rounds)),
        precopy_mib: m(&|r| r.report.precopy_bytes as f64 / MIB as f64),
        stop_mib: m(&|r| r.report.stop_bytes as f64 / MIB as f64),
        stall: m(&|r| ms(r.stall)),
        iterations: m(&|r| r.iterations as f64),
    }
}

/// vMotion of a V100 vGPU: stun time for 8 GB (VMware, low end of 12-14.5 s).
const VMOTION_STUN_MS: f64 = 12_000.0;
const VMOTION_BYTES: f64 = 8e9;
/// gMig's downtime.
pub(super) const GMIG_MS: f64 = 119.0;
/// The goal: precopy downtime at 4 GiB.
pub(super) const GOAL_MS: f64 = 50.0;

/// Prints the table of every point and whether the goal is met.
pub(super) fn table(points: &[Point]) {
    println!();
    println!(
        "| resident | mode | downtime | of which drain | total time \
         | plain alloc_at + copy (copy alone) | rounds | pre-copied | copied stopped \
         | guest's longest stall | guest iterations |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    for pt in points {
        for (k, name) in ["precopy", "stop_copy"].iter().enumerate() {
            let m = &pt.modes[k];
            println!(
                "| {} | {name} | {:.1} ms | {:.2} ms | {:.0} ms | {:.0} ms ({:.0} ms) | {:.0} \
                 | {:.0} MiB | {:.1} MiB | {:.1} ms | {:.0} |",
                label(pt.size),
                m.downtime,
                m.drain,
                m.elapsed,
                pt.plain,
                pt.plain_copy,
                m.rounds,
                m.precopy_mib,
                m.stop_mib,
                m.stall,
                m.iterations
            );
        }
    }
    println!(
        "| anchors | vMotion, V100 vGPU, 8 GB | stun 12-14.5 s | | | | | | | | |\n\
         | | gMig | 119 ms | | | | | | | | |"
    );
    if let Some(pt) = points.iter().find(|pt| pt.size == 4 * GIB) {
        let d = pt.modes[0].downtime;
        println!(
            "\ngoal (precopy downtime at 4 GiB <= {GOAL_MS:.0} ms): {:.1} ms: {}",
            d,
            if d <= GOAL_MS { "met" } else { "NOT met" }
        );
    } else {
        println!(
            "\ngoal (precopy downtime at 4 GiB <= {GOAL_MS:.0} ms): not measured (4 GiB skipped)"
        );
    }
    println!();
}

/// The figures of every point, each beside its anchor.
pub(super) fn figures(points: &[Point]) -> Vec<Figure> {
    let mut out = Vec::new();
    for pt in points {
        let l = label(pt.size);
        let [pre, stop] = &pt.modes;
        out.push(fig(
            format!("precopy downtime, {l} resident"),
            pre.downtime,
            "ms",
            "gMig downtime",
            GMIG_MS,
        ));
        out.push(fig(
            format!("stop_copy downtime, {l} resident"),
            stop.downtime,
            "ms",
            "vMotion V100 vGPU stun, scaled from 12 s for 8 GB",
            VMOTION_STUN_MS * pt.total_bytes as f64 / VMOTION_BYTES,
        ));
        for (what, value) in [
            ("precopy total time", pre.elapsed),
            ("stop_copy total time", stop.elapsed),
            (
                "plain copy alone (copy_to_peer, placed beforehand)",
                pt.plain_copy,
            ),
        ] {
            out.push(fig(
                format!("{what}, {l} resident"),
                value,
                "ms",
                "plain alloc_at + copy of the same bytes",
                pt.plain,
            ));
        }
        out.push(fig(
            format!("precopy bytes copied, {l} resident"),
            pre.precopy_mib + pre.stop_mib,
            "MiB",
            "resident bytes",
            pt.total_bytes as f64 / MIB as f64,
        ));
        out.push(fig(
            format!("precopy: guest's longest stall, {l} resident"),
            pre.stall,
            "ms",
            "precopy downtime",
            pre.downtime,
        ));
    }
    if let Some(pt) = points.iter().find(|pt| pt.size == 4 * GIB) {
        out.push(fig(
            "goal: precopy downtime at 4 GiB with declared writes".into(),
            pt.modes[0].downtime,
            "ms",
            "goal",
            GOAL_MS,
        ));
    }
    out
}
