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

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use vgpu_backend::sync::lock;
use vgpu_backend::{
    Access, Allocated, ArgValue, Backend, LaunchConfig, ModuleImage, Relocatable, SimConfig, SimGpu,
};
use vgpu_migration::{Migratable, MigrateOptions, Mode, Phase, Progress, Report};
use vm_memory::VolatileSlice;

use crate::bench::{median, Figure};

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

// ---------------------------------------------------------------------------------------
// A sim GPU that records when bytes arrive (for the timeline's bytes-over-time line).

/// A [`SimGpu`] that logs every incoming copy (in pieces of [`CHUNK`]) and every
/// allocation placed with `alloc_at`.
struct Tap {
    gpu: SimGpu,
    log: Mutex<Vec<(Instant, u64)>>,
    placed: Mutex<Vec<(Instant, u64)>>,
}

impl Tap {
    fn new(p: Params, memory: u64) -> Arc<Self> {
        let gpu = SimGpu::new(SimConfig {
            name: "migbench".into(),
            memory,
            copy_bandwidth: p.copy_bandwidth,
            speed: p.speed,
            threads: 1,
            ..SimConfig::default()
        })
        .unwrap_or_else(|e| fail(format!("sim GPU: {e}")));
        Arc::new(Self {
            gpu,
            log: Mutex::new(Vec::new()),
            placed: Mutex::new(Vec::new()),
        })
    }

    fn log(&self) -> Vec<(Instant, u64)> {
        lock(&self.log).clone()
    }

    fn placed(&self) -> Vec<(Instant, u64)> {
        lock(&self.placed).clone()
    }
}

impl Backend for Tap {
    fn copy_htod(&self, dst: u64, src: &VolatileSlice<'_>) -> vgpu_backend::Result<u64> {
        let len = src.len() as u64;
        let mut off = 0;
        while off < len {
            let n = CHUNK.min(len - off);
            let piece = src
                .subslice(off as usize, n as usize)
                .map_err(|e| vgpu_backend::BackendError::Device(format!("slice: {e}")))?;
            self.gpu.copy_htod(dst + off, &piece)?;
            lock(&self.log).push((Instant::now(), n));
            off += n;
        }
        Ok(len)
    }
    fn relocation(&self) -> Option<&dyn Relocatable> {
        Some(self)
    }

    vgpu_backend::forward_backend!(gpu:
        info, memory_usage, alloc, free, check_range, copy_dtoh, copy_dtod, memset,
        module_load, module_unload, get_function, launch, synchronize, register_host_memory,
        import_shared, unregister_host_memory, paging
    );
}

/// The sim's relocation, logging every allocation placed.
impl Relocatable for Tap {
    fn alloc_at(&self, addr: u64, size: u64) -> vgpu_backend::Result<Allocated> {
        let a = self.gpu.alloc_at(addr, size)?;
        lock(&self.placed).push((Instant::now(), size));
        Ok(a)
    }
    fn copy_to_peer(&self, peer: &dyn Backend, addr: u64, len: u64) -> vgpu_backend::Result<u64> {
        self.gpu.copy_to_peer(peer, addr, len)
    }
}

