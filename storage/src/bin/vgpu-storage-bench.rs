//! Storage benchmark: random-read IOPS and bandwidth through our BaM queues and the
//! emulated controller beside fio (io_uring) on the same file at the same queue depth,
//! cache hit and miss throughput, and the I/O amplification of on-demand gather against
//! reading whole tiles. Prints a table and writes JSON (default out/bench-storage.json).
//!
//! Usage: vgpu-storage-bench [--file PATH] [--size-mib N] [--qd N] [--seconds S]
//!                           [--direct] [--no-fio] [--iops-only] [--sync-engine]
//!                           [--repeat N] [--json PATH]
//!
//! The machine is shared and noisy, so fio and our path run interleaved `--repeat`
//! times and each figure is the median of its runs.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use vgpu_storage::queue::Submitted;
use vgpu_storage::{kernels, DmaSlice, Namespace, NamespaceOptions, PageCache, StorageArray};

struct Args {
    file: PathBuf,
    size_mib: u64,
    qd: usize,
    seconds: f64,
    direct: bool,
    fio: bool,
    json: PathBuf,
    iops_only: bool,
    repeat: usize,
    engine: vgpu_storage::controller::EngineKind,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        file: PathBuf::from("out/bench-storage.img"),
        size_mib: 512,
        qd: 32,
        seconds: 3.0,
        direct: false,
        fio: true,
        json: PathBuf::from("out/bench-storage.json"),
        iops_only: false,
        repeat: 3,
        engine: vgpu_storage::controller::EngineKind::IoUring,
    };
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        let mut val = || it.next().ok_or_else(|| format!("{k} needs a value"));
        match k.as_str() {
            "--file" => a.file = val()?.into(),
            "--size-mib" => a.size_mib = val()?.parse().map_err(|e| format!("--size-mib: {e}"))?,
            "--qd" => a.qd = val()?.parse().map_err(|e| format!("--qd: {e}"))?,
            "--seconds" => a.seconds = val()?.parse().map_err(|e| format!("--seconds: {e}"))?,
            "--json" => a.json = val()?.into(),
            "--direct" => a.direct = true,
            "--no-fio" => a.fio = false,
            "--iops-only" => a.iops_only = true,
            "--repeat" => a.repeat = val()?.parse().map_err(|e| format!("--repeat: {e}"))?,
            "--sync-engine" => a.engine = vgpu_storage::controller::EngineKind::Sync,
            "-h" | "--help" => {
                return Err("usage: vgpu-storage-bench [--file PATH] [--size-mib N] [--qd N] [--seconds S] [--direct] [--no-fio] [--iops-only] [--sync-engine] [--repeat N] [--json PATH]".into())
            }
            other => return Err(format!("unknown argument {other}; see --help")),
        }
    }
    if a.qd == 0 || a.qd > 1023 {
        return Err("--qd must be in 1..=1023".into());
    }
    Ok(a)
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
}

fn ensure_file(path: &Path, bytes: u64) -> std::io::Result<()> {
    if std::fs::metadata(path)
        .map(|m| m.len() == bytes)
        .unwrap_or(false)
    {
        return Ok(());
    }
    if let Some(d) = path.parent() {
        std::fs::create_dir_all(d)?;
    }
    let mut f = std::fs::File::create(path)?;
    let mut rng = Rng(0x1234_5678);
    let mut chunk = vec![0u8; 1 << 20];
    for _ in 0..bytes / chunk.len() as u64 {
        for w in chunk.chunks_mut(8) {
            w.copy_from_slice(&rng.next().to_le_bytes());
        }
        f.write_all(&chunk)?;
    }
    f.sync_all()
}

/// Read the whole file once so buffered runs of both fio and ours start from the same
/// (fully cached) state.
fn warm(path: &Path) -> std::io::Result<()> {
    use std::io::Read;
    let mut f = std::fs::File::open(path)?;
    let mut buf = vec![0u8; 1 << 20];
    while f.read(&mut buf)? > 0 {}
    Ok(())
}

#[derive(serde::Serialize, Clone, Copy, Default)]
struct Rate {
    iops: f64,
    mib_s: f64,
}

