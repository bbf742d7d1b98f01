//! The built-in storage kernels on every backend: on the sim, host threads stand
//! in for warps; on a CUDA GPU, GPU threads enqueue the NVMe reads themselves (4096 of them
//! at once per launch). Results are compared with the same computation over the file's
//! bytes in memory; bad input, a truncated namespace and a hung controller end in error
//! statuses, never a hang. Without a CUDA GPU the cuda half says `SKIPPED (cuda): why`
//! (`VGPU_REQUIRE_CUDA=1` turns that into a failure).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use vgpu_backend::storage::{NamespaceSpec, StorageSet};
use vgpu_backend::{
    Backend, BackendError, CudaConfig, CudaGpu, LaunchConfig, LaunchOne, ModuleImage, SimConfig,
    SimGpu, DEFAULT_VA_BASE,
};
use vgpu_proto::{Access, ArgValue, Status};
use vm_memory::VolatileSlice;

const MIB: u64 = 1 << 20;
const CFG: LaunchConfig = LaunchConfig {
    grid: [1, 1, 1],
    block: [1, 1, 1],
    shared_bytes: 0,
};

fn cuda_skip() -> Option<&'static str> {
    static WHY: OnceLock<Option<String>> = OnceLock::new();
    WHY.get_or_init(|| match CudaGpu::probe() {
        Ok(p) => {
            eprintln!("cuda: testing on {} ({} device(s))", p.name, p.devices);
            None
        }
        Err(why) => {
            assert!(
                std::env::var_os("VGPU_REQUIRE_CUDA").is_none(),
                "VGPU_REQUIRE_CUDA is set but the cuda backend cannot run: {why}"
            );
            Some(why)
        }
    })
    .as_deref()
}

fn set_for(path: &Path) -> Arc<StorageSet> {
    Arc::new(
        StorageSet::new(vec![NamespaceSpec {
            id: 1,
            path: path.to_owned(),
            read_only: true,
        }])
        .expect("set"),
    )
}

