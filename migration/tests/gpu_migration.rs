//! Benchmark (ignored by default; needs a GPU): live migration of a running
//! vGPU on the cuda backend between GPU 0 and GPU 1 (onto GPU 0 itself where there is one
//! GPU), downtime and total time against resident memory from 64 MiB to 16 GiB, beside the
//! native device-to-device copy of the same bytes in the same run (`cuMemAlloc` buffers,
//! peer access enabled, `cuMemcpyPeer`; `cuMemcpyDtoD` on one GPU).
//!
//! The vGPU holds `size` bytes in 8 allocations, each filled with its own 32-bit word, and
//! a 4 MiB hot buffer that a guest thread keeps writing (`fill` kernels, then a read-back
//! check) while the vGPU moves: every pre-copy round finds it dirty again. After every move
//! the big buffers are checked (whole up to 1 GiB, 64 windows of 1 MiB each above) and the
//! guest checks each of its writes; a mismatch fails the run.
//!
//! Run: `cargo test --release -p vgpu-migration --test gpu_migration -- --ignored --nocapture`
//! (`VGPU_BENCH_MAX_MIB` caps the largest size, default 16384).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::sys::{self, CUresult};
use vgpu_backend::{
    Access, ArgValue, Backend, CudaConfig, CudaGpu, LaunchConfig, LaunchOne, ModuleImage,
    DEFAULT_VA_BASE,
};
use vgpu_migration::{Migratable, MigrateOptions, Mode, Report};
use vm_memory::VolatileSlice;

const MIB: u64 = 1 << 20;
const PIECES: u64 = 8;
const HOT: u64 = 4 * MIB;
const VA_SIZE: u64 = 64 << 30;

fn ok(rc: CUresult, what: &str) {
    assert_eq!(rc, CUresult::CUDA_SUCCESS, "{what}");
}

fn gpu(ordinal: i32, memory: u64, target: bool) -> Arc<dyn Backend> {
    Arc::new(
        CudaGpu::new(CudaConfig {
            ordinal,
            // `memory` for the moved bytes, beside the context's reserve.
            memory: memory
                + CudaGpu::context_reserve_of(ordinal, &Default::default())
                    .expect("context reserve")
                    .total()
                    .expect("reserve fits u64"),
            va_base: DEFAULT_VA_BASE,
            va_size: VA_SIZE,
            migration_target: target,
            ..CudaConfig::default()
        })
        .expect("cuda backend"),
    )
}

fn word(piece: u64) -> u32 {
    0x5a5a_0000 ^ (piece as u32).wrapping_mul(0x9e37_79b9)
}

/// Checks piece `k` (`len` bytes at `addr`) holds its word: whole, or in 64 windows.
fn check_piece(m: &dyn Backend, addr: u64, len: u64, k: u64, whole: bool) {
    let want = word(k).to_le_bytes();
    let window = MIB.min(len);
    let starts: Vec<u64> = if whole {
        (0..len).step_by(window as usize).collect()
    } else {
        (0..64u64)
            .map(|i| (i * (len - window) / 63) / 4 * 4)
            .collect()
    };
    let mut buf = vec![0u8; window as usize];
    for s in starts {
        let n = window.min(len - s) as usize;
        m.copy_dtoh(addr + s, &VolatileSlice::from(&mut buf[..n]))
            .expect("dtoh");
        assert!(
            buf[..n].chunks_exact(4).all(|c| c == want),
            "piece {k} differs at +{s:#x}"
        );
    }
}