fn fio(a: &Args, bs: usize, jobs: usize) -> Result<Rate, String> {
    let out = std::process::Command::new("fio")
        .args([
            "--name=randread",
            &format!("--filename={}", a.file.display()),
            "--rw=randread",
            &format!("--bs={bs}"),
            "--ioengine=io_uring",
            &format!("--iodepth={}", (a.qd / jobs).max(1)),
            &format!("--direct={}", a.direct as u8),
            &format!("--runtime={}", a.seconds.ceil() as u64),
            "--time_based",
            &format!("--numjobs={jobs}"),
            "--group_reporting",
            "--norandommap",
            "--randrepeat=0",
            "--invalidate=0",
            "--output-format=json",
        ])
        .output()
        .map_err(|e| format!("running fio: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "fio failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    // fio may print notes before the JSON object.
    let start = text.find('{').ok_or("fio printed no JSON")?;
    let v: serde_json::Value =
        serde_json::from_str(&text[start..]).map_err(|e| format!("fio JSON: {e}"))?;
    let r = &v["jobs"][0]["read"];
    let iops = r["iops"].as_f64().ok_or("fio JSON has no read.iops")?;
    let bw = r["bw_bytes"].as_f64().unwrap_or(iops * bs as f64);
    Ok(Rate {
        iops,
        mib_s: bw / (1 << 20) as f64,
    })
}

/// One submitter thread keeps `qd` random reads of `bs` bytes in flight through one
/// queue pair, as a warp's lanes would, until `seconds` pass.
fn ours(ns: &Namespace, bs: usize, qd: usize, seconds: f64) -> Result<Rate, String> {
    let q = ns.queue();
    let mem = ns.alloc_dma(qd * bs.max(4096)).map_err(|e| e.to_string())?;
    let slots = ns.bytes() / bs as u64;
    let mut rng = Rng(99);
    let bufs: Vec<DmaSlice> = (0..qd)
        .map(|k| DmaSlice::new(mem.clone(), k * bs.max(4096), bs))
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string())?;
    let submit = |k: usize, rng: &mut Rng| {
        ns.submit_read(q, (rng.next() % slots) * bs as u64, &bufs[k])
            .map_err(|e| e.to_string())
    };
    let start = Instant::now();
    let end = start + Duration::from_secs_f64(seconds);
    let mut done = 0u64;
    let mut inflight: Vec<Option<Submitted>> = Vec::with_capacity(qd);
    for k in 0..qd {
        inflight.push(Some(submit(k, &mut rng)?));
    }
    // Reap whichever commands finished (completions come back out of order with
    // O_DIRECT) and resubmit into the same buffer, as fio does; check the clock every 256.
    let mut running = true;
    let mut live = qd;
    let mut idle_rounds = 0u32;
    while live > 0 {
        let mut progressed = false;
        for (k, slot) in inflight.iter_mut().enumerate() {
            let Some(s) = *slot else { continue };
            let Some(cqe) = q.poll(s).map_err(|e| e.to_string())? else {
                continue;
            };
            cqe.status().map_err(|e| e.to_string())?;
            progressed = true;
            done += 1;
            if done % 256 == 0 && Instant::now() > end {
                running = false;
            }
            if running {
                *slot = Some(submit(k, &mut rng)?);
            } else {
                *slot = None;
                live -= 1;
            }
        }
        // Spin briefly, then yield, then nap: on a 2-core box the controller thread may
        // share our core, and pure spinning would starve it for a whole time slice.
        if progressed {
            idle_rounds = 0;
        } else {
            idle_rounds += 1;
            if idle_rounds < 8 {
                std::hint::spin_loop();
            } else if idle_rounds < 64 {
                std::thread::yield_now();
            } else {
                // Slow media: leave the core to the controller and interrupt handling.
                std::thread::sleep(Duration::from_micros(20));
            }
        }
    }
    let t = start.elapsed().as_secs_f64();
    Ok(Rate {
        iops: done as f64 / t,
        mib_s: done as f64 * bs as f64 / t / (1 << 20) as f64,
    })
}

#[derive(serde::Serialize, Default)]
struct CacheRun {
    threads: usize,
    lookups_per_s: f64,
    hit_ratio: f64,
    lines_filled_per_s: f64,
}

/// Random warp gathers (32 lanes of u64) from `threads` threads for `seconds`.
fn cache_run(a: &StorageArray<u64>, threads: usize, seconds: f64) -> CacheRun {
    let stop = AtomicBool::new(false);
    let lookups = AtomicU64::new(0);
    let before = a.cache().stats();
    let start = Instant::now();
    std::thread::scope(|s| {
        for t in 0..threads {
            let (stop, lookups) = (&stop, &lookups);
            s.spawn(move || {
                let mut rng = Rng(t as u64 + 5);
                let mut idx = [0u64; 32];
                let mut out = [0u64; 32];
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    for i in idx.iter_mut() {
                        *i = rng.next() % a.len();
                    }
                    if a.warp_get(&idx, &mut out).is_err() {
                        break;
                    }
                    n += 32;
                }
                lookups.fetch_add(n, Ordering::Relaxed);
            });
        }
        std::thread::sleep(Duration::from_secs_f64(seconds));
        stop.store(true, Ordering::Relaxed);
    });
    let t = start.elapsed().as_secs_f64();
    let after = a.cache().stats();
    let (h, m) = (after.hits - before.hits, after.misses - before.misses);
    CacheRun {
        threads,
        lookups_per_s: lookups.into_inner() as f64 / t,
        hit_ratio: h as f64 / (h + m).max(1) as f64,
        lines_filled_per_s: m as f64 / t,
    }
}