/// Runs `f` on a sim backend and, where possible, a cuda backend, each with its own
/// storage set over `path` (namespace 1, attached).
fn each(path: &Path, f: impl Fn(&str, &dyn Backend, &StorageSet)) {
    let set = set_for(path);
    set.attach(1).expect("attach");
    // VGPU_BENCH_SIM_THREADS: more host threads for the figures (how far the emulated
    // controller goes when submitters are plentiful).
    let threads = std::env::var("VGPU_BENCH_SIM_THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2);
    let sim = SimGpu::new(SimConfig {
        memory: 256 * MIB,
        va_size: 16 << 30,
        threads,
        ..SimConfig::default()
    })
    .expect("sim")
    .with_storage(set.clone());
    f("sim", &sim, &set);
    drop(sim);
    match cuda_skip() {
        Some(why) => eprintln!("SKIPPED (cuda): {why}"),
        None => {
            static NEXT: AtomicU64 = AtomicU64::new(0);
            let k = NEXT.fetch_add(1, Ordering::Relaxed);
            let set = set_for(path);
            set.attach(1).expect("attach");
            // Room for the context reserve and the GPU storage setup too.
            let gpu = CudaGpu::new(CudaConfig {
                ordinal: 0,
                memory: 1 << 30,
                va_base: DEFAULT_VA_BASE + (k + 1) * (64 << 30),
                va_size: 16 << 30,
                ..CudaConfig::default()
            })
            .expect("cuda")
            .with_storage(set.clone());
            f("cuda", &gpu, &set);
        }
    }
}

fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

fn round4k(x: u64) -> u64 {
    x.div_ceil(4096) * 4096
}

/// A namespace: `words` u64s (`mix(i)`), then a CSR graph of `vertices` (u64 offsets,
/// u32 edges), each part 4 KiB-aligned.
struct Ns {
    path: PathBuf,
    bytes: Vec<u8>,
    words: u64,
    vertices: u64,
    edges: u64,
    offsets_base: u64,
    edges_base: u64,
}

impl Drop for Ns {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

fn namespace(tag: &str, words: u64, vertices: u64, bad_edge: bool) -> Ns {
    let mut offsets = vec![0u64];
    let mut edges: Vec<u32> = Vec::new();
    for v in 0..vertices {
        for k in 0..mix(v ^ 0xD1B5) % 6 {
            edges.push((mix((v << 8) + k) % vertices) as u32);
        }
        offsets.push(edges.len() as u64);
    }
    if bad_edge {
        let mid = edges.len() / 2;
        if let Some(e) = edges.get_mut(mid) {
            *e = vertices as u32 + 7;
        }
    }
    let offsets_base = round4k(words * 8);
    let edges_base = round4k(offsets_base + (vertices + 1) * 8);
    let total = round4k(edges_base + edges.len() as u64 * 4);
    let mut bytes = vec![0u8; total as usize];
    for i in 0..words as usize {
        bytes[i * 8..i * 8 + 8].copy_from_slice(&mix(i as u64).to_le_bytes());
    }
    for (v, o) in offsets.iter().enumerate() {
        let at = offsets_base as usize + v * 8;
        bytes[at..at + 8].copy_from_slice(&o.to_le_bytes());
    }
    for (k, e) in edges.iter().enumerate() {
        let at = edges_base as usize + k * 4;
        bytes[at..at + 4].copy_from_slice(&e.to_le_bytes());
    }
    let path =
        std::env::temp_dir().join(format!("vgpu-backend-storage-{}-{tag}", std::process::id()));
    std::fs::write(&path, &bytes).expect("write namespace");
    Ns {
        path,
        bytes,
        words,
        vertices,
        edges: edges.len() as u64,
        offsets_base,
        edges_base,
    }
}

impl Ns {
    fn u64_at(&self, byte: u64) -> u64 {
        let b = byte as usize;
        u64::from_le_bytes(self.bytes[b..b + 8].try_into().expect("8"))
    }
    fn u32_at(&self, byte: u64) -> u32 {
        let b = byte as usize;
        u32::from_le_bytes(self.bytes[b..b + 4].try_into().expect("4"))
    }

    /// BFS levels from `source`, as the kernel defines them.
    fn bfs(&self, source: u64) -> Vec<u32> {
        let mut level = vec![u32::MAX; self.vertices as usize];
        level[source as usize] = 0;
        let mut frontier = vec![source];
        let mut cur = 0;
        while !frontier.is_empty() {
            let mut next = Vec::new();
            for v in frontier {
                let a = self.u64_at(self.offsets_base + v * 8);
                let b = self.u64_at(self.offsets_base + (v + 1) * 8);
                for e in a..b {
                    let u = u64::from(self.u32_at(self.edges_base + e * 4));
                    if level[u as usize] == u32::MAX {
                        level[u as usize] = cur + 1;
                        next.push(u);
                    }
                }
            }
            frontier = next;
            cur += 1;
        }
        level
    }
}

fn builtin(b: &dyn Backend, name: &str) -> u64 {
    let m = b
        .modules()
        .module_load(ModuleImage::Builtin(b"builtin"))
        .expect("builtin module");
    b.modules()
        .get_function(m, name.as_bytes())
        .expect("function")
        .handle
}

fn put(b: &dyn Backend, addr: u64, bytes: &[u8]) {
    let mut buf = bytes.to_vec();
    b.copy_htod(addr, &VolatileSlice::from(&mut buf[..]))
        .expect("htod");
}

fn get(b: &dyn Backend, addr: u64, len: usize) -> Vec<u8> {
    let mut buf = vec![0u8; len];
    b.copy_dtoh(addr, &VolatileSlice::from(&mut buf[..]))
        .expect("dtoh");
    buf
}

fn r(addr: u64) -> ArgValue {
    ArgValue::Ptr {
        addr,
        access: Access::Read,
    }
}
fn w(addr: u64) -> ArgValue {
    ArgValue::Ptr {
        addr,
        access: Access::Write,
    }
}

fn gather_args(base: u64, idx: u64, dst: u64, n: u64, eb: u32) -> Vec<ArgValue> {
    vec![
        ArgValue::U64(1),
        ArgValue::U64(base),
        r(idx),
        w(dst),
        ArgValue::U64(n),
        ArgValue::U32(eb),
    ]
}

fn scan_args(base: u64, n: u64, eb: u32, out: u64) -> Vec<ArgValue> {
    vec![
        ArgValue::U64(1),
        ArgValue::U64(base),
        ArgValue::U64(n),
        ArgValue::U32(eb),
        w(out),
    ]
}

fn bfs_args(ns: &Ns, source: u64, levels: u64) -> Vec<ArgValue> {
    vec![
        ArgValue::U64(1),
        ArgValue::U64(ns.offsets_base),
        ArgValue::U64(ns.edges_base),
        ArgValue::U64(ns.vertices),
        ArgValue::U64(ns.edges),
        ArgValue::U64(source),
        w(levels),
    ]
}

fn status(e: &BackendError) -> Status {
    e.status()
}

#[test]
fn gather_scan_and_bfs_equal_the_in_memory_computation() {
    // 48 MiB of words: more lines than the GPU's cache (32 MiB), so lines are evicted and
    // read again while thousands of threads submit.
    let ns = namespace("results", 6 << 20, 30_000, false);
    each(&ns.path, |name, b, _set| {
        let gather = builtin(b, "storage_gather");
        let scan = builtin(b, "storage_scan_sum");
        let bfs = builtin(b, "storage_bfs");
        let n = 100_000u64;
        let idx = b.alloc(n * 8).expect("alloc").addr;
        let dst = b.alloc(n * 8).expect("alloc").addr;
        let out = b.alloc(8).expect("alloc").addr;
        let levels = b.alloc(ns.vertices * 4).expect("alloc").addr;
        let ix: Vec<u64> = (0..n).map(|i| mix(i + 99) % ns.words).collect();
        put(
            b,
            idx,
            &ix.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<_>>(),
        );
        for round in 0..2 {
            let t = Instant::now();
            b.launch_one(gather, &CFG, &gather_args(0, idx, dst, n, 8))
                .expect("gather u64");
            eprintln!(
                "{name}: gather of {n} u64 (round {round}) in {:?}",
                t.elapsed()
            );
            let got = get(b, dst, (n * 8) as usize);
            for (k, c) in got.chunks_exact(8).enumerate() {
                let v = u64::from_le_bytes(c.try_into().expect("8"));
                assert_eq!(v, mix(ix[k]), "{name}: round {round}, lane {k}");
            }
        }
        // u32 elements from byte 4096: the low and high halves of the words.
        b.launch_one(gather, &CFG, &gather_args(4096, idx, dst, n, 4))
            .expect("gather u32");
        let got = get(b, dst, (n * 4) as usize);
        for (k, c) in got.chunks_exact(4).enumerate() {
            let v = u32::from_le_bytes(c.try_into().expect("4"));
            assert_eq!(v, ns.u32_at(4096 + ix[k] * 4), "{name}: u32 lane {k}");
        }
        let t = Instant::now();
        b.launch_one(scan, &CFG, &scan_args(0, ns.words, 8, out))
            .expect("scan");
        eprintln!("{name}: scan of {} u64 in {:?}", ns.words, t.elapsed());
        let want = (0..ns.words).fold(0u64, |a, i| a.wrapping_add(mix(i)));
        assert_eq!(get(b, out, 8), want.to_le_bytes(), "{name}: scan u64");
        b.launch_one(scan, &CFG, &scan_args(12_288, 1000, 4, out))
            .expect("scan u32");
        let want = (0..1000u64).fold(0u64, |a, i| a + u64::from(ns.u32_at(12_288 + i * 4)));
        assert_eq!(get(b, out, 8), want.to_le_bytes(), "{name}: scan u32");
        // Two sources from which most of the graph is reachable.
        let sources: Vec<(u64, Vec<u32>)> = (0..ns.vertices)
            .map(|s| (s, ns.bfs(s)))
            .filter(|(_, l)| l.iter().filter(|x| **x != u32::MAX).count() > 1000)
            .take(2)
            .collect();
        assert_eq!(sources.len(), 2, "a graph worth searching");
        for (source, want) in sources {
            let t = Instant::now();
            b.launch_one(bfs, &CFG, &bfs_args(&ns, source, levels))
                .expect("bfs");
            eprintln!("{name}: bfs from {source} in {:?}", t.elapsed());
            let got: Vec<u32> = get(b, levels, (ns.vertices * 4) as usize)
                .chunks_exact(4)
                .map(|c| u32::from_le_bytes(c.try_into().expect("4")))
                .collect();
            assert_eq!(got, want, "{name}: bfs from {source}");
        }
    });
}

#[test]
fn bad_input_gets_an_error_status_and_the_namespace_keeps_working() {
    let ns = namespace("bad", 1 << 16, 2000, false);
    let broken = namespace("broken", 1 << 10, 2000, true);
    each(&ns.path, |name, b, _set| {
        let gather = builtin(b, "storage_gather");
        let scan = builtin(b, "storage_scan_sum");
        let bfs = builtin(b, "storage_bfs");
        let n = 64u64;
        let idx = b.alloc(n * 8).expect("alloc").addr;
        let dst = b.alloc(n * 8).expect("alloc").addr;
        let out = b.alloc(8).expect("alloc").addr;
        let levels = b.alloc(ns.vertices * 4).expect("alloc").addr;
        let mut ix: Vec<u64> = (0..n).map(|i| i * 7).collect();
        ix[40] = ns.bytes.len() as u64; // one element past the end
        put(
            b,
            idx,
            &ix.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<_>>(),
        );
        let cases: Vec<(&str, u64, Vec<ArgValue>, Status)> = vec![
            (
                "index past the end",
                gather,
                gather_args(0, idx, dst, n, 8),
                Status::KernelFault,
            ),
            (
                "elem_bytes 3",
                gather,
                gather_args(0, idx, dst, n, 3),
                Status::InvalidArgument,
            ),
            (
                "misaligned base",
                gather,
                gather_args(4, idx, dst, n, 8),
                Status::InvalidArgument,
            ),
            (
                "base past the end",
                gather,
                gather_args(1 << 40, idx, dst, n, 8),
                Status::InvalidArgument,
            ),
            (
                "dst too small",
                gather,
                gather_args(0, idx, dst, n * 2, 8),
                Status::BadDevicePointer,
            ),
            (
                "read-only output",
                scan,
                {
                    let mut a = scan_args(0, 10, 8, out);
                    a[4] = r(out);
                    a
                },
                Status::BadArgType,
            ),
            (
                "scan past the end",
                scan,
                scan_args(0, ns.words * 2, 8, out),
                Status::InvalidArgument,
            ),
            (
                "namespace not attached",
                scan,
                {
                    let mut a = scan_args(0, 10, 8, out);
                    a[0] = ArgValue::U64(9);
                    a
                },
                Status::InvalidArgument,
            ),
            (
                "bfs source past the vertices",
                bfs,
                bfs_args(&ns, ns.vertices, levels),
                Status::InvalidArgument,
            ),
            (
                "bfs without vertices",
                bfs,
                {
                    let mut a = bfs_args(&ns, 0, levels);
                    a[3] = ArgValue::U64(0);
                    a
                },
                Status::InvalidArgument,
            ),
        ];
        for (what, f, args, want) in cases {
            let e = b.launch_one(f, &CFG, &args).expect_err(what);
            assert_eq!(status(&e), want, "{name}: {what}: {e}");
        }
        // The good lanes of the faulting gather were not needed; a clean one works.
        ix[40] = 5;
        put(
            b,
            idx,
            &ix.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<_>>(),
        );
        b.launch_one(gather, &CFG, &gather_args(0, idx, dst, n, 8))
            .expect("gather after errors");
        let got = get(b, dst, (n * 8) as usize);
        for (k, c) in got.chunks_exact(8).enumerate() {
            assert_eq!(
                u64::from_le_bytes(c.try_into().expect("8")),
                mix(ix[k]),
                "{name}: lane {k}"
            );
        }
    });
    // A graph whose edge points past the vertices: an error, not a wild write.
    each(&broken.path, |name, b, _set| {
        let bfs = builtin(b, "storage_bfs");
        let levels = b.alloc(broken.vertices * 4).expect("alloc").addr;
        let mut hit = false;
        for source in 0..50 {
            if let Err(e) = b.launch_one(bfs, &CFG, &bfs_args(&broken, source, levels)) {
                assert_eq!(status(&e), Status::InvalidArgument, "{name}: {e}");
                hit = true;
                break;
            }
        }
        assert!(hit, "{name}: some source reaches the bad edge");
    });
}

#[test]
fn a_truncated_namespace_and_a_hung_controller_give_device_errors_not_hangs() {
    let ns = namespace("faults", 1 << 18, 10, false);
    each(&ns.path, |name, b, set| {
        let scan = builtin(b, "storage_scan_sum");
        let out = b.alloc(8).expect("alloc").addr;
        // Hung controller: every wait has a deadline (2 s per completion).
        set.set_stalled(1, true).expect("stall");
        let t = Instant::now();
        let e = b
            .launch_one(scan, &CFG, &scan_args(0, 4096, 8, out))
            .expect_err("hung");
        assert_eq!(status(&e), Status::DeviceError, "{name}: {e}");
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "{name}: took {:?}",
            t.elapsed()
        );
        set.set_stalled(1, false).expect("unstall");
        // The queue is poisoned: the next kernel fails too (reopening needs a new vGPU).
        let t = Instant::now();
        let e = b
            .launch_one(scan, &CFG, &scan_args(0, ns.words, 8, out))
            .expect_err("poisoned");
        assert_eq!(status(&e), Status::DeviceError, "{name}: {e}");
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "{name}: took {:?}",
            t.elapsed()
        );
    });
    let ns = namespace("trunc", 1 << 18, 10, false);
    each(&ns.path, |name, b, _set| {
        std::fs::OpenOptions::new()
            .write(true)
            .open(&ns.path)
            .expect("open")
            .set_len(8192)
            .expect("truncate");
        let scan = builtin(b, "storage_scan_sum");
        let out = b.alloc(8).expect("alloc").addr;
        let e = b
            .launch_one(scan, &CFG, &scan_args(0, ns.words, 8, out))
            .expect_err("read error");
        assert_eq!(status(&e), Status::DeviceError, "{name}: {e}");
        assert!(e.to_string().contains("error status"), "{name}: {e}");
        std::fs::write(&ns.path, &ns.bytes).expect("restore");
    });
}