// ---------------------------------------------------------------------------------------
// Contents and checks.

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// Word `i` of the big buffer with `seed` (splitmix64).
fn word(seed: u64, i: u64) -> u64 {
    let mut z = ((seed << 40) ^ i).wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The pattern bytes of words `first..` into `buf`.
fn pattern_into(seed: u64, first: u64, buf: &mut [u8]) {
    for (k, w) in buf.chunks_exact_mut(8).enumerate() {
        w.copy_from_slice(&word(seed, first + k as u64).to_le_bytes());
    }
}

fn x_at(i: u64) -> f32 {
    (i % 7) as f32
}

/// y after `k` launches of `y += 1.0 * x` (integers below 2^24: exact in f32).
fn y_at(i: u64, k: u64) -> f32 {
    ((i % 5) + k * (i % 7)) as f32
}

fn f32_bytes(n: u64, f: impl Fn(u64) -> f32) -> Vec<u8> {
    (0..n).flat_map(|i| f(i).to_le_bytes()).collect()
}

fn put(b: &dyn Backend, addr: u64, bytes: &mut [u8]) -> Result<(), String> {
    b.copy_htod(addr, &VolatileSlice::from(bytes))
        .map(|_| ())
        .map_err(|e| e.to_string())
}

fn get(b: &dyn Backend, addr: u64, bytes: &mut [u8]) -> Result<(), String> {
    b.copy_dtoh(addr, &VolatileSlice::from(bytes))
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// A big buffer: address, size, pattern seed.
#[derive(Clone, Copy)]
struct Big {
    addr: u64,
    size: u64,
    seed: u64,
}

/// The hot working set and the guest's functions.
#[derive(Clone, Copy)]
struct Hot {
    x: u64,
    y: u64,
    out: u64,
    saxpy: u64,
    checksum: u64,
}

struct Vgpu {
    m: Arc<Migratable>,
    big: Vec<Big>,
    hot: Hot,
    /// `saxpy` launches so far (the shadow of y).
    launches: u64,
}

impl Vgpu {
    fn new(p: Params, size: u64) -> Result<Self, String> {
        let e = |e: vgpu_backend::BackendError| e.to_string();
        let src = Tap::new(p, size + 64 * MIB);
        let m = Arc::new(Migratable::new(src));
        let piece = size / PIECES;
        let mut buf = vec![0u8; CHUNK as usize];
        let mut big = Vec::new();
        for k in 0..PIECES {
            let b = Big {
                addr: m.alloc(piece).map_err(e)?.addr,
                size: piece,
                seed: k + 1,
            };
            let mut off = 0;
            while off < piece {
                let n = CHUNK.min(piece - off) as usize;
                pattern_into(b.seed, off / 8, &mut buf[..n]);
                put(&*m, b.addr + off, &mut buf[..n])?;
                off += n as u64;
            }
            big.push(b);
        }
        let module = m.module_load(ModuleImage::Builtin(b"builtin")).map_err(e)?;
        let hot = Hot {
            x: m.alloc(HOT_N * 4).map_err(e)?.addr,
            y: m.alloc(HOT_N * 4).map_err(e)?.addr,
            out: m.alloc(8).map_err(e)?.addr,
            saxpy: m.get_function(module, b"saxpy").map_err(e)?.handle,
            checksum: m.get_function(module, b"checksum").map_err(e)?.handle,
        };
        put(&*m, hot.x, &mut f32_bytes(HOT_N, x_at))?;
        put(&*m, hot.y, &mut f32_bytes(HOT_N, |i| y_at(i, 0)))?;
        Ok(Self {
            m,
            big,
            hot,
            launches: 0,
        })
    }

    /// Every allocation: (address, size).
    fn allocs(&self) -> Vec<(u64, u64)> {
        let mut v: Vec<(u64, u64)> = self.big.iter().map(|b| (b.addr, b.size)).collect();
        v.extend([
            (self.hot.x, HOT_N * 4),
            (self.hot.y, HOT_N * 4),
            (self.hot.out, 8),
        ]);
        v
    }

    fn bytes(&self) -> u64 {
        self.allocs().iter().map(|a| a.1).sum()
    }

    /// Checks every byte: big buffers against their pattern, x unchanged, y against the
    /// shadow of `launches` saxpys.
    fn verify(&self, what: &str) -> Result<(), String> {
        let mut got = vec![0u8; CHUNK as usize];
        let mut want = vec![0u8; CHUNK as usize];
        for (k, b) in self.big.iter().enumerate() {
            let mut off = 0;
            while off < b.size {
                let n = CHUNK.min(b.size - off) as usize;
                get(&*self.m, b.addr + off, &mut got[..n])?;
                pattern_into(b.seed, off / 8, &mut want[..n]);
                if got[..n] != want[..n] {
                    let i = got[..n]
                        .iter()
                        .zip(&want[..n])
                        .position(|(a, b)| a != b)
                        .unwrap_or(0);
                    return Err(format!(
                        "{what}: big buffer {k} ({:#x}) byte {} is {:#04x}, want {:#04x}",
                        b.addr,
                        off + i as u64,
                        got[i],
                        want[i]
                    ));
                }
                off += n as u64;
            }
        }
        let mut v = vec![0u8; (HOT_N * 4) as usize];
        for (name, addr, f) in [
            ("x", self.hot.x, &x_at as &dyn Fn(u64) -> f32),
            ("y", self.hot.y, &|i| y_at(i, self.launches)),
        ] {
            get(&*self.m, addr, &mut v)?;
            for (i, c) in v.chunks_exact(4).enumerate() {
                let g = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
                let w = f(i as u64);
                if g.to_bits() != w.to_bits() {
                    return Err(format!(
                        "{what}: {name}[{i}] = {g}, want {w} after {} saxpy launches",
                        self.launches
                    ));
                }
            }
        }
        Ok(())
    }
}

const CFG: LaunchConfig = LaunchConfig {
    grid: [1, 1, 1],
    block: [1, 1, 1],
    shared_bytes: 0,
};

fn ptr(addr: u64, access: Access) -> ArgValue {
    ArgValue::Ptr { addr, access }
}

/// The guest: saxpy on the hot buffers, then a checksum of a window of a big buffer
/// (checked), until `stop`. Returns the saxpy launches and when each iteration ended.
fn guest(
    m: &Migratable,
    hot: Hot,
    big: &[Big],
    stop: &AtomicBool,
) -> Result<(u64, Vec<Instant>), String> {
    let e = |e: vgpu_backend::BackendError| e.to_string();
    let mut launches = 0;
    let mut ends = Vec::new();
    let mut window = vec![0u8; WINDOW as usize];
    let mut it = 0u64;
    while !stop.load(Ordering::Relaxed) {
        m.launch(
            hot.saxpy,
            &CFG,
            &[
                ArgValue::F32(1.0),
                ptr(hot.x, Access::Read),
                ptr(hot.y, Access::ReadWrite),
                ArgValue::U64(HOT_N),
            ],
        )
        .map_err(e)?;
        launches += 1;
        let b = big[(it % big.len() as u64) as usize];
        let off = it.wrapping_mul(7919).wrapping_mul(WINDOW) % (b.size - WINDOW) / 8 * 8;
        m.launch(
            hot.checksum,
            &CFG,
            &[
                ptr(b.addr + off, Access::Read),
                ArgValue::U64(WINDOW),
                ptr(hot.out, Access::Write),
            ],
        )
        .map_err(e)?;
        let mut h = [0u8; 8];
        get(m, hot.out, &mut h)?;
        pattern_into(b.seed, off / 8, &mut window);
        let want = window.iter().fold(FNV_OFFSET, |h, b| {
            (h ^ u64::from(*b)).wrapping_mul(FNV_PRIME)
        });
        if u64::from_le_bytes(h) != want {
            return Err(format!(
                "guest: checksum of {:#x}+{off:#x} read {:#x}, want {want:#x}",
                b.addr,
                u64::from_le_bytes(h)
            ));
        }
        ends.push(Instant::now());
        it += 1;
    }
    Ok((launches, ends))
}

// ---------------------------------------------------------------------------------------
// One migration, one plain copy.

struct Run {
    report: Report,
    /// The longest gap between two guest iterations (what the guest felt).
    stall: Duration,
    /// Guest iterations during the run.
    iterations: usize,
}

/// What the timeline plot needs of one migration (times since its start).
struct Trace {
    report: Report,
    progress: Vec<Progress>,
    /// (time, bytes arrived so far) at the target.
    arrived: Vec<(Duration, u64)>,
    /// (time, bytes placed so far) at the target (`alloc_at`: commit + zero).
    placed: Vec<(Duration, u64)>,
    /// Guest iterations' ends.
    guest: Vec<Duration>,
    size: u64,
}

fn migrate(
    p: Params,
    v: &mut Vgpu,
    mode: Mode,
    trace: bool,
) -> Result<(Run, Option<Trace>), String> {
    let size = v.bytes();
    let target = Tap::new(p, size + 64 * MIB);
    let opts = MigrateOptions {
        mode,
        ..MigrateOptions::default()
    };
    let stop = AtomicBool::new(false);
    let mut progress = Vec::new();
    let (m, hot, big) = (&*v.m, v.hot, &v.big);
    let (report, guest_out, start) = std::thread::scope(|s| {
        let g = s.spawn(|| guest(m, hot, big, &stop));
        // The guest runs a while first, and on the target after.
        std::thread::sleep(Duration::from_millis(30));
        let start = Instant::now();
        let r = m.migrate(target.clone(), &opts, |pr| progress.push(*pr));
        std::thread::sleep(Duration::from_millis(30));
        stop.store(true, Ordering::Relaxed);
        let out = g
            .join()
            .unwrap_or_else(|_| Err("the guest thread panicked".into()));
        (r, out, start)
    });
    let report = report.map_err(|e| format!("{mode:?} migration: {e}"))?;
    let (launches, ends) = guest_out?;
    v.launches += launches;
    let stall = ends
        .windows(2)
        .map(|w| w[1] - w[0])
        .max()
        .unwrap_or_default();
    let trace = trace.then(|| {
        let cumulative = |log: Vec<(Instant, u64)>| {
            let mut total = 0;
            log.into_iter()
                .filter(|(t, _)| *t >= start)
                .map(|(t, n)| {
                    total += n;
                    (t - start, total)
                })
                .collect::<Vec<_>>()
        };
        let arrived = cumulative(target.log());
        let placed = cumulative(target.placed());
        Trace {
            report: report.clone(),
            progress,
            arrived,
            placed,
            guest: ends
                .iter()
                .filter(|t| **t >= start)
                .map(|t| *t - start)
                .collect(),
            size,
        }
    });
    // Only the vGPU holds its new GPU now (the old one is gone once unused).
    drop(target);
    Ok((
        Run {
            report,
            stall,
            iterations: ends.len(),
        },
        trace,
    ))
}

/// Places every allocation of `v` on a fresh sim GPU (`alloc_at`: the sim commits and
/// zeroes the memory then) and `copy_to_peer`s it there, no guest: what any migration has
/// to do. Returns (placing + copying, copying alone).
fn plain_copy(p: Params, v: &Vgpu) -> Result<(Duration, Duration), String> {
    let e = |e: vgpu_backend::BackendError| e.to_string();
    let target = Tap::new(p, v.bytes() + 64 * MIB);
    let allocs = v.allocs();
    let src = v.m.current();
    let t = Instant::now();
    for (a, n) in &allocs {
        target.alloc_at(*a, *n).map_err(e)?;
    }
    let c = Instant::now();
    for (a, n) in &allocs {
        vgpu_backend::copy_to_peer(&*src, &*target, *a, *n).map_err(e)?;
    }
    Ok((t.elapsed(), c.elapsed()))
}

// ---------------------------------------------------------------------------------------

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

/// The medians of one point.
struct Point {
    size: u64,
    total_bytes: u64,
    /// Precopy, stop_copy.
    modes: [Med; 2],
    /// Plain copy: placing + copying, ms.
    plain: f64,
    /// Of which copying, ms.
    plain_copy: f64,
}

struct Med {
    downtime: f64,
    drain: f64,
    elapsed: f64,
    rounds: f64,
    precopy_mib: f64,
    stop_mib: f64,
    stall: f64,
    iterations: f64,
}

fn med(runs: &[Run]) -> Med {
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
const GMIG_MS: f64 = 119.0;
/// The goal: precopy downtime at 4 GiB.
const GOAL_MS: f64 = 50.0;

fn fig(name: String, value: f64, unit: &str, anchor_name: &str, anchor: f64) -> Figure {
    Figure {
        name,
        value,
        unit: unit.into(),
        anchor_name: anchor_name.into(),
        anchor,
        anchor_unit: unit.into(),
    }
}

pub fn run(p: Params) -> Vec<Figure> {
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
    let mut points = Vec::new();
    let mut timeline = None;
    for &size in &sizes {
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
                    timeline = t;
                }
                runs[k].push(r);
                bar.inc(1);
            }
        }
        let [pre, stop] = runs;
        points.push(Point {
            size,
            total_bytes: v.bytes(),
            modes: [med(&pre), med(&stop)],
            plain: median(plain),
            plain_copy: median(plain_only),
        });
    }
    bar.finish_and_clear();

    println!();
    println!(
        "| resident | mode | downtime | of which drain | total time \
         | plain alloc_at + copy (copy alone) | rounds | pre-copied | copied stopped \
         | guest's longest stall | guest iterations |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    for pt in &points {
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

    let mut out = Vec::new();
    for pt in &points {
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
        out.push(fig(
            format!("precopy total time, {l} resident"),
            pre.elapsed,
            "ms",
            "plain alloc_at + copy of the same bytes",
            pt.plain,
        ));
        out.push(fig(
            format!("stop_copy total time, {l} resident"),
            stop.elapsed,
            "ms",
            "plain alloc_at + copy of the same bytes",
            pt.plain,
        ));
        out.push(fig(
            format!("plain copy alone (copy_to_peer, placed beforehand), {l} resident"),
            pt.plain_copy,
            "ms",
            "plain alloc_at + copy of the same bytes",
            pt.plain,
        ));
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
    plot::sizes(&points, std::path::Path::new("out/bench-migration.png"));
    if let Some(t) = &timeline {
        plot::timeline(t, std::path::Path::new("out/bench-migration-timeline.png"));
    }
    out
}

// ---------------------------------------------------------------------------------------
// Plots: plotters for shapes, embedded-graphics' bitmap font for text (no system fonts).

mod plot {
    use std::path::Path;

    use embedded_graphics::mono_font::ascii::{FONT_6X10, FONT_9X15_BOLD};
    use embedded_graphics::mono_font::MonoTextStyle;
    use embedded_graphics::pixelcolor::{Rgb888, RgbColor as _};
    use embedded_graphics::prelude::{DrawTarget, OriginDimensions, Point as EgPoint, Size};
    use embedded_graphics::text::{Baseline, Text};
    use embedded_graphics::Drawable;
    use plotters::coord::Shift;
    use plotters::prelude::*;

    use super::{label, Phase, Point, Trace, GMIG_MS, GOAL_MS, MIB};

    const BLUE: RGBColor = RGBColor(31, 119, 180);
    const RED: RGBColor = RGBColor(214, 39, 40);
    const GREEN: RGBColor = RGBColor(44, 160, 44);
    const GRAY: RGBColor = RGBColor(120, 120, 120);
    const GRID: RGBColor = RGBColor(225, 225, 225);

    type Area<'a> = DrawingArea<BitMapBackend<'a>, Shift>;

    struct Canvas<'a, 'b> {
        area: &'a Area<'b>,
        size: (u32, u32),
    }

    impl OriginDimensions for Canvas<'_, '_> {
        fn size(&self) -> Size {
            Size::new(self.size.0, self.size.1)
        }
    }

    impl DrawTarget for Canvas<'_, '_> {
        type Color = Rgb888;
        type Error = std::convert::Infallible;

        fn draw_iter<I>(&mut self, pixels: I) -> Result<(), Self::Error>
        where
            I: IntoIterator<Item = embedded_graphics::Pixel<Self::Color>>,
        {
            for embedded_graphics::Pixel(p, c) in pixels {
                let _ = self
                    .area
                    .draw_pixel((p.x, p.y), &RGBColor(c.r(), c.g(), c.b()));
            }
            Ok(())
        }
    }

    fn text(area: &Area<'_>, s: &str, x: i32, y: i32, bold: bool, c: RGBColor) {
        let (w, h) = area.dim_in_pixel();
        let mut canvas = Canvas { area, size: (w, h) };
        let font = if bold { &FONT_9X15_BOLD } else { &FONT_6X10 };
        let _ = Text::with_baseline(
            s,
            EgPoint::new(x, y),
            MonoTextStyle::new(font, Rgb888::new(c.0, c.1, c.2)),
            Baseline::Top,
        )
        .draw(&mut canvas);
    }

    fn err(e: &dyn std::fmt::Display) -> String {
        e.to_string()
    }

    /// A round step of about `span / 8`.
    fn tick_step(span: f64) -> f64 {
        let raw = (span / 8.0).max(1e-9);
        let p = 10f64.powf(raw.log10().floor());
        [1.0, 2.0, 5.0, 10.0]
            .into_iter()
            .map(|m| m * p)
            .find(|s| *s >= raw)
            .unwrap_or(10.0 * p)
    }

    /// One log-y panel of ms vs size (x = log2 MiB).
    #[allow(clippy::type_complexity)]
    fn panel(
        root: &Area<'_>,
        area: &Area<'_>,
        title: &str,
        lines: &[(&str, RGBColor, Vec<(f64, f64)>)],
        refs: &[(&str, f64)],
        sizes: &[u64],
    ) -> Result<(), String> {
        let ys = lines
            .iter()
            .flat_map(|l| l.2.iter().map(|p| p.1))
            .chain(refs.iter().map(|r| r.1));
        let (lo, hi) = ys.fold((f64::MAX, f64::MIN), |(a, b), y| (a.min(y), b.max(y)));
        let lo = 10f64.powf(lo.max(1e-3).log10().floor());
        let hi = 10f64.powf(hi.max(lo * 10.0).log10().ceil());
        let x_lo = (sizes.first().copied().unwrap_or(MIB) / MIB) as f64;
        let x_hi = (sizes.last().copied().unwrap_or(MIB) / MIB) as f64;
        let (x_lo, x_hi) = (x_lo.log2() - 0.5, x_hi.log2().max(x_lo.log2() + 1.0) + 0.5);
        let mut chart = ChartBuilder::on(area)
            .margin_left(70)
            .margin_right(20)
            .margin_top(50)
            .margin_bottom(50)
            .build_cartesian_2d(x_lo..x_hi, (lo..hi).log_scale())
            .map_err(|e| err(&e))?;
        let mut decades = Vec::new();
        let mut d = lo;
        while d <= hi * 1.001 {
            decades.push(d);
            d *= 10.0;
        }
        for &y in &decades {
            chart
                .draw_series(std::iter::once(PathElement::new(
                    vec![(x_lo, y), (x_hi, y)],
                    GRID,
                )))
                .map_err(|e| err(&e))?;
        }
        for (name, y) in refs {
            chart
                .draw_series(DashedLineSeries::new(
                    vec![(x_lo, *y), (x_hi, *y)],
                    8,
                    6,
                    GRAY.stroke_width(1),
                ))
                .map_err(|e| err(&e))?;
            let (px, py) = chart.backend_coord(&(x_lo, *y));
            text(root, name, px + 6, py - 12, false, GRAY);
        }
        for (_, c, pts) in lines {
            chart
                .draw_series(LineSeries::new(pts.iter().copied(), c.stroke_width(2)))
                .map_err(|e| err(&e))?;
            chart
                .draw_series(pts.iter().map(|p| Circle::new(*p, 3, c.filled())))
                .map_err(|e| err(&e))?;
        }
        let (x0, y0) = chart.backend_coord(&(x_lo, lo));
        let (x1, y1) = chart.backend_coord(&(x_hi, hi));
        root.draw(&Rectangle::new([(x0, y1), (x1, y0)], BLACK.stroke_width(1)))
            .map_err(|e| err(&e))?;
        text(root, title, x0, 28, true, BLACK);
        for &y in &decades {
            let (_, py) = chart.backend_coord(&(x_lo, y));
            let s = if y >= 1.0 {
                format!("{y:>6.0}")
            } else {
                format!("{y:>6}")
            };
            text(root, &s, x0 - 44, py - 5, false, BLACK);
        }
        text(root, "ms", x0 - 60, (y0 + y1) / 2, false, BLACK);
        for &s in sizes {
            let (px, _) = chart.backend_coord(&(((s / MIB) as f64).log2(), lo));
            let l = label(s);
            text(root, &l, px - 3 * l.len() as i32, y0 + 6, false, BLACK);
        }
        text(
            root,
            "resident device memory",
            (x0 + x1) / 2 - 66,
            y0 + 22,
            false,
            BLACK,
        );
        let mut ly = y1 + 8;
        for (name, c, _) in lines {
            root.draw(&PathElement::new(
                vec![(x0 + 10, ly + 5), (x0 + 34, ly + 5)],
                c.stroke_width(2),
            ))
            .map_err(|e| err(&e))?;
            text(root, name, x0 + 40, ly, false, *c);
            ly += 14;
        }
        Ok(())
    }

    fn sizes_png(points: &[Point], path: &Path) -> Result<(), String> {
        if let Some(d) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(d).map_err(|e| err(&e))?;
        }
        let (w, h) = (1280u32, 560u32);
        let root = BitMapBackend::new(path, (w, h)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| err(&e))?;
        let x = |pt: &Point| ((pt.size / MIB) as f64).log2();
        let series = |k: usize, f: fn(&super::Med) -> f64| -> Vec<(f64, f64)> {
            points
                .iter()
                .map(|pt| (x(pt), f(&pt.modes[k]).max(1e-3)))
                .collect()
        };
        let plain: Vec<(f64, f64)> = points.iter().map(|pt| (x(pt), pt.plain)).collect();
        let copy: Vec<(f64, f64)> = points.iter().map(|pt| (x(pt), pt.plain_copy)).collect();
        let sizes: Vec<u64> = points.iter().map(|pt| pt.size).collect();
        text(
            &root,
            "vGPU live migration between two sim GPUs, guest running (median of runs)",
            20,
            6,
            true,
            BLACK,
        );
        let (left, right) = root.split_horizontally(w / 2);
        panel(
            &root,
            &left,
            "downtime (dispatch stopped)",
            &[
                ("precopy, declared writes", BLUE, series(0, |m| m.downtime)),
                ("stop_copy", RED, series(1, |m| m.downtime)),
                (
                    "plain alloc_at + copy of the same bytes",
                    GREEN,
                    plain.clone(),
                ),
            ],
            &[("goal 50 ms", GOAL_MS), ("gMig 119 ms", GMIG_MS)],
            &sizes,
        )?;
        panel(
            &root,
            &right,
            "total migration time",
            &[
                ("precopy", BLUE, series(0, |m| m.elapsed)),
                ("stop_copy", RED, series(1, |m| m.elapsed)),
                ("plain alloc_at + copy of the same bytes", GREEN, plain),
                ("plain copy alone (placed beforehand)", GRAY, copy),
            ],
            &[],
            &sizes,
        )?;
        root.present().map_err(|e| err(&e))?;
        Ok(())
    }

    pub(super) fn sizes(points: &[Point], path: &Path) {
        match sizes_png(points, path) {
            Ok(()) => println!(
                "(plot of downtime and total time vs size: {})",
                path.display()
            ),
            Err(e) => eprintln!("vgpu-bench migration: cannot draw {}: {e}", path.display()),
        }
    }

    fn timeline_png(t: &Trace, path: &Path) -> Result<(), String> {
        if let Some(d) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(d).map_err(|e| err(&e))?;
        }
        let (w, h) = (1100u32, 560u32);
        let root = BitMapBackend::new(path, (w, h)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| err(&e))?;
        let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
        let r = &t.report;
        let t_max = ms(r.elapsed) * 1.08;
        let mib = |b: u64| b as f64 / MIB as f64;
        let y_max = t.arrived.last().map_or(1.0, |a| mib(a.1)).max(mib(t.size)) * 1.12;
        let mut chart = ChartBuilder::on(&root)
            .margin_left(80)
            .margin_right(30)
            .margin_top(70)
            .margin_bottom(60)
            .build_cartesian_2d(0f64..t_max, 0f64..y_max)
            .map_err(|e| err(&e))?;
        let (x0, y0) = chart.backend_coord(&(0.0, 0.0));
        let (x1, y1) = chart.backend_coord(&(t_max, y_max));
        // Phase spans: each pre-copy round (from the progress reports), draining, stop_copy.
        let mut spans: Vec<(String, f64, f64, RGBColor)> = Vec::new();
        let mut prev = r
            .timeline
            .iter()
            .find(|s| s.0 == Phase::Precopy)
            .map_or(0.0, |s| ms(s.1));
        for p in t.progress.iter().filter(|p| p.phase == Phase::Precopy) {
            let end = ms(p.elapsed);
            let c = if p.rounds % 2 == 1 {
                RGBColor(198, 219, 239)
            } else {
                RGBColor(158, 202, 225)
            };
            spans.push((format!("precopy round {}", p.rounds), prev, end, c));
            prev = end;
        }
        for (phase, s, e) in &r.timeline {
            let c = match phase {
                Phase::Draining => RGBColor(255, 187, 120),
                Phase::StopCopy => RGBColor(255, 152, 150),
                _ => continue,
            };
            spans.push((phase.name().to_string(), ms(*s), ms(*e), c));
        }
        for (_, s, e, c) in &spans {
            let (sx, _) = chart.backend_coord(&(*s, 0.0));
            let (ex, _) = chart.backend_coord(&(*e, 0.0));
            root.draw(&Rectangle::new(
                [(sx, y1), (ex.max(sx + 3), y0)],
                c.filled(),
            ))
            .map_err(|e| err(&e))?;
        }
        let x_step = tick_step(t_max);
        let y_step = tick_step(y_max);
        let mut x = 0.0;
        while x <= t_max {
            chart
                .draw_series(std::iter::once(PathElement::new(
                    vec![(x, 0.0), (x, y_max)],
                    GRID,
                )))
                .map_err(|e| err(&e))?;
            let (px, _) = chart.backend_coord(&(x, 0.0));
            text(&root, &format!("{x:.0}"), px - 6, y0 + 6, false, BLACK);
            x += x_step;
        }
        let mut y = 0.0;
        while y <= y_max {
            chart
                .draw_series(std::iter::once(PathElement::new(
                    vec![(0.0, y), (t_max, y)],
                    GRID,
                )))
                .map_err(|e| err(&e))?;
            let (_, py) = chart.backend_coord(&(0.0, y));
            text(&root, &format!("{y:>6.0}"), x0 - 44, py - 5, false, BLACK);
            y += y_step;
        }
        // Target memory placed (alloc_at), then bytes arrived, over time.
        let mut placed = vec![(0.0, 0.0)];
        placed.extend(t.placed.iter().map(|(d, b)| (ms(*d), mib(*b))));
        chart
            .draw_series(LineSeries::new(placed, GRAY.stroke_width(1)))
            .map_err(|e| err(&e))?;
        // The first copy starts once the round's placing is done.
        let first = t.arrived.first().map_or(0.0, |a| ms(a.0));
        let copy_start = t
            .placed
            .iter()
            .map(|p| ms(p.0))
            .filter(|p| *p <= first)
            .fold(0.0, f64::max);
        let mut pts = vec![(0.0, 0.0), (copy_start, 0.0)];
        pts.extend(t.arrived.iter().map(|(d, b)| (ms(*d), mib(*b))));
        chart
            .draw_series(LineSeries::new(pts, BLUE.stroke_width(2)))
            .map_err(|e| err(&e))?;
        // Guest iterations: a tick each along the top.
        for g in t.guest.iter().filter(|g| ms(**g) <= t_max) {
            let (px, _) = chart.backend_coord(&(ms(*g), 0.0));
            root.draw(&PathElement::new(
                vec![(px, y1 + 2), (px, y1 + 12)],
                BLACK.stroke_width(1),
            ))
            .map_err(|e| err(&e))?;
        }
        root.draw(&Rectangle::new([(x0, y1), (x1, y0)], BLACK.stroke_width(1)))
            .map_err(|e| err(&e))?;
        text(
            &root,
            &format!(
                "one {} precopy migration, guest running: downtime {:.1} ms (drain {:.2} ms), \
                 total {:.0} ms",
                label(t.size),
                ms(r.downtime),
                ms(r.drain),
                ms(r.elapsed)
            ),
            x0,
            10,
            true,
            BLACK,
        );
        text(
            &root,
            "blue: MiB copied to the target; gray: MiB of target memory placed (alloc_at \
             commits and zeroes it); ticks on top: guest iterations (saxpy + checked checksum)",
            x0,
            32,
            false,
            GRAY,
        );
        text(
            &root,
            "time since the migration started (ms)",
            (x0 + x1) / 2 - 110,
            y0 + 24,
            false,
            BLACK,
        );
        text(&root, "MiB", x0 - 70, (y0 + y1) / 2, false, BLACK);
        // Legend of the spans, with their lengths.
        let mut ly = y1 + 20;
        for (name, s, e, c) in &spans {
            let lx = x0 + 12;
            root.draw(&Rectangle::new([(lx, ly), (lx + 20, ly + 10)], c.filled()))
                .map_err(|e| err(&e))?;
            text(
                &root,
                &format!("{name}: {s:.1}-{e:.1} ms ({:.2} ms)", e - s),
                lx + 26,
                ly,
                false,
                BLACK,
            );
            ly += 14;
        }
        root.present().map_err(|e| err(&e))?;
        Ok(())
    }

    pub(super) fn timeline(t: &Trace, path: &Path) {
        match timeline_png(t, path) {
            Ok(()) => println!("(timeline of one migration: {})", path.display()),
            Err(e) => eprintln!("vgpu-bench migration: cannot draw {}: {e}", path.display()),
        }
    }
}