/// Native anchor: one device-to-device copy of `bytes` from GPU 0 to GPU `dst` (median of
/// `reps`, after a warm-up), with peer access enabled where the GPUs allow it.
fn native_copy(dst: i32, bytes: u64, reps: usize) -> (Duration, bool) {
    let mut d = [0i32; 2];
    let mut ctx = [std::ptr::null_mut(); 2];
    for (i, o) in [0, dst].into_iter().enumerate() {
        // SAFETY: writes one handle each into our locals.
        unsafe {
            ok(sys::cuDeviceGet(&mut d[i], o), "cuDeviceGet");
            ok(
                sys::cuDevicePrimaryCtxRetain(&mut ctx[i], d[i]),
                "cuDevicePrimaryCtxRetain",
            );
        }
    }
    let mut ptr = [0u64; 2];
    let mut peer = false;
    for i in 0..2 {
        // SAFETY: binds a retained context; allocates `bytes` into our local.
        unsafe {
            ok(sys::cuCtxSetCurrent(ctx[i]), "cuCtxSetCurrent");
            ok(
                sys::cuMemAlloc_v2(&mut ptr[i], bytes as usize),
                "cuMemAlloc",
            );
        }
    }
    if dst != 0 {
        let mut can = 0;
        // SAFETY: writes one int; the device handles came from cuDeviceGet.
        ok(
            unsafe { sys::cuDeviceCanAccessPeer(&mut can, d[0], d[1]) },
            "cuDeviceCanAccessPeer",
        );
        if can == 1 {
            for (a, b) in [(0, 1), (1, 0)] {
                // SAFETY: enables access between two live primary contexts.
                let rc = unsafe {
                    ok(sys::cuCtxSetCurrent(ctx[a]), "cuCtxSetCurrent");
                    sys::cuCtxEnablePeerAccess(ctx[b], 0)
                };
                assert!(
                    matches!(
                        rc,
                        CUresult::CUDA_SUCCESS | CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED
                    ),
                    "cuCtxEnablePeerAccess: {rc:?}"
                );
            }
            peer = true;
        }
    }
    // SAFETY: binds GPU 0's context for the copies below.
    ok(unsafe { sys::cuCtxSetCurrent(ctx[0]) }, "cuCtxSetCurrent");
    let copy = || {
        // SAFETY: both buffers are live allocations of `bytes` bytes; synchronous copy.
        unsafe {
            if dst == 0 {
                ok(
                    sys::cuMemcpyDtoD_v2(ptr[1], ptr[0], bytes as usize),
                    "cuMemcpyDtoD",
                );
            } else {
                ok(
                    sys::cuMemcpyPeer(ptr[1], ctx[1], ptr[0], ctx[0], bytes as usize),
                    "cuMemcpyPeer",
                );
            }
            ok(sys::cuCtxSynchronize(), "cuCtxSynchronize");
        }
    };
    copy();
    let mut t: Vec<Duration> = (0..reps)
        .map(|_| {
            let s = Instant::now();
            copy();
            s.elapsed()
        })
        .collect();
    t.sort();
    for i in 0..2 {
        // SAFETY: frees our allocations in their contexts, releases our retains.
        unsafe {
            ok(sys::cuCtxSetCurrent(ctx[i]), "cuCtxSetCurrent");
            ok(sys::cuMemFree_v2(ptr[i]), "cuMemFree");
            ok(
                sys::cuDevicePrimaryCtxRelease_v2(d[i]),
                "cuDevicePrimaryCtxRelease",
            );
        }
    }
    (t[t.len() / 2], peer)
}

/// The guest: keeps writing the hot buffer with `fill` and checking a word of it.
struct Guest {
    stop: Arc<AtomicBool>,
    longest_us: Arc<AtomicU64>,
    thread: std::thread::JoinHandle<u32>,
}