/// Figures for docs/PERFORMANCE.md (GPU machine): `storage --ignored --nocapture
/// storage_figures`. Cold random 4 KiB reads issued by GPU threads (every lookup a miss:
/// one NVMe command each), warm lookups (every lookup a hit), a sequential scan; the same
/// on the sim beside it, and fio's method (io_uring random 4 KiB reads, one thread, queue
/// depth 128) on the same file in the same run. The file is in the page cache (just written), so these measure the
/// queues, the controller and the cache, not a disk.
#[test]
#[ignore = "benchmark; run on the GPU machine"]
fn storage_figures() {
    let mib: u64 = std::env::var("VGPU_BENCH_STORAGE_MIB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1024);
    let ns = namespace("figures", mib * MIB / 8, 10, false);
    // VGPU_STORAGE_LINE_BYTES (the GPU cache's line) also sets the baseline's read size.
    let line: usize = std::env::var("VGPU_STORAGE_LINE_BYTES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4096);
    println!(
        "| backend | cold random reads/s (a line each) | MiB/s | warm lookups/s | scan MiB/s |"
    );
    println!("| --- | --- | --- | --- | --- |");
    each(&ns.path, |name, b, _set| {
        let gather = builtin(b, "storage_gather");
        let scan = builtin(b, "storage_scan_sum");
        // Cold: one element from each of n distinct random 4 KiB lines.
        let lines = ns.words / 512;
        let n = 200_000u64.min(lines / 2);
        let idx = b.alloc(n * 8).expect("alloc").addr;
        let dst = b.alloc(n * 8).expect("alloc").addr;
        let out = b.alloc(8).expect("alloc").addr;
        let mut seen = std::collections::HashSet::new();
        let ix: Vec<u64> = (0..)
            .map(|i| mix(i + 7) % lines)
            .filter(|l| seen.insert(*l))
            .take(n as usize)
            .map(|l| l * 512 + 3)
            .collect();
        // One lookup first: the first storage kernel of a process JIT-compiles the storage
        // PTX (seconds when the driver's cache is cold), which is not I/O.
        put(b, idx, &[0u8; 8]);
        b.launch_one(gather, &CFG, &gather_args(0, idx, dst, 1, 8))
            .expect("warm-up");
        put(
            b,
            idx,
            &ix.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<_>>(),
        );
        let t = Instant::now();
        b.launch_one(gather, &CFG, &gather_args(0, idx, dst, n, 8))
            .expect("cold gather");
        let cold = t.elapsed().as_secs_f64();
        // Warm: n lookups over 1024 pages (4 MiB: half the GPU cache even with 512-byte
        // lines), after one pass to fill them.
        let hot: Vec<u64> = (0..n).map(|i| (mix(i) % 1024) * 512 + (i % 512)).collect();
        put(
            b,
            idx,
            &hot.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<_>>(),
        );
        b.launch_one(gather, &CFG, &gather_args(0, idx, dst, n, 8))
            .expect("fill");
        let t = Instant::now();
        for _ in 0..5 {
            b.launch_one(gather, &CFG, &gather_args(0, idx, dst, n, 8))
                .expect("warm gather");
        }
        let warm = t.elapsed().as_secs_f64() / 5.0;
        let words = ns.words.min(64 * MIB / 8);
        let t = Instant::now();
        b.launch_one(scan, &CFG, &scan_args(0, words, 8, out))
            .expect("scan");
        let scan_s = t.elapsed().as_secs_f64();
        let blocks = std::env::var("VGPU_STORAGE_BLOCKS").unwrap_or_else(|_| "default".into());
        // The sim's host cache always has 4 KiB lines; the GPU's follow the knob.
        let line = if name == "cuda" { line } else { 4096 };
        println!(
            "| {name} (blocks: {blocks}, sim threads: {}, {line}-byte lines) | {:.0} | {:.0} | {:.0} | {:.0} |",
            std::env::var("VGPU_BENCH_SIM_THREADS").unwrap_or_else(|_| "2".into()),
            n as f64 / cold,
            n as f64 * line as f64 / cold / MIB as f64,
            n as f64 / warm,
            (words * 8) as f64 / scan_s / MIB as f64
        );
    });
    let iops = io_uring_randread(&ns.path, line, 128, Duration::from_secs(3));
    println!(
        "| io_uring randread {line} B, QD 128, 1 thread (fio's method) | {iops:.0} | {:.0} | | |",
        iops * line as f64 / MIB as f64
    );
}

/// What `fio --ioengine=io_uring --rw=randread --bs=<bs> --iodepth=qd --numjobs=1`
/// measures, for machines without fio: one thread keeps `qd` random `bs`-byte reads of
/// `path` in flight through its own io_uring for `secs`; returns reads per second.
fn io_uring_randread(path: &Path, bs: usize, qd: u32, secs: Duration) -> f64 {
    use io_uring::{opcode, types, IoUring};
    use std::os::fd::AsRawFd;
    let f = std::fs::File::open(path).expect("open");
    let blocks = f.metadata().expect("stat").len() / bs as u64;
    let mut ring = IoUring::new(qd).expect("io_uring");
    let mut bufs = vec![vec![0u8; bs]; qd as usize];
    let mut seed = 0x1234_5678_u64;
    let mut next = move || {
        seed = mix(seed);
        (seed % blocks) * bs as u64
    };
    let fd = types::Fd(f.as_raw_fd());
    let push = |ring: &mut IoUring, i: usize, buf: &mut Vec<u8>, off: u64| {
        let e = opcode::Read::new(fd, buf.as_mut_ptr(), bs as u32)
            .offset(off)
            .build()
            .user_data(i as u64);
        // SAFETY: `buf` stays alive and untouched until its completion is reaped (every
        // read is reaped before the function returns) and the fd stays open.
        unsafe { ring.submission().push(&e).expect("sq room") };
    };
    for (i, b) in bufs.iter_mut().enumerate() {
        push(&mut ring, i, b, next());
    }
    let start = Instant::now();
    let mut done = 0u64;
    let mut inflight = qd as u64;
    while inflight > 0 {
        ring.submit_and_wait(1).expect("submit");
        let ready: Vec<(u64, i32)> = ring
            .completion()
            .map(|c| (c.user_data(), c.result()))
            .collect();
        for (i, res) in ready {
            assert_eq!(res, bs as i32, "read");
            done += 1;
            inflight -= 1;
            if start.elapsed() < secs {
                push(&mut ring, i as usize, &mut bufs[i as usize], next());
                inflight += 1;
            }
        }
    }
    done as f64 / start.elapsed().as_secs_f64()
}
