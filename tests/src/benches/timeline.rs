//! `vgpu-bench timeline PATH...`: where the time between two kernels goes, from the
//! per-request timelines workers write when `VGPU_TIMELINE` is set (see
//! `vgpu_device::timeline`; CSV with a header, CLOCK_MONOTONIC nanoseconds).
//!
//! It prints the median and p99 of each stage of a request (parse, grant wait, backend
//! call, release, used ring), of the guest's turnaround (used ring written to the next
//! request taken; also split by what the guest had waited for: a copy, a short kernel or
//! a long one, [`LONG_KERNEL_NS`] or more in its backend call), of the gap between two
//! kernels of one vGPU, and of the gap between a kernel of one vGPU and the next kernel
//! of another, how often the engine changed hands and how many kernels one vGPU ran in a
//! turn, plus the fraction of the span the backend spent in kernels.

use std::collections::BTreeMap;

/// A kernel whose backend call took this long or longer is a long one: its guest gave up
/// spinning for it (payloads spin 50 µs) and idled.
pub const LONG_KERNEL_NS: u64 = 100_000;
use std::path::{Path, PathBuf};

/// One request's timeline, as the worker wrote it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Rec {
    /// The vGPU.
    pub vgpu: u32,
    /// The queue.
    pub queue: u16,
    /// It was a kernel (took a compute grant).
    pub compute: bool,
    /// It took a grant at all.
    pub gated: bool,
    /// Off the available ring.
    pub kick: u64,
    /// The gate was asked.
    pub asked: u64,
    /// Granted; the backend call began.
    pub granted: u64,
    /// The backend call returned.
    pub backend_end: u64,
    /// The grant was released.
    pub released: u64,
    /// The used ring was written.
    pub used: u64,
}

/// Parses one timeline CSV (the header names the columns).
pub fn parse(text: &str) -> Vec<Rec> {
    let mut lines = text.lines();
    let Some(header) = lines.next() else {
        return Vec::new();
    };
    let cols: Vec<&str> = header.trim().split(',').collect();
    let at = |name: &str| cols.iter().position(|c| *c == name);
    let idx = [
        "vgpu",
        "queue",
        "resource",
        "kick",
        "asked",
        "granted",
        "backend_end",
        "released",
        "used",
    ]
    .map(at);
    let [Some(iv), Some(iq), Some(ir), Some(ik), Some(ia), Some(ig), Some(ie), Some(il), Some(iu)] =
        idx
    else {
        return Vec::new();
    };
    lines
        .filter_map(|l| {
            let f: Vec<&str> = l.trim().split(',').collect();
            let n = |i: usize| f.get(i).and_then(|s| s.parse::<u64>().ok());
            let resource = *f.get(ir)?;
            Some(Rec {
                vgpu: f.get(iv)?.parse().ok()?,
                queue: f.get(iq)?.parse().ok()?,
                compute: resource == "compute",
                gated: resource != "none",
                kick: n(ik)?,
                asked: n(ia)?,
                granted: n(ig)?,
                backend_end: n(ie)?,
                released: n(il)?,
                used: n(iu)?,
            })
        })
        .collect()
}

/// Median and p99 of a sample (ns), None when empty.
fn quantiles(mut v: Vec<u64>) -> Option<(u64, u64, usize)> {
    if v.is_empty() {
        return None;
    }
    v.sort_unstable();
    let q = |p: f64| v[((v.len() - 1) as f64 * p).round() as usize];
    Some((q(0.5), q(0.99), v.len()))
}

