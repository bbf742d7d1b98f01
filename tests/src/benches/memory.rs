//! Device memory, in process on the sim backend, each figure beside its anchor
//! in the same run:
//!
//! 1. Gdev's overload case (§6), scaled by 1/4: N tasks of 32 MiB and one high-priority
//!    task of 256 MiB on a 512 MiB GPU. Every task allocates, copies its data in, runs
//!    `saxpy` over it a few times, copies it out and frees it; every byte is checked.
//!    Makespan and the high-priority task's completion time vs N, with the device swap
//!    area (10%, Gdev's setting), without it, and without oversubscription (tasks wait
//!    until they fit: what a GPU without swapping does).
//! 2. Swap-in and swap-out throughput of both tiers beside plain HtoD/DtoH copies of the
//!    same bytes.
//! 3. A producer/consumer dataflow through shared device memory (one object the
//!    producer's backend exports, mapped by both GPUs' address spaces) vs through host
//!    memory (DtoH then HtoD), several sizes; [`run_cuda`] measures the same on GPU 0 of
//!    this machine (`vgpu-bench memory --backend cuda`).
//!
//! The GPU model: one [`SimGpu`] per physical GPU, so one copy engine (its bandwidth is
//! shared by every copy, swaps included) and one compute engine (a kernel at a time, the
//! highest-priority waiter next, as Gdev's scheduler dispatches). Each task has its own
//! [`Pager`], as each vGPU is its own worker process in production, and the pagers share a
//! [`LocalBroker`] running vgpud's planner.

use std::cmp::Reverse;
use std::collections::BTreeSet;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use vgpu_backend::pager::{LocalBroker, MemState, Pager, GRANULE};
use vgpu_backend::{
    Access, ArgValue, Backend, BackendError, LaunchConfig, LaunchOne, ModuleImage, SimConfig,
    SimGpu,
};
use vm_memory::VolatileSlice;

use crate::bench::{median, Figure};

mod dataflow;
pub use dataflow::run_cuda;

const MIB: u64 = 1 << 20;
/// The scaled GPU (Gdev's case / 4).
const GPU_MEMORY: u64 = 512 * MIB;
/// One ordinary task's data (Gdev: 128 MB).
const TASK_BYTES: u64 = 32 * MIB;
/// The high-priority task's data (Gdev: 1 GB).
const HIGH_BYTES: u64 = 256 * MIB;
/// `saxpy` launches per task.
const ROUNDS: u32 = 8;
/// Tasks counts of the overload case.
const NS: [usize; 5] = [1, 2, 4, 8, 16];

/// The simulated device's parameters.
#[derive(Clone, Copy, Debug)]
pub struct Params {
    /// Host-device copy bandwidth, bytes/s.
    pub copy_bandwidth: u64,
    /// Compute speed (1.0 = 1e9 element operations/s).
    pub speed: f64,
}

fn sim(p: Params, memory: u64) -> Arc<SimGpu> {
    Arc::new(
        SimGpu::new(SimConfig {
            name: "membench".into(),
            memory,
            copy_bandwidth: p.copy_bandwidth,
            speed: p.speed,
            // Two cores are shared by every task: one host thread per kernel.
            threads: 1,
            ..SimConfig::default()
        })
        .unwrap_or_else(|e| panic!("sim GPU: {e}")),
    )
}

/// A resource handed out by priority, then arrival: the compute engine (capacity 1) or
/// device memory for admission control (capacity in bytes).
struct Gate {
    state: Mutex<GateState>,
    cv: Condvar,
}

struct GateState {
    free: u64,
    ticket: u64,
    waiting: BTreeSet<(Reverse<i32>, u64)>,
}

struct Held<'a> {
    gate: &'a Gate,
    amount: u64,
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        let mut s = self.gate.lock();
        s.free += self.amount;
        drop(s);
        self.gate.cv.notify_all();
    }
}

