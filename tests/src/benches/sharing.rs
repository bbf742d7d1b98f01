//! `vgpu-bench sharing`: how busy N VMs sharing one GPU keep it, beside N native threads
//! running the same kernels on the same GPU in the same run.
//!
//! Each VM runs `gpu-load` (copy in, saxpy, one `spin` kernel of 1 ms or 10 ms per round)
//! through vgpud with BAND, shares summing to 100 %; GPU busy is the sum of the vGPUs'
//! compute utilization (kernel device time over wall time) sampled while all run. The
//! anchor is N host threads launching the same `spin` kernel on one sim GPU directly, one
//! kernel at a time (no VM, no worker, no grant): kernel time over wall time. Sim backend only here; on
//! the H200 `ci/gpu/suite.sh timeline` shows where the gap goes.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use vgpu_backend::{ArgValue, Backend, ModuleImage, SimConfig, SimGpu};

use super::shared::{fig, ONE_THREAD};
use crate::bench::Figure;
use crate::daemon::{gpu_load, wait_running, TestDaemon};

/// Seconds of sampling per point.
const SAMPLE: Duration = Duration::from_secs(3);

/// GPU busy with `n` VMs running `spin_us` kernels through vgpud (sim GPU).
fn through_vgpud(n: usize, spin_us: u64) -> f64 {
    let d = TestDaemon::start(
        &format!("sharing-{n}-{spin_us}"),
        &["--policy", "band", "--sim-gpus", "1", "--sim-memory", "4G"],
    );
    let c = &d.client;
    let share = 1.0 / n as f64;
    let arg = format!("rounds=1000000 spin_us={spin_us} check=1000");
    let mut vms = Vec::new();
    for _ in 0..n {
        match c.create_vm(&gpu_load(&arg, 0, share, 64 << 20)) {
            Ok(vm) => vms.push(vm),
            Err(e) => panic!("sharing: cannot create a VM: {e}"),
        }
    }
    for vm in &vms {
        wait_running(c, vm.id);
    }
    // Past the first scheduling periods and the stats window.
    std::thread::sleep(Duration::from_secs(2));
    let vgpus: Vec<u32> = vms.iter().filter_map(|v| v.vgpu).collect();
    let (mut sum, mut samples) = (0.0, 0u32);
    let end = Instant::now() + SAMPLE;
    while Instant::now() < end {
        std::thread::sleep(Duration::from_millis(250));
        let mut total = 0.0;
        let mut complete = true;
        for &v in &vgpus {
            match c.vgpu_stats(v) {
                Ok(s) if s.window_ms > 0 => total += s.compute_utilization,
                _ => complete = false,
            }
        }
        if complete {
            sum += total;
            samples += 1;
        }
    }
    for vm in &vms {
        if let Err(e) = c.delete_vm(vm.id) {
            eprintln!("sharing: cannot delete VM {}: {e}", vm.id);
        }
    }
    if samples == 0 {
        0.0
    } else {
        sum / f64::from(samples)
    }
}

/// GPU busy with `n` host threads launching `spin_us` kernels on one sim GPU.
fn native(n: usize, spin_us: u64) -> f64 {
    let gpu = Arc::new(
        SimGpu::new(SimConfig {
            name: "sharing".into(),
            memory: 64 << 20,
            threads: 1,
            ..SimConfig::default()
        })
        .unwrap_or_else(|e| panic!("sim GPU: {e}")),
    );
    let m = gpu
        .module_load(ModuleImage::Builtin(b"builtin"))
        .unwrap_or_else(|e| panic!("builtin module: {e}"));
    let spin = gpu
        .get_function(m, b"spin")
        .unwrap_or_else(|e| panic!("spin: {e}"))
        .handle;
    // One compute engine: a launch waits for the one before it, as on a GPU that
    // time-slices processes (the sim GPU would run them side by side).
    let engine = Arc::new(std::sync::Mutex::new(()));
    let stop = Arc::new(AtomicBool::new(false));
    let kernel_ns = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let threads: Vec<_> = (0..n)
        .map(|_| {
            let (gpu, stop, kernel_ns) = (gpu.clone(), stop.clone(), kernel_ns.clone());
            let engine = engine.clone();
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let _engine = vgpu_sync::lock(&engine);
                    match gpu.launch(spin, &ONE_THREAD, &[ArgValue::U64(spin_us)]) {
                        Ok(_) => kernel_ns.fetch_add(spin_us * 1000, Ordering::Relaxed),
                        Err(e) => panic!("spin: {e}"),
                    };
                }
            })
        })
        .collect();
    std::thread::sleep(SAMPLE);
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        let _ = t.join();
    }
    let wall = start.elapsed().as_nanos() as f64;
    kernel_ns.load(Ordering::Relaxed) as f64 / wall
}

/// Every point: `counts` VMs, 1 ms and 10 ms kernels.
pub fn run(counts: &[usize]) -> Vec<Figure> {
    let mut out = Vec::new();
    for spin_us in [1000u64, 10_000] {
        for &n in counts {
            let vm = through_vgpud(n, spin_us);
            let anchor = native(n, spin_us);
            let f = fig(
                format!(
                    "{n} VMs sharing one sim GPU, {} ms kernels: GPU busy",
                    spin_us / 1000
                ),
                vm,
                "fraction",
                &format!("{n} native threads, same kernels"),
                anchor,
            );
            eprintln!("{}", f.line());
            out.push(f);
        }
    }
    out
}