#[derive(serde::Serialize, Default)]
struct Amplification {
    line: usize,
    elements: u64,
    useful_bytes: u64,
    on_demand_bytes: u64,
    on_demand_amplification: f64,
    on_demand_s: f64,
    tile_bytes: u64,
    tile_size: u64,
    tiles_amplification: f64,
    tiles_s: f64,
}

fn amplification(ns: &Arc<Namespace>, n: u64, line: usize) -> Result<Amplification, String> {
    let e = |e: vgpu_storage::Error| e.to_string();
    // A fresh 32 MiB cache of `line`-byte lines: every byte counted came from storage.
    let cache = PageCache::new(ns.clone(), line, (32 << 20) / line).map_err(e)?;
    let words = ns.bytes() / 8;
    let a: StorageArray<u64> = StorageArray::new(cache.clone(), 0, words).map_err(e)?;
    let mut rng = Rng(2024);
    let idx: Vec<u64> = (0..n).map(|_| rng.next() % words).collect();
    let t = Instant::now();
    let got = kernels::gather(&a, &idx, 32).map_err(e)?;
    let on_demand_s = t.elapsed().as_secs_f64();
    std::hint::black_box(got);
    let on_demand = cache.stats().bytes_read;
    // The alternative: stage whole 1 MiB tiles holding the wanted elements, then gather
    // from memory (what a CPU-orchestrated, tile-at-a-time pipeline moves).
    let tile = 1u64 << 20;
    let mut tiles: Vec<u64> = idx.iter().map(|&i| i * 8 / tile).collect();
    tiles.sort_unstable();
    tiles.dedup();
    let buf = DmaSlice::whole(ns.alloc_dma(tile as usize).map_err(e)?);
    let t = Instant::now();
    let mut tile_bytes = 0u64;
    for &k in &tiles {
        let len = tile.min(ns.bytes() - k * tile);
        ns.read(k * tile, &buf.slice(0, len as usize).map_err(e)?)
            .map_err(e)?;
        tile_bytes += len;
    }
    let tiles_s = t.elapsed().as_secs_f64();
    let useful = n * 8;
    Ok(Amplification {
        line,
        elements: n,
        useful_bytes: useful,
        on_demand_bytes: on_demand,
        on_demand_amplification: on_demand as f64 / useful as f64,
        on_demand_s,
        tile_bytes,
        tile_size: tile,
        tiles_amplification: tile_bytes as f64 / useful as f64,
        tiles_s,
    })
}

fn median(mut v: Vec<Rate>) -> Option<Rate> {
    v.sort_by(|a, b| a.iops.total_cmp(&b.iops));
    v.get(v.len() / 2).copied()
}

#[derive(serde::Serialize)]
struct Row {
    block: usize,
    queue_depth: usize,
    ours: Rate,
    /// fio, one job at the full queue depth (the anchor the goal is stated against).
    fio: Option<Rate>,
    ratio: Option<f64>,
    /// fio, two jobs at half the depth each: the same total depth on as many threads as
    /// our path uses (one submitter, one controller thread).
    fio_2jobs: Option<Rate>,
    ratio_2jobs: Option<f64>,
}

fn main() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .try_init();
    let a = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    if let Err(e) = run(&a) {
        eprintln!("vgpu-storage-bench: {e}");
        std::process::exit(1);
    }
}