impl Gate {
    fn new(capacity: u64) -> Self {
        Self {
            state: Mutex::new(GateState {
                free: capacity,
                ticket: 0,
                waiting: BTreeSet::new(),
            }),
            cv: Condvar::new(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, GateState> {
        vgpu_sync::lock(&self.state)
    }

    /// Waits until `amount` is free and no one of higher priority (or equal priority and
    /// earlier) waits.
    fn acquire(&self, priority: i32, amount: u64) -> Held<'_> {
        let mut s = self.lock();
        let me = (Reverse(priority), s.ticket);
        s.ticket += 1;
        s.waiting.insert(me);
        while s.free < amount || s.waiting.first() != Some(&me) {
            s = vgpu_sync::wait(&self.cv, s);
        }
        s.waiting.remove(&me);
        s.free -= amount;
        drop(s);
        // The next in line may fit in what is left.
        self.cv.notify_all();
        Held { gate: self, amount }
    }
}

/// Runs `f` until it does not fail for memory pressure (every resident byte of equal or
/// lower priority was busy at that moment); counts the retries.
fn retry<T>(
    retries: &mut u64,
    mut f: impl FnMut() -> vgpu_backend::Result<T>,
) -> Result<T, String> {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        match f() {
            Ok(v) => return Ok(v),
            Err(BackendError::MemoryPressure { .. }) if Instant::now() < deadline => {
                *retries += 1;
                std::thread::sleep(Duration::from_micros(500));
            }
            Err(e) => return Err(e.to_string()),
        }
    }
}

fn put(b: &dyn Backend, addr: u64, bytes: &mut [u8]) -> vgpu_backend::Result<u64> {
    b.copy_htod(addr, &VolatileSlice::from(bytes))
}

fn get(b: &dyn Backend, addr: u64, bytes: &mut [u8]) -> vgpu_backend::Result<u64> {
    b.copy_dtoh(addr, &VolatileSlice::from(bytes))
}

const CFG: LaunchConfig = LaunchConfig {
    grid: [1, 1, 1],
    block: [1, 1, 1],
    shared_bytes: 0,
};

fn ptr(addr: u64, access: Access) -> ArgValue {
    ArgValue::Ptr { addr, access }
}

fn function(b: &dyn Backend, name: &[u8]) -> u64 {
    let m = b
        .modules()
        .module_load(ModuleImage::Builtin(b"builtin"))
        .unwrap_or_else(|e| panic!("builtin module: {e}"));
    b.modules()
        .get_function(m, name)
        .unwrap_or_else(|e| panic!("{}: {e}", String::from_utf8_lossy(name)))
        .handle
}

// ---------------------------------------------------------------------------------------
// 1. Gdev's overload case.

/// How the GPU's memory is managed in one run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// Oversubscription with a swap area of 10% of the GPU.
    SwapArea,
    /// Oversubscription, host memory only.
    NoSwapArea,
    /// No oversubscription: a task starts once its bytes fit.
    Admission,
}

impl Mode {
    fn label(self) -> &'static str {
        match self {
            Mode::SwapArea => "10% swap area",
            Mode::NoSwapArea => "no swap area",
            Mode::Admission => "no oversubscription",
        }
    }
}

/// Gdev's swap area: 10% of device memory, in whole swap pieces.
fn swap_area() -> u64 {
    GPU_MEMORY / 10 / GRANULE * GRANULE
}

struct Task {
    id: u32,
    priority: i32,
    bytes: u64,
    /// x then y, f32 each: `bytes / 2` bytes.
    x: Vec<u8>,
    y: Vec<u8>,
}

const ALPHA: f32 = 2.0;

fn x_at(i: usize) -> f32 {
    (i % 4093) as f32
}

fn y0_at(id: u32, i: usize) -> f32 {
    ((i + id as usize * 7919) % 251) as f32
}