/// The analysis, as lines of text.
pub fn analyse(recs: &[Rec]) -> Vec<String> {
    let mut stages: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
    let mut push = |k: &'static str, a: u64, b: u64| {
        if a != 0 && b >= a {
            stages.entry(k).or_default().push(b - a);
        }
    };
    for r in recs.iter().filter(|r| r.gated) {
        let kind = if r.compute { "kernel" } else { "copy" };
        let k = |s: &'static str, c: &'static str| if kind == "kernel" { s } else { c };
        push(
            k("kernel 1 taken -> gate asked", "copy 1 taken -> gate asked"),
            r.kick,
            r.asked,
        );
        push(
            k("kernel 2 grant wait", "copy 2 grant wait"),
            r.asked,
            r.granted,
        );
        push(
            k("kernel 3 backend call", "copy 3 backend call"),
            r.granted,
            r.backend_end,
        );
        push(
            k("kernel 4 release", "copy 4 release"),
            r.backend_end,
            r.released,
        );
        if r.used != 0 && r.used <= r.backend_end {
            // Answered from inside the backend's call: what of the call came after.
            push(
                k(
                    "kernel 5 answered inside the call: used ring -> call's end",
                    "copy 5 answered inside the call: used ring -> call's end",
                ),
                r.used,
                r.backend_end,
            );
        } else {
            push(
                k(
                    "kernel 5 released -> used ring",
                    "copy 5 released -> used ring",
                ),
                r.released,
                r.used,
            );
        }
    }
    // Per vGPU and queue, in order: the guest's turnaround and the kernel-to-kernel gap.
    let mut by_queue: BTreeMap<(u32, u16), Vec<&Rec>> = BTreeMap::new();
    for r in recs {
        by_queue.entry((r.vgpu, r.queue)).or_default().push(r);
    }
    let mut same_gap = Vec::new();
    for q in by_queue.values_mut() {
        q.sort_by_key(|r| r.kick);
        for w in q.windows(2) {
            push(
                "guest turnaround (used ring -> next taken)",
                w[0].used,
                w[1].kick,
            );
            let after = match (w[0].gated, w[0].compute) {
                (false, _) => continue,
                (true, false) => "guest turnaround after a copy",
                (true, true) if w[0].backend_end.saturating_sub(w[0].granted) >= LONG_KERNEL_NS => {
                    "guest turnaround after a long kernel"
                }
                (true, true) => "guest turnaround after a short kernel",
            };
            push(after, w[0].used, w[1].kick);
        }
        let kernels: Vec<&&Rec> = q.iter().filter(|r| r.compute).collect();
        for w in kernels.windows(2) {
            if w[1].granted >= w[0].backend_end {
                same_gap.push(w[1].granted - w[0].backend_end);
            }
        }
    }
    // Across vGPUs: kernels in start order; the gap before a kernel that follows another
    // vGPU's kernel.
    let mut kernels: Vec<&Rec> = recs.iter().filter(|r| r.compute).collect();
    kernels.sort_by_key(|r| r.granted);
    let mut cross_gap = Vec::new();
    let mut busy = 0u64;
    let mut covered_to = 0u64;
    let mut turns = usize::from(!kernels.is_empty());
    for w in kernels.windows(2) {
        if w[0].vgpu != w[1].vgpu {
            turns += 1;
            if w[1].granted >= w[0].backend_end {
                cross_gap.push(w[1].granted - w[0].backend_end);
            }
        }
    }
    for k in &kernels {
        let start = k.granted.max(covered_to);
        if k.backend_end > start {
            busy += k.backend_end - start;
            covered_to = k.backend_end;
        }
    }
    let mut out = vec![format!(
        "{} records, {} vGPUs, {} kernels",
        recs.len(),
        recs.iter()
            .map(|r| r.vgpu)
            .collect::<std::collections::BTreeSet<_>>()
            .len(),
        kernels.len()
    )];
    let line = |name: &str, v: Vec<u64>| {
        quantiles(v).map(|(m, p, n)| {
            format!(
                "{name}: median {:.1} us | p99 {:.1} us | n {n}",
                m as f64 / 1e3,
                p as f64 / 1e3
            )
        })
    };
    for (k, v) in stages {
        out.extend(line(k, v));
    }
    out.extend(line("gap between two kernels of one vGPU", same_gap));
    out.extend(line("gap between kernels of different vGPUs", cross_gap));
    if let (Some(first), Some(last)) =
        (kernels.first(), kernels.iter().map(|k| k.backend_end).max())
    {
        let span = last.saturating_sub(first.granted);
        if turns > 1 && span > 0 {
            out.push(format!(
                "turns (the engine changed hands): {:.0} per second, {:.2} kernels per turn",
                (turns - 1) as f64 / (span as f64 / 1e9),
                kernels.len() as f64 / turns as f64
            ));
        }
        if span > 0 {
            out.push(format!(
                "kernel time / span: {:.3} (backend calls of kernels over {:.1} ms)",
                busy as f64 / span as f64,
                span as f64 / 1e6
            ));
        }
    }
    out
}

