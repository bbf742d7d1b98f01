//! `vgpu-bench sharing`: how busy N VMs sharing one GPU keep it, beside N native threads
//! running the same kernels on the same GPU in the same run.
//!
//! Each VM runs `gpu-load` (copy in, saxpy, one `spin` kernel of 1 ms or 10 ms per round)
//! through vgpud with BAND, shares summing to 100 %; GPU busy is the sum of the vGPUs'
//! compute utilization (kernel device time over wall time) sampled while all run. The
//! anchor is N host threads launching the same `spin` kernel on one sim GPU directly, one
//! kernel at a time (no VM, no worker, no grant): kernel time over wall time.
//!
//! `--backend cuda` (the GPU machine, `ci/gpu/suite.sh sharing`) runs the VMs on a real
//! GPU beside N native processes and counts fixed-work rounds instead ([`cuda`]).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use vgpu_backend::{ArgValue, Backend, LaunchOne, ModuleImage, SimConfig, SimGpu};

use super::shared::{fig, ONE_THREAD};
use crate::bench::Figure;
use crate::daemon::{gpu_load, wait_running, TestDaemon};

mod cuda;

/// Seconds of sampling per point.
const SAMPLE: Duration = Duration::from_secs(3);

/// vgpud's options for a sharing run: BAND, and the hand-over margin when one is asked for
/// (vgpud's own default otherwise).
pub(crate) fn vgpud_args(base: &[&str], margin_us: Option<u64>) -> Vec<String> {
    let mut args: Vec<String> = ["--policy", "band"]
        .iter()
        .chain(base)
        .map(|s| (*s).to_owned())
        .collect();
    if let Some(us) = margin_us {
        args.extend(["--band-margin-us".to_owned(), us.to_string()]);
    }
    args
}

/// GPU busy with `n` VMs running `spin_us` kernels through vgpud (sim GPU), and how many
/// times a second the compute engine went from one vGPU to another meanwhile.
fn through_vgpud(n: usize, spin_us: u64, margin_us: Option<u64>) -> (f64, f64) {
    let args = vgpud_args(&["--sim-gpus", "1", "--sim-memory", "4G"], margin_us);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let d = TestDaemon::start(&format!("sharing-{n}-{spin_us}"), &args);
    let c = &d.client;
    let arg = format!("rounds=1000000 spin_us={spin_us} check=1000");
    let mut vms = Vec::new();
    for share in shares(n) {
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
    let handovers = || {
        c.gpus()
            .ok()
            .and_then(|g| g.first().map(|g| g.compute_handovers))
            .unwrap_or(0)
    };
    let (mut sum, mut samples) = (0.0, 0u32);
    let (h0, start) = (handovers(), Instant::now());
    let end = start + SAMPLE;
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
    let per_s = handovers().saturating_sub(h0) as f64 / start.elapsed().as_secs_f64();
    for vm in &vms {
        if let Err(e) = c.delete_vm(vm.id) {
            eprintln!("sharing: cannot delete VM {}: {e}", vm.id);
        }
    }
    let busy = if samples == 0 {
        0.0
    } else {
        sum / f64::from(samples)
    };
    (busy, per_s)
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
        .modules()
        .module_load(ModuleImage::Builtin(b"builtin"))
        .unwrap_or_else(|e| panic!("builtin module: {e}"));
    let spin = gpu
        .modules()
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
                    match gpu.launch_one(spin, &ONE_THREAD, &[ArgValue::U64(spin_us)]) {
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

/// `n` compute shares summing to the whole GPU in vgpud's unit (per mille): 1/n each,
/// the remainder spread one per mille at a time (64 VMs: 40 of 16 ‰ and 24 of 15 ‰).
fn shares(n: usize) -> Vec<f64> {
    let n = n.max(1) as u32;
    let (base, rest) = (1000 / n, 1000 % n);
    (0..n)
        .map(|i| f64::from(base + u32::from(i < rest)) / 1000.0)
        .collect()
}

/// One line of the busy-against-N plot.
struct Series {
    label: String,
    /// (N, GPU busy).
    points: Vec<(usize, f64)>,
    /// Thick for VMs, thin for the anchor.
    thick: bool,
}

/// GPU busy against log2 N, one line per series, as a PNG at `path`.
fn plot(series: &[Series], title: &str, subtitle: &str, path: &std::path::Path) {
    use vgpuctl::plot::{Line, Style};
    let lines: Vec<Line> = series
        .iter()
        .enumerate()
        .map(|(i, s)| Line {
            label: Some(s.label.clone()),
            points: s
                .points
                .iter()
                .map(|(n, b)| ((*n as f64).log2(), *b))
                .collect(),
            color: i / 2,
            style: if s.thick { Style::Thick } else { Style::Thin },
        })
        .collect();
    match vgpuctl::plot::xy_png(
        path,
        title,
        subtitle,
        &vgpuctl::plot::Axes {
            x_label: "log2 N (VMs; native: processes or threads)",
            y_label: "busy",
            percent: true,
        },
        &lines,
    ) {
        Ok(()) => println!("(plot of GPU busy against N: {})", path.display()),
        Err(e) => eprintln!("vgpu-bench sharing: cannot draw {}: {e}", path.display()),
    }
}

/// Every point on `backend` (`sim` or `cuda`).
pub fn run(counts: &[usize], backend: &str, margin_us: Option<u64>) -> Vec<Figure> {
    let counts: Vec<usize> = counts.iter().copied().filter(|&n| n > 0).collect();
    if let Some(us) = margin_us {
        eprintln!("vgpud runs with --band-margin-us {us}");
    }
    match backend {
        "cuda" => cuda::run(&counts, margin_us),
        "sim" => run_sim(&counts, margin_us),
        other => {
            eprintln!("vgpu-bench sharing: unknown backend {other} (sim or cuda)");
            std::process::exit(2);
        }
    }
}

/// Every point on a sim GPU: `counts` VMs, 1 ms and 10 ms kernels.
fn run_sim(counts: &[usize], margin_us: Option<u64>) -> Vec<Figure> {
    let mut out = Vec::new();
    let mut series = Vec::new();
    for spin_us in [1000u64, 10_000] {
        let (mut vm_line, mut native_line) = (Vec::new(), Vec::new());
        for &n in counts {
            let (vm, handovers) = through_vgpud(n, spin_us, margin_us);
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
            eprintln!(
                "{n} VMs, {} ms kernels: {handovers:.0} hand-overs a second",
                spin_us / 1000
            );
            out.push(f);
            vm_line.push((n, vm));
            native_line.push((n, anchor));
        }
        let ms = spin_us / 1000;
        series.push(Series {
            label: format!("VMs, {ms} ms kernels"),
            points: vm_line,
            thick: true,
        });
        series.push(Series {
            label: format!("native threads, {ms} ms kernels"),
            points: native_line,
            thick: false,
        });
    }
    plot(
        &series,
        "GPU busy with N VMs (BAND, sim GPU) and N native threads",
        "busy = kernel time / wall time, summed over the VMs",
        std::path::Path::new("out/bench-sharing-busy.png"),
    );
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn shares_sum_to_the_whole_gpu_in_per_mille() {
        for n in [1usize, 2, 3, 8, 64, 1000] {
            let s = super::shares(n);
            assert_eq!(s.len(), n);
            let permille: u32 = s.iter().map(|f| (f * 1000.0).round() as u32).sum();
            assert_eq!(permille, 1000, "{n} VMs");
        }
    }
}