impl Task {
    fn new(id: u32, priority: i32, bytes: u64) -> Self {
        let n = (bytes / 8) as usize;
        let x = (0..n).flat_map(|i| x_at(i).to_le_bytes()).collect();
        let y = (0..n).flat_map(|i| y0_at(id, i).to_le_bytes()).collect();
        Self {
            id,
            priority,
            bytes,
            x,
            y,
        }
    }

    /// Checks what came back: x unchanged, y = y0 + ROUNDS * ALPHA * x (exact in f32).
    fn verify(&self) -> Result<(), String> {
        for (i, (xc, yc)) in self
            .x
            .chunks_exact(4)
            .zip(self.y.chunks_exact(4))
            .enumerate()
        {
            let x = f32::from_le_bytes([xc[0], xc[1], xc[2], xc[3]]);
            let y = f32::from_le_bytes([yc[0], yc[1], yc[2], yc[3]]);
            let mut want = y0_at(self.id, i);
            for _ in 0..ROUNDS {
                want += ALPHA * x_at(i);
            }
            if x.to_bits() != x_at(i).to_bits() || y.to_bits() != want.to_bits() {
                return Err(format!(
                    "task {}: element {i}: x = {x} (want {}), y = {y} (want {want})",
                    self.id,
                    x_at(i)
                ));
            }
        }
        Ok(())
    }
}

struct TaskDone {
    finished: Duration,
    retries: u64,
    state: MemState,
}

/// One task's life on its own pager; `x` and `y` come back in place.
fn run_task(
    t: &mut Task,
    pager: &Pager,
    engine: &Gate,
    admission: Option<&Gate>,
    start: Instant,
) -> Result<TaskDone, String> {
    let _fits = admission.map(|g| g.acquire(t.priority, t.bytes));
    let mut retries = 0;
    let half = t.bytes / 2;
    let n = half / 4;
    let saxpy = function(pager, b"saxpy");
    let x = retry(&mut retries, || pager.alloc(half))?.addr;
    let y = retry(&mut retries, || pager.alloc(half))?.addr;
    retry(&mut retries, || put(pager, x, &mut t.x))?;
    retry(&mut retries, || put(pager, y, &mut t.y))?;
    let args = [
        ArgValue::F32(ALPHA),
        ptr(x, Access::Read),
        ptr(y, Access::ReadWrite),
        ArgValue::U64(n),
    ];
    for _ in 0..ROUNDS {
        retry(&mut retries, || {
            // The restores a launch needs happen before the kernel runs, on the engine's
            // time (Gdev retrieves evicted data before launching).
            let _engine = engine.acquire(t.priority, 1);
            pager.launch_one(saxpy, &CFG, &args)
        })?;
    }
    t.x.fill(0);
    t.y.fill(0);
    get(pager, x, &mut t.x).map_err(|e| e.to_string())?;
    get(pager, y, &mut t.y).map_err(|e| e.to_string())?;
    let state = pager.state();
    pager.free(x).map_err(|e| e.to_string())?;
    pager.free(y).map_err(|e| e.to_string())?;
    Ok(TaskDone {
        finished: start.elapsed(),
        retries,
        state,
    })
}

/// One run of the overload case.
struct Overload {
    makespan: Duration,
    high: Duration,
    /// Bytes moved out of device memory, all tasks.
    swapped_out: u64,
    retries: u64,
}