/// The timeline files under `paths` (files, or directories holding `timeline-*.csv`).
pub fn files(paths: &[PathBuf]) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for p in paths {
        if p.is_dir() {
            if let Ok(entries) = std::fs::read_dir(p) {
                let mut found: Vec<PathBuf> = entries
                    .filter_map(|e| e.ok().map(|e| e.path()))
                    .filter(|f| is_timeline(f))
                    .collect();
                found.sort();
                out.extend(found);
            }
        } else {
            out.push(p.clone());
        }
    }
    out
}

fn is_timeline(p: &Path) -> bool {
    p.file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.starts_with("timeline-") && n.ends_with(".csv"))
}

/// Reads every file and prints the analysis; an error for an unreadable file.
pub fn run(paths: &[PathBuf]) -> std::io::Result<()> {
    let mut recs = Vec::new();
    for f in files(paths) {
        recs.extend(parse(&std::fs::read_to_string(&f)?));
    }
    for l in analyse(&recs) {
        println!("{l}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const CSV: &str = "vgpu,queue,resource,kick,asked,granted,backend_end,released,used\n\
        1,0,compute,1000,1100,1200,2200,2300,2400\n\
        1,0,compute,3000,3100,3200,4200,4300,4400\n\
        2,0,compute,2500,2600,4500,5500,5600,5700\n\
        1,0,none,6000,0,0,0,0,6100\n";

    #[test]
    fn gaps_and_stages() {
        let recs = parse(CSV);
        assert_eq!(recs.len(), 4);
        let out = analyse(&recs).join("\n");
        // vGPU 1: 2200 -> 3200.
        assert!(
            out.contains("gap between two kernels of one vGPU: median 1.0 us"),
            "{out}"
        );
        // vGPU 1 ends 4200, vGPU 2 starts 4500.
        assert!(
            out.contains("gap between kernels of different vGPUs: median 0.3 us"),
            "{out}"
        );
        assert!(out.contains("kernel 2 grant wait"), "{out}");
        assert!(out.contains("guest turnaround"), "{out}");
        // Three kernels in two turns: vGPU 1's two, then vGPU 2's.
        assert!(out.contains("1.50 kernels per turn"), "{out}");
        // vGPU 1's kernels took 1 µs each (short); it came back 0.6 and 1.6 µs after them.
        assert!(
            out.contains("guest turnaround after a short kernel: median 1.6 us | p99 1.6 us | n 2"),
            "{out}"
        );
        assert!(!out.contains("after a long kernel"), "{out}");
    }

    #[test]
    fn a_kernel_answered_inside_its_call_reports_what_came_after_the_answer() {
        let csv = "vgpu,queue,resource,kick,asked,granted,backend_end,released,used\n\
            1,0,compute,1000,1100,1200,2200,2300,1900\n\
            1,0,compute,3000,3100,3200,4200,4300,4400\n";
        let out = analyse(&parse(csv)).join("\n");
        assert!(
            out.contains("kernel 5 answered inside the call: used ring -> call's end: median 0.3 us | p99 0.3 us | n 1"),
            "{out}"
        );
        assert!(
            out.contains("kernel 5 released -> used ring: median 0.1 us | p99 0.1 us | n 1"),
            "{out}"
        );
    }
}
