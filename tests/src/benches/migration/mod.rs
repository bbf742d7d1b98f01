//! Live migration, in process on the sim backend: downtime and total time of
//! moving a running vGPU between two sim GPUs vs its resident device memory, stop_copy vs
//! precopy, beside the plain copy of the same bytes measured in the same run.
//!
//! The vGPU is a [`Migratable`] over a sim GPU holding `size` bytes in [`PIECES`]
//! allocations filled with a pattern, plus a hot working set: `x` and `y` (4 MiB each) and
//! an 8-byte `out`. While a migration runs, a guest thread keeps launching `saxpy` on the
//! hot buffers (x declared Read, y ReadWrite) and `checksum` over a 256 KiB window of one
//! of the big buffers (declared Read) into `out` (Write), and checks every checksum it
//! reads back. So the declared writes touch 4 MiB + 8 bytes; everything else is pre-copied
//! once. After every migration all bytes are checked: the big buffers against their
//! pattern, x unchanged, y against a shadow of every `saxpy` the guest ran. A mismatch
//! fails the benchmark.
//!
//! The plain copy: `copy_to_peer` of every allocation to a fresh sim GPU (placed with
//! `alloc_at`), no guest, from the same vGPU's memory in the same run.

mod measure;
mod plot;
mod report;
mod tap;
mod vgpu;

use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};
use vgpu_migration::Mode;

use crate::bench::{median, Figure};

use measure::{migrate, plain_copy, Run, Trace};
use report::{med, Point};
use vgpu::Vgpu;

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
/// Resident sizes measured.
const SIZES: [u64; 4] = [64 * MIB, 256 * MIB, GIB, 4 * GIB];
/// Allocations the resident bytes are spread over.
const PIECES: u64 = 8;
/// f32 elements of each hot buffer (x and y: 4 MiB each).
const HOT_N: u64 = 1 << 20;
/// Bytes of a big buffer one guest `checksum` reads.
const WINDOW: u64 = 256 << 10;
/// Host staging for fills and checks.
const CHUNK: u64 = 16 * MIB;
/// The size whose first precopy run is drawn as a timeline.
const TIMELINE_SIZE: u64 = GIB;

/// The benchmark's parameters.
#[derive(Clone, Copy, Debug)]
pub struct Params {
    /// Sim copy bandwidth (both GPUs), bytes/s; 0 = as fast as the host copies.
    pub copy_bandwidth: u64,
    /// Sim compute speed (1.0 = 1e9 element operations/s).
    pub speed: f64,
    /// Runs per point (the median is reported).
    pub reps: usize,
    /// Largest resident size, bytes.
    pub max_size: u64,
}

pub fn run(p: Params) -> Vec<Figure> {
    let sizes = sizes(p);
    println!(
        "sim GPUs: copy bandwidth {} (copy_to_peer is one host memcpy paced by the target's \
         copy engine), speed {}, 1 host thread per kernel; {} allocations + 8 MiB hot; \
         precopy: max_downtime 50 ms, max 8 rounds; median of {} runs",
        if p.copy_bandwidth == 0 {
            "unpaced".to_string()
        } else {
            format!("{:.0} GB/s", p.copy_bandwidth as f64 / 1e9)
        },
        p.speed,
        PIECES,
        p.reps
    );
    let bar = ProgressBar::new((sizes.len() * p.reps * 3) as u64);
    bar.set_style(
        ProgressStyle::with_template("{elapsed:>4} [{bar:30}] {pos}/{len} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let mut timeline = None;
    let points: Vec<Point> = sizes
        .iter()
        .map(|&size| point(p, size, &bar, &mut timeline))
        .collect();
    bar.finish_and_clear();
    report::table(&points);
    let out = report::figures(&points);
    plot::sizes(&points, std::path::Path::new("out/bench-migration.png"));
    if let Some(t) = &timeline {
        plot::timeline(t, std::path::Path::new("out/bench-migration-timeline.png"));
    }
    out
}

/// The sizes up to `p.max_size` that fit in the host's memory, each skipped one noted.
fn sizes(p: Params) -> Vec<u64> {
    let avail = mem_available().unwrap_or(u64::MAX);
    let mut sizes = Vec::new();
    for s in SIZES.into_iter().filter(|s| *s <= p.max_size) {
        // Source and target at once, plus slack for the host's own use.
        let need = 2 * (s + 16 * MIB) + GIB;
        if need > avail {
            println!(
                "note: {} skipped: a migration holds source and target ({} MiB with slack), \
                 {} MiB available",
                label(s),
                need / MIB,
                avail / MIB
            );
        } else {
            sizes.push(s);
        }
    }
    sizes
}

/// Fills a vGPU of `size`, then measures `p.reps` plain copies and migrations of each mode,
/// checking every byte after each; the first precopy of [`TIMELINE_SIZE`] goes to
/// `timeline`.
fn point(p: Params, size: u64, bar: &ProgressBar, timeline: &mut Option<Trace>) -> Point {
    bar.set_message(format!("{}: filling", label(size)));
    let mut v = Vgpu::new(p, size).unwrap_or_else(|e| fail(e));
    v.verify(&format!("{} after the fill", label(size)))
        .unwrap_or_else(|e| fail(e));
    let mut runs: [Vec<Run>; 2] = [Vec::new(), Vec::new()];
    let mut plain = Vec::new();
    let mut plain_only = Vec::new();
    for rep in 0..p.reps {
        bar.set_message(format!("{}: plain copy", label(size)));
        let (all, copy) = plain_copy(p, &v).unwrap_or_else(|e| fail(e));
        plain.push(ms(all));
        plain_only.push(ms(copy));
        bar.inc(1);
        for (k, mode) in [Mode::Precopy, Mode::StopCopy].into_iter().enumerate() {
            bar.set_message(format!("{}: {mode:?} #{}", label(size), rep + 1));
            let want_trace = size == TIMELINE_SIZE && mode == Mode::Precopy && rep == 0;
            let (r, t) = migrate(p, &mut v, mode, want_trace).unwrap_or_else(|e| fail(e));
            v.verify(&format!(
                "{} after {mode:?} migration {}",
                label(size),
                rep + 1
            ))
            .unwrap_or_else(|e| fail(e));
            if t.is_some() {
                *timeline = t;
            }
            runs[k].push(r);
            bar.inc(1);
        }
    }
    let [pre, stop] = runs;
    Point {
        size,
        total_bytes: v.bytes(),
        modes: [med(&pre), med(&stop)],
        plain: median(plain),
        plain_copy: median(plain_only),
    }
}

/// Bytes of memory available now (MemAvailable).
fn mem_available() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/meminfo").ok()?;
    let l = s.lines().find(|l| l.starts_with("MemAvailable:"))?;
    l.split_whitespace()
        .nth(1)?
        .parse::<u64>()
        .ok()
        .map(|kb| kb * 1024)
}

fn fail(e: String) -> ! {
    eprintln!("vgpu-bench migration: FAILED: {e}");
    std::process::exit(1);
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn label(size: u64) -> String {
    if size >= GIB {
        format!("{} GiB", size / GIB)
    } else {
        format!("{} MiB", size / MIB)
    }
}