fn overload(p: Params, n: usize, mode: Mode) -> Result<Overload, String> {
    let (pool, swap) = match mode {
        Mode::SwapArea => (GPU_MEMORY - swap_area(), swap_area()),
        Mode::NoSwapArea | Mode::Admission => (GPU_MEMORY, 0),
    };
    let total = n as u64 * TASK_BYTES + HIGH_BYTES;
    // The sim's own limit is an address-space charge (decommitted pieces stay charged);
    // the broker's pool is the physical GPU.
    let gpu = sim(p, 2 * total + swap + 64 * MIB);
    let broker = LocalBroker::new(pool, swap);
    let engine = Gate::new(1);
    let admission = (mode == Mode::Admission).then(|| Gate::new(pool));
    let mut tasks: Vec<(Task, Arc<Pager>)> = (0..=n)
        .map(|i| {
            let id = i as u32 + 1;
            // The last one is the high-priority task.
            let (priority, bytes) = if i == n {
                (1, HIGH_BYTES)
            } else {
                (0, TASK_BYTES)
            };
            let pager = Arc::new(Pager::new(gpu.clone(), broker.member(id, priority), bytes));
            broker.attach(id, &pager);
            (Task::new(id, priority, bytes), pager)
        })
        .collect();
    let start = Instant::now();
    let results: Vec<Result<TaskDone, String>> = std::thread::scope(|s| {
        let handles: Vec<_> = tasks
            .iter_mut()
            .map(|(t, pager)| {
                let (engine, admission) = (&engine, admission.as_ref());
                s.spawn(move || run_task(t, pager, engine, admission, start))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("task panicked".into())))
            .collect()
    });
    let mut out = Overload {
        makespan: Duration::ZERO,
        high: Duration::ZERO,
        swapped_out: 0,
        retries: 0,
    };
    for ((t, _), r) in tasks.iter().zip(results) {
        let done = r.map_err(|e| format!("{} N={n}: task {}: {e}", mode.label(), t.id))?;
        t.verify()
            .map_err(|e| format!("{} N={n}: {e}", mode.label()))?;
        out.makespan = out.makespan.max(done.finished);
        if t.priority > 0 {
            out.high = done.finished;
        }
        out.swapped_out += done.state.swap_out_bytes;
        out.retries += done.retries;
    }
    Ok(out)
}

// ---------------------------------------------------------------------------------------
// 2. Swap throughput.

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(FNV_OFFSET, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(FNV_PRIME)
    })
}

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len / 8)
        .flat_map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x.to_le_bytes()
        })
        .collect()
}

/// GB/s of `bytes` in `ns`.
fn gbps(bytes: u64, ns: u64) -> f64 {
    bytes as f64 / ns.max(1) as f64
}

struct SwapRun {
    out_gbps: f64,
    in_gbps: f64,
    htod_gbps: f64,
    dtoh_gbps: f64,
}

/// Evicts `bytes` of data to `tier`'s place (swap area when `device`, else host memory),
/// restores it with a launch that reads it (checksum, checked), and times plain copies of
/// the same bytes on the same GPU.
fn swap_run(p: Params, bytes: u64, device: bool, seed: u64) -> Result<SwapRun, String> {
    let e = |e: BackendError| e.to_string();
    let gpu = sim(p, 4 * bytes + 64 * MIB);
    // Room for `out` (one 4 KiB page) and a: b's allocation must evict all of a.
    let broker = LocalBroker::new(bytes + 4096, if device { bytes } else { 0 });
    let pager = Arc::new(Pager::new(gpu, broker.member(1, 0), 2 * bytes + 2 * MIB));
    broker.attach(1, &pager);
    let checksum = function(&*pager, b"checksum");
    let out = pager.alloc(8).map_err(e)?.addr;
    let a = pager.alloc(bytes).map_err(e)?.addr;
    let mut data = pattern(seed, bytes as usize);
    let want = fnv(&data);
    put(&*pager, a, &mut data).map_err(e)?;
    // b's allocation evicts a.
    let b = pager.alloc(bytes).map_err(e)?.addr;
    let s0 = pager.state();
    let place = if device { s0.device_swap } else { s0.host_swap };
    if place < bytes {
        return Err(format!(
            "swap {}: {place} of {bytes} bytes swapped out: {s0:?}",
            if device { "area" } else { "to host" }
        ));
    }
    // Plain copies of the same bytes into and out of b (resident).
    let t = Instant::now();
    put(&*pager, b, &mut data).map_err(e)?;
    let htod_ns = t.elapsed().as_nanos() as u64;
    let t = Instant::now();
    get(&*pager, b, &mut data).map_err(e)?;
    let dtoh_ns = t.elapsed().as_nanos() as u64;
    pager.free(b).map_err(e)?;
    // A launch reading a restores all of it (room is free now: no eviction on the way).
    pager
        .launch_one(
            checksum,
            &CFG,
            &[
                ptr(a, Access::Read),
                ArgValue::U64(bytes),
                ptr(out, Access::Write),
            ],
        )
        .map_err(e)?;
    let s1 = pager.state();
    let mut h = [0u8; 8];
    get(&*pager, out, &mut h).map_err(e)?;
    if u64::from_le_bytes(h) != want {
        return Err(format!(
            "swap {}: checksum of the restored data is {:#x}, want {want:#x}",
            if device { "area" } else { "to host" },
            u64::from_le_bytes(h)
        ));
    }
    Ok(SwapRun {
        out_gbps: gbps(s0.swap_out_bytes, s0.swap_out_ns),
        in_gbps: gbps(
            s1.swap_in_bytes - s0.swap_in_bytes,
            s1.swap_in_ns - s0.swap_in_ns,
        ),
        htod_gbps: gbps(bytes, htod_ns),
        dtoh_gbps: gbps(bytes, dtoh_ns),
    })
}