impl Guest {
    fn start(m: Arc<Migratable>, hot: u64, fill: u64) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let longest_us = Arc::new(AtomicU64::new(0));
        let (s, l) = (stop.clone(), longest_us.clone());
        let thread = std::thread::spawn(move || {
            let mut round = 0u32;
            let cfg = LaunchConfig {
                grid: [64, 1, 1],
                block: [256, 1, 1],
                shared_bytes: 0,
            };
            while !s.load(Ordering::Relaxed) {
                let t = Instant::now();
                round += 1;
                m.launch_one(
                    fill,
                    &cfg,
                    &[
                        ArgValue::Ptr {
                            addr: hot,
                            access: Access::Write,
                        },
                        ArgValue::U32(round),
                        ArgValue::U64(HOT / 4),
                    ],
                )
                .expect("guest fill");
                let mut w = [0u8; 4];
                m.copy_dtoh(hot + HOT - 4, &VolatileSlice::from(&mut w[..]))
                    .expect("guest read-back");
                assert_eq!(u32::from_le_bytes(w), round, "the guest's own write");
                l.fetch_max(t.elapsed().as_micros() as u64, Ordering::Relaxed);
            }
            round
        });
        Self {
            stop,
            longest_us,
            thread,
        }
    }

    fn finish(self) -> (u32, f64) {
        self.stop.store(true, Ordering::Relaxed);
        let n = self.thread.join().expect("the guest saw every write");
        (n, self.longest_us.load(Ordering::Relaxed) as f64 / 1e3)
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

#[test]
#[ignore = "benchmark; needs a GPU"]
fn gpu_migration_downtime_and_total_time_vs_resident_memory() {
    let probe = match CudaGpu::probe() {
        Ok(p) => p,
        Err(why) => {
            eprintln!("SKIPPED (cuda): {why}");
            return;
        }
    };
    let target = if probe.devices >= 2 { 1 } else { 0 };
    let max = std::env::var("VGPU_BENCH_MAX_MIB")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(16384)
        * MIB;
    println!(
        "{} x{}: vGPU moves GPU 0 -> GPU {target} (precopy, max_downtime 50 ms) and back \
         (stop_copy); a guest thread writes a 4 MiB hot buffer throughout",
        probe.name, probe.devices
    );
    println!(
        "| resident | precopy downtime (drain) | precopy total | rounds | stop_copy downtime (back) \
         | native copy of the same bytes | pre-copy rate vs native | guest's longest stall |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    // The first move of a process pays one-time driver costs (peer mappings, module JIT
    // for the second GPU): a 64 MiB warm-up run is not reported.
    let sizes = [64 * MIB, 64 * MIB, 256 * MIB, 1 << 30, 4 << 30, 16 << 30];
    for (run, size) in sizes.into_iter().filter(|s| *s <= max).enumerate() {
        let (native, peer) = native_copy(target, size + HOT, 3);
        let memory = size + 64 * MIB;
        let m = Arc::new(Migratable::new(gpu(0, memory, false)));
        let piece = size / PIECES;
        let mut bufs = Vec::new();
        for k in 0..PIECES {
            let a = m.alloc(piece).expect("alloc").addr;
            m.memset(a, word(k), 4, piece / 4).expect("fill");
            bufs.push(a);
        }
        let hot = m.alloc(HOT).expect("hot").addr;
        let module = m
            .modules()
            .module_load(ModuleImage::Builtin(b"builtin"))
            .expect("module");
        let fill = m
            .modules()
            .get_function(module, b"fill")
            .expect("fill")
            .handle;
        let guest = Guest::start(m.clone(), hot, fill);
        std::thread::sleep(Duration::from_millis(20));
        let opts = |mode| MigrateOptions {
            mode,
            max_downtime: Duration::from_millis(50),
            max_rounds: 8,
        };
        let there: Report = m
            .migrate(gpu(target, memory, true), &opts(Mode::Precopy), |_| {})
            .expect("precopy migration");
        for (k, a) in bufs.iter().enumerate() {
            check_piece(&*m, *a, piece, k as u64, size <= 1 << 30);
        }
        std::thread::sleep(Duration::from_millis(20));
        let back: Report = m
            .migrate(gpu(0, memory, true), &opts(Mode::StopCopy), |_| {})
            .expect("stop_copy migration");
        let (rounds, stall) = guest.finish();
        for (k, a) in bufs.iter().enumerate() {
            check_piece(&*m, *a, piece, k as u64, size <= 1 << 30);
        }
        assert!(rounds > 0);
        let copied = there.precopy_bytes;
        // Our rate over the pre-copy (placement on the target included) vs the native copy.
        let ours = there
            .timeline
            .first()
            .map(|(_, a, b)| b.saturating_sub(*a))
            .unwrap_or(there.elapsed);
        if run == 0 {
            continue;
        }
        println!(
            "| {} MiB | {:.2} ms ({:.2} ms) | {:.1} ms | {} | {:.2} ms | {:.2} ms ({}) | {:.2} GB/s vs {:.2} GB/s | {:.2} ms |",
            size / MIB,
            ms(there.downtime),
            ms(there.drain),
            ms(there.elapsed),
            there.rounds,
            ms(back.downtime),
            ms(native),
            if target == 0 {
                "cuMemcpyDtoD, same GPU"
            } else if peer {
                "cuMemcpyPeer, peer access"
            } else {
                "cuMemcpyPeer, no peer access"
            },
            copied as f64 / ours.as_secs_f64() / 1e9,
            (size + HOT) as f64 / native.as_secs_f64() / 1e9,
            stall
        );
        drop(m);
    }
}