fn run(a: &Args) -> Result<(), String> {
    let bytes = a.size_mib << 20;
    ensure_file(&a.file, bytes).map_err(|e| format!("creating {}: {e}", a.file.display()))?;
    if !a.direct {
        warm(&a.file).map_err(|e| format!("reading {}: {e}", a.file.display()))?;
    }
    let opts = NamespaceOptions {
        queues: 1,
        queue_depth: 1024,
        direct: a.direct,
        engine: a.engine,
        ..Default::default()
    };
    let ns = Namespace::open_file(&a.file, &opts).map_err(|e| e.to_string())?;
    let engine = ns.engine();
    let mut rows = Vec::new();
    for bs in [4096usize, 512] {
        let anchor = |jobs: usize| {
            if !a.fio {
                return None;
            }
            fio(a, bs, jobs)
                .map_err(|e| eprintln!("fio anchor unavailable: {e}"))
                .ok()
        };
        let (mut f1s, mut f2s, mut os) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..a.repeat.max(1) {
            f1s.extend(anchor(1));
            f2s.extend(anchor(2));
            os.push(ours(&ns, bs, a.qd, a.seconds)?);
        }
        let (f1, f2) = (median(f1s), median(f2s));
        let o = median(os).unwrap_or_default();
        rows.push(Row {
            block: bs,
            queue_depth: a.qd,
            ours: o,
            ratio: f1.map(|f| o.iops / f.iops),
            ratio_2jobs: f2.map(|f| o.iops / f.iops),
            fio: f1,
            fio_2jobs: f2,
        });
    }
    if a.iops_only {
        for r in &rows {
            println!(
                "{} B: ours {:.0} IOPS, fio {:?}",
                r.block,
                r.ours.iops,
                r.fio.map(|f| f.iops)
            );
        }
        return Ok(());
    }
    // Cache: a 16 MiB cache of 4 KiB lines; hits over an 8 MiB array, misses over the file.
    let e = |e: vgpu_storage::Error| e.to_string();
    let cache = PageCache::new(ns.clone(), 4096, 4096).map_err(e)?;
    let small: StorageArray<u64> = StorageArray::new(cache.clone(), 0, (8 << 20) / 8).map_err(e)?;
    kernels::scan_sum(&small, 2).map_err(e)?;
    let hit = cache_run(&small, 2, a.seconds / 2.0);
    let big: StorageArray<u64> = StorageArray::new(cache, 0, bytes / 8).map_err(e)?;
    // Misses are bound by I/O concurrency: many threads with one blocking miss each, as
    // BaM relies on many GPU threads.
    let miss = cache_run(&big, 32, a.seconds / 2.0);
    let mut amps = Vec::new();
    for n in [1_000u64, 100_000] {
        for line in [512usize, 4096] {
            amps.push(amplification(&ns, n, line)?);
        }
    }

    println!(
        "\nstorage bench: file {} ({} MiB, {}), queue depth {}, engine {:?}, {} s per run, median of {}",
        a.file.display(),
        a.size_mib,
        if a.direct { "O_DIRECT" } else { "page cache" },
        a.qd,
        engine,
        a.seconds,
        a.repeat
    );
    println!("| random read | ours IOPS | ours MiB/s | fio 1 job IOPS | ours / fio 1 job | fio 2 jobs IOPS | ours / fio 2 jobs |");
    println!("| --- | --- | --- | --- | --- | --- | --- |");
    let cell = |r: Option<Rate>| r.map_or("n/a".to_string(), |r| format!("{:.0}", r.iops));
    let pct = |x: Option<f64>| x.map_or("n/a".to_string(), |x| format!("{:.0} %", x * 100.0));
    for r in &rows {
        println!(
            "| {} B, QD {} | {:.0} | {:.0} | {} | {} | {} | {} |",
            r.block,
            r.queue_depth,
            r.ours.iops,
            r.ours.mib_s,
            cell(r.fio),
            pct(r.ratio),
            cell(r.fio_2jobs),
            pct(r.ratio_2jobs)
        );
    }
    println!("| cache (32-lane warps of u64) | threads | lookups/s | hit ratio | lines filled/s |");
    println!("| --- | --- | --- | --- | --- |");
    for (name, c) in [
        ("hits (8 MiB array, 16 MiB cache)", &hit),
        ("misses (whole file, 16 MiB cache)", &miss),
    ] {
        println!(
            "| {name} | {} | {:.0} | {:.3} | {:.0} |",
            c.threads, c.lookups_per_s, c.hit_ratio, c.lines_filled_per_s
        );
    }
    println!("| random u64 gather | line | on-demand bytes | amplification | time | whole 1 MiB tiles: bytes | amplification | time |");
    println!("| --- | --- | --- | --- | --- | --- | --- | --- |");
    for m in &amps {
        println!(
            "| {} elements | {} B | {} | {:.1}x | {:.3} s | {} | {:.1}x | {:.3} s |",
            m.elements,
            m.line,
            m.on_demand_bytes,
            m.on_demand_amplification,
            m.on_demand_s,
            m.tile_bytes,
            m.tiles_amplification,
            m.tiles_s
        );
    }
    let json = serde_json::json!({
        "file": a.file.display().to_string(),
        "file_mib": a.size_mib,
        "direct": a.direct,
        "queue_depth": a.qd,
        "seconds": a.seconds,
        "repeat": a.repeat,
        "engine": format!("{engine:?}"),
        "random_read": rows,
        "cache_hit": hit,
        "cache_miss": miss,
        "amplification": amps,
    });
    if let Some(d) = a.json.parent() {
        std::fs::create_dir_all(d).map_err(|e| format!("creating {}: {e}", d.display()))?;
    }
    std::fs::write(
        &a.json,
        serde_json::to_string_pretty(&json).unwrap_or_default(),
    )
    .map_err(|e| format!("writing {}: {e}", a.json.display()))?;
    println!("\nJSON written to {}", a.json.display());
    Ok(())
}