// ---------------------------------------------------------------------------------------

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

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn fail(e: String) -> ! {
    eprintln!("vgpu-bench memory: FAILED: {e}");
    std::process::exit(1);
}

/// Makespan (thick) and the high-priority task's completion (thin) vs N, per mode.
fn plot(rows: &[(usize, [Overload; 3])], path: &std::path::Path) {
    use vgpuctl::plot::{Line, Style};
    let mut lines = Vec::new();
    for (k, mode) in [Mode::SwapArea, Mode::NoSwapArea, Mode::Admission]
        .iter()
        .enumerate()
    {
        lines.push(Line {
            label: Some(mode.label().to_string()),
            points: rows
                .iter()
                .map(|(n, r)| (*n as f64, r[k].makespan.as_secs_f64()))
                .collect(),
            color: k,
            style: Style::Thick,
        });
        lines.push(Line {
            label: None,
            points: rows
                .iter()
                .map(|(n, r)| (*n as f64, r[k].high.as_secs_f64()))
                .collect(),
            color: k,
            style: Style::Thin,
        });
    }
    match vgpuctl::plot::xy_png(
        path,
        "Gdev overload / 4: N x 32 MiB + 256 MiB high priority, 512 MiB sim GPU",
        "thick: makespan, thin: high-priority task done",
        &vgpuctl::plot::Axes {
            x_label: "N tasks",
            y_label: "s",
            percent: false,
        },
        &lines,
    ) {
        Ok(()) => println!("(plot of makespan vs N: {})", path.display()),
        Err(e) => eprintln!("vgpu-bench memory: cannot draw {}: {e}", path.display()),
    }
}

pub fn run(p: Params) -> Vec<Figure> {
    let mut out = Vec::new();
    let shm_sizes: [u64; 4] = [4 * MIB, 16 * MIB, 64 * MIB, 256 * MIB];
    let swap_bytes = 64 * MIB;
    let reps = 3;
    let bar = ProgressBar::new((NS.len() * 3 + 2 * reps + shm_sizes.len() * reps * 2) as u64);
    bar.set_style(
        ProgressStyle::with_template("{elapsed:>4} [{bar:30}] {pos}/{len} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    println!(
        "sim GPU: {} MiB, copy bandwidth {:.1} GB/s, speed {} (1e9 element ops/s x speed), \
         1 host thread per kernel; swap area {} MiB when on",
        GPU_MEMORY / MIB,
        p.copy_bandwidth as f64 / 1e9,
        p.speed,
        swap_area() / MIB
    );

    // 1. Overload.
    let mut rows: Vec<(usize, [Overload; 3])> = Vec::new();
    for n in NS {
        let run = |mode: Mode| {
            bar.set_message(format!("overload N={n}, {}", mode.label()));
            let r = overload(p, n, mode).unwrap_or_else(|e| fail(e));
            bar.inc(1);
            r
        };
        let r = [
            run(Mode::SwapArea),
            run(Mode::NoSwapArea),
            run(Mode::Admission),
        ];
        rows.push((n, r));
    }
    bar.suspend(|| {
        println!();
        println!(
            "| N | demand / GPU | makespan, 10% swap area | no swap area | no oversubscription \
             | high-priority done, 10% swap area | no swap area | no oversubscription \
             | swapped out, 10% / none | broker retries, 10% / none |"
        );
        println!("|---|---|---|---|---|---|---|---|---|---|");
        for (n, r) in &rows {
            let demand = (*n as u64 * TASK_BYTES + HIGH_BYTES) as f64 / GPU_MEMORY as f64;
            println!(
                "| {n} | {demand:.2}x | {:.0} ms | {:.0} ms | {:.0} ms | {:.0} ms | {:.0} ms \
                 | {:.0} ms | {} / {} MiB | {} / {} |",
                ms(r[0].makespan),
                ms(r[1].makespan),
                ms(r[2].makespan),
                ms(r[0].high),
                ms(r[1].high),
                ms(r[2].high),
                r[0].swapped_out / MIB,
                r[1].swapped_out / MIB,
                r[0].retries,
                r[1].retries,
            );
        }
        println!();
    });
    for (n, r) in &rows {
        let case = format!("overload N={n} x 32 MiB + 256 MiB high");
        out.push(fig(
            format!("{case}: makespan, 10% swap area"),
            ms(r[0].makespan),
            "ms",
            "no swap area",
            ms(r[1].makespan),
        ));
        out.push(fig(
            format!("{case}: makespan, no swap area"),
            ms(r[1].makespan),
            "ms",
            "no oversubscription (tasks wait to fit)",
            ms(r[2].makespan),
        ));
        out.push(fig(
            format!("{case}: high-priority task done, 10% swap area"),
            ms(r[0].high),
            "ms",
            "no swap area",
            ms(r[1].high),
        ));
        out.push(fig(
            format!("{case}: high-priority task done, no swap area"),
            ms(r[1].high),
            "ms",
            "no oversubscription (tasks wait to fit)",
            ms(r[2].high),
        ));
    }
    plot(&rows, std::path::Path::new("out/bench-memory.png"));

    // 2. Swap throughput, median of `reps`.
    for (device, tier) in [(true, "device swap area"), (false, "host memory")] {
        let runs: Vec<SwapRun> = (0..reps)
            .map(|i| {
                bar.set_message(format!("swap throughput, {tier}"));
                let r = swap_run(p, swap_bytes, device, i as u64 + 1).unwrap_or_else(|e| fail(e));
                bar.inc(1);
                r
            })
            .collect();
        let med = |f: fn(&SwapRun) -> f64| median(runs.iter().map(f).collect());
        out.push(fig(
            format!("swap-in from {tier}, 64 MiB (restore before a launch)"),
            med(|r| r.in_gbps),
            "GB/s",
            "plain HtoD of 64 MiB",
            med(|r| r.htod_gbps),
        ));
        out.push(fig(
            format!("swap-out to {tier}, 64 MiB (eviction)"),
            med(|r| r.out_gbps),
            "GB/s",
            "plain DtoH of 64 MiB",
            med(|r| r.dtoh_gbps),
        ));
    }

    // 3. Dataflow.
    let pair = |bytes: u64| -> (Arc<dyn Backend>, Arc<dyn Backend>) {
        (sim(p, 2 * bytes + 64 * MIB), sim(p, 2 * bytes + 64 * MIB))
    };
    out.extend(dataflow::figures(&pair, &shm_sizes, reps, &bar));
    bar.finish_and_clear();
    out
}
