//! `vgpu-bench sharing --backend cuda`: N VMs on one real GPU beside N native processes.
//!
//! The VM side: vgpud with the cuda backend and BAND, N VMs running `gpu-load` under KVM
//! with `spin_us=0 matmul=<d>` (copy 64 KiB in, `saxpy`, `matmul` d x d x d, one request
//! at a time), shares 1/N each (to the per mille). The anchor, in the same run: N
//! `vgpu-native-load` processes running the same loop with the same built-in kernels and
//! geometry on the same GPU (one CUDA context each, time-sliced by the driver), and one
//! alone.
//!
//! Work is counted, not device time: a round is a fixed amount of work, so the figure is
//! rounds per second, and "GPU busy (work)" is rounds/s times the kernel time of one round
//! measured alone (so N processes overlapping under time-slicing cannot overstate it).
//! `d` is calibrated first so that a round's kernels take about 1 ms, then 10 ms, alone.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use super::{plot, Series};
use crate::bench::Figure;
use crate::benches::shared::fig;
use crate::daemon::{gpu_load, wait_running, TestDaemon};

/// Rounds a VM may run (gpu-load keeps its sums exact below about 2.39 million).
const ROUNDS: u64 = 2_000_000;

/// Parts of a VM point's sample, each reported on its own line.
const WINDOWS: u32 = 3;

/// Sampling time per point: longer for 10 ms rounds, so 64 VMs each run several.
fn sample_for(target_us: u64) -> Duration {
    if target_us >= 10_000 {
        Duration::from_secs(6)
    } else {
        Duration::from_secs(4)
    }
}

/// One calibrated kernel length: matmul dimension and the round's kernel time alone.
struct Calibrated {
    target_us: u64,
    dim: u64,
    kernel_us: f64,
}

/// What one point measured.
struct Point {
    rounds_per_s: f64,
    /// The vGPUs' summed compute utilization (device time over wall time; VMs only).
    device_busy: f64,
    /// Times a second the compute engine went from one vGPU to another (VMs only: each a
    /// switch between two workers' contexts, which the next kernel pays for).
    handovers_per_s: f64,
}

fn native_bin() -> std::path::PathBuf {
    crate::bins::binary("vgpu-native-load")
}

/// The value of `key=<number>` in a `NATIVE` line of `out`.
fn field(out: &str, key: &str) -> Option<f64> {
    out.lines()
        .filter(|l| l.starts_with("NATIVE "))
        .flat_map(|l| l.split_whitespace())
        .find_map(|w| w.strip_prefix(key)?.strip_prefix('=')?.parse().ok())
}

fn calibrate(target_us: u64) -> Result<Calibrated, String> {
    let out = Command::new(native_bin())
        .args(["--calibrate-us", &target_us.to_string()])
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("cannot run vgpu-native-load: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    match (
        out.status.success(),
        field(&text, "dim"),
        field(&text, "kernel_us"),
    ) {
        (true, Some(dim), Some(kernel_us)) if dim >= 1.0 && kernel_us > 0.0 => Ok(Calibrated {
            target_us,
            dim: dim as u64,
            kernel_us,
        }),
        _ => Err(format!(
            "vgpu-native-load --calibrate-us {target_us} failed ({}): {text}",
            out.status
        )),
    }
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// `n` native processes running the loop at once: their rounds per second together. The
/// counting window opens once every process has its context, module and first round done
/// (the driver creates one GPU's contexts one after another: with 64 processes that takes
/// seconds), so every process counts the whole window.
fn native(n: usize, c: &Calibrated) -> Result<Point, String> {
    use std::io::{BufRead, BufReader, Write};
    let sample = sample_for(c.target_us);
    let mut children = Vec::new();
    let (tx, rx) = std::sync::mpsc::channel();
    let mut readers = Vec::new();
    let mut result = Ok(());
    for i in 0..n {
        let spawned = Command::new(native_bin())
            .args(["--dim", &c.dim.to_string(), "--window-from-stdin"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn();
        let mut child = match spawned {
            Ok(c) => c,
            Err(e) => {
                result = Err(format!("cannot start vgpu-native-load: {e}"));
                break;
            }
        };
        let Some(stdout) = child.stdout.take() else {
            result = Err("vgpu-native-load has no stdout pipe".into());
            children.push(child);
            break;
        };
        let tx = tx.clone();
        // Each process's lines, tagged with its index, to one channel.
        readers.push(std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send((i, Some(line))).is_err() {
                    return;
                }
            }
            let _ = tx.send((i, None));
        }));
        children.push(child);
    }
    drop(tx);
    let mut lines: Vec<Vec<String>> = vec![Vec::new(); n];
    if result.is_ok() {
        let deadline = Instant::now() + Duration::from_secs(120);
        let mut ready = 0;
        while ready < n {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok((i, None)) => {
                    result = Err(format!(
                        "native process {i} ended before it was ready (its error is above)"
                    ));
                    break;
                }
                Ok((i, Some(line))) => {
                    if line.trim() == "NATIVE ready" {
                        ready += 1;
                    }
                    if let Some(l) = lines.get_mut(i) {
                        l.push(line);
                    }
                }
                Err(_) => {
                    result = Err(format!(
                        "only {ready} of {n} native processes were ready after 120 s"
                    ));
                    break;
                }
            }
        }
    }
    let from = unix_ms() + 100;
    let until = from + sample.as_millis() as u64;
    for child in &mut children {
        // Without a window (after a failure) the process exits on the closed stdin.
        if let Some(mut stdin) = child.stdin.take() {
            if result.is_ok() {
                if let Err(e) = writeln!(stdin, "{from} {until}") {
                    result = Err(format!("cannot give a native process its window: {e}"));
                }
            }
        }
    }
    let mut failed = Vec::new();
    for child in children {
        match child.wait_with_output() {
            Ok(out) if out.status.success() => {}
            Ok(out) => failed.push(out.status.to_string()),
            Err(e) => failed.push(e.to_string()),
        }
    }
    for r in readers {
        let _ = r.join();
    }
    for (i, line) in rx.try_iter() {
        if let (Some(l), Some(line)) = (lines.get_mut(i), line) {
            l.push(line);
        }
    }
    result?;
    if !failed.is_empty() {
        return Err(format!(
            "{} of {n} native processes failed: {}",
            failed.len(),
            failed.join(", ")
        ));
    }
    let (mut rounds, mut late) = (0.0, 0.0f64);
    for l in &lines {
        let text = l.join("\n");
        rounds += field(&text, "rounds").unwrap_or(0.0);
        late = late.max(field(&text, "ready_late_ms").unwrap_or(0.0));
    }
    if late > 0.0 {
        eprintln!("sharing: a native process started counting {late:.0} ms into the window");
    }
    Ok(Point {
        rounds_per_s: rounds / sample.as_secs_f64(),
        device_busy: f64::NAN,
        handovers_per_s: f64::NAN,
    })
}

/// `n` VMs through vgpud on the cuda backend: their rounds per second together.
fn through_vgpud(n: usize, c: &Calibrated, margin_us: Option<u64>) -> Result<Point, String> {
    let args = super::vgpud_args(&["--backend", "cuda"], margin_us);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let d = TestDaemon::start(&format!("sharing-cuda-{n}-{}", c.target_us), &args);
    let client = &d.client;
    // The matrices, x, y and what the worker charges for its context and module.
    let matrices = 3 * c.dim * c.dim * 4;
    let memory = (matrices + (256 << 20)).next_multiple_of(64 << 20);
    let arg = format!("rounds={ROUNDS} spin_us=0 matmul={} check={ROUNDS}", c.dim);
    let mut vms = Vec::new();
    let mut result = Ok(());
    for share in super::shares(n) {
        match client.create_vm(&gpu_load(&arg, 0, share, memory)) {
            Ok(vm) => vms.push(vm),
            Err(e) => {
                result = Err(format!("cannot create a VM: {e}"));
                break;
            }
        }
    }
    let point = result.and_then(|()| {
        for vm in &vms {
            wait_running(client, vm.id);
        }
        // Past the first scheduling periods, the matrices' fill and the stats window.
        std::thread::sleep(Duration::from_secs(2));
        let vgpus: Vec<u32> = vms.iter().filter_map(|v| v.vgpu).collect();
        let kernels = || -> Result<u64, String> {
            let mut k = 0;
            for &v in &vgpus {
                k += client
                    .vgpu_stats(v)
                    .map_err(|e| format!("stats of vGPU {v}: {e}"))?
                    .kernels;
            }
            Ok(k)
        };
        let handovers = || -> Result<u64, String> {
            let gpus = client.gpus().map_err(|e| format!("the GPUs: {e}"))?;
            Ok(gpus.first().map_or(0, |g| g.compute_handovers))
        };
        // The sample in WINDOWS parts, each reported: a figure that one stall dragged
        // down shows it in one part, a state of the whole run in all of them.
        let part = sample_for(c.target_us) / WINDOWS;
        let (k0, h0, t0) = (kernels()?, handovers()?, Instant::now());
        let (mut sum, mut samples) = (0.0, 0u32);
        let (mut k, mut h, mut t) = (k0, h0, t0);
        for w in 1..=WINDOWS {
            let (mut wsum, mut wsamples) = (0.0, 0u32);
            while t.elapsed() < part {
                std::thread::sleep(Duration::from_millis(250));
                let mut total = 0.0;
                let mut complete = true;
                for &v in &vgpus {
                    match client.vgpu_stats(v) {
                        Ok(s) if s.window_ms > 0 => total += s.compute_utilization,
                        _ => complete = false,
                    }
                }
                if complete {
                    wsum += total;
                    wsamples += 1;
                }
            }
            let (kw, hw, now) = (kernels()?, handovers()?, Instant::now());
            let secs = now.duration_since(t).as_secs_f64();
            // Two kernels a round: saxpy and matmul.
            let rounds_per_s = kw.saturating_sub(k) as f64 / 2.0 / secs;
            println!(
                "sharing: {n} VMs, {} ms rounds, part {w} of {WINDOWS} ({secs:.1} s): \
                 busy (work) {:.3}, device time {}; {}",
                c.target_us / 1000,
                rounds_per_s * c.kernel_us / 1e6,
                if wsamples == 0 {
                    "unread".to_owned()
                } else {
                    format!("{:.3}", wsum / f64::from(wsamples))
                },
                turns(hw.saturating_sub(h) as f64 / secs, rounds_per_s)
            );
            (sum, samples) = (sum + wsum, samples + wsamples);
            (k, h, t) = (kw, hw, now);
        }
        let secs = t.duration_since(t0).as_secs_f64();
        Ok(Point {
            rounds_per_s: k.saturating_sub(k0) as f64 / 2.0 / secs,
            device_busy: if samples == 0 {
                0.0
            } else {
                sum / f64::from(samples)
            },
            handovers_per_s: h.saturating_sub(h0) as f64 / secs,
        })
    });
    for vm in &vms {
        if let Err(e) = client.delete_vm(vm.id) {
            eprintln!("sharing: cannot delete VM {}: {e}", vm.id);
        }
    }
    point
}

/// The engine's hand-overs a second and the kernels a turn between two of them (two
/// kernels a round).
fn turns(handovers_per_s: f64, rounds_per_s: f64) -> String {
    if handovers_per_s > 0.0 {
        format!(
            "{handovers_per_s:.0} hand-overs a second, {:.1} kernels a turn",
            2.0 * rounds_per_s / handovers_per_s
        )
    } else {
        "no hand-overs".to_owned()
    }
}

/// The goal for `n` VMs with rounds of `target_us`, on work-counted GPU busy, and whether
/// `busy` (and for one VM the ratio to the lone native process) meets it: busy >= 0.98
/// with 10 ms rounds; with 1 ms rounds >= 0.93 for one VM, >= 0.90 for several.
fn goal(n: usize, target_us: u64, busy: f64, ratio_to_one: f64) -> (String, bool) {
    let want = match (n, target_us >= 10_000) {
        (_, true) => 0.98,
        (1, false) => 0.93,
        (_, false) => 0.90,
    };
    if n == 1 {
        (
            format!("one VM: GPU busy >= {want:.2} and >= 0.9x the lone native process"),
            busy >= want && ratio_to_one >= 0.9,
        )
    } else {
        (format!("GPU busy >= {want:.2}"), busy >= want)
    }
}

/// Every point: `counts` VMs, 1 ms and 10 ms rounds. Exits non-zero when a point cannot
/// be measured (the goals are reported, not enforced).
pub fn run(counts: &[usize], margin_us: Option<u64>) -> Vec<Figure> {
    let mut out = Vec::new();
    let mut series = Vec::new();
    let mut failed = false;
    for target_us in [1000u64, 10_000] {
        let c = match calibrate(target_us) {
            Ok(c) => c,
            Err(e) => {
                println!("SHARING FAIL calibrate {} ms: {e}", target_us / 1000);
                failed = true;
                continue;
            }
        };
        let ms = target_us / 1000;
        println!(
            "sharing: {ms} ms rounds: matmul {d} x {d} x {d}, round's kernels alone {:.1} us",
            c.kernel_us,
            d = c.dim
        );
        let (mut vm_line, mut native_line) = (Vec::new(), Vec::new());
        let mut lone = f64::NAN;
        for &n in counts {
            let (vm, nat) = match (through_vgpud(n, &c, margin_us), native(n, &c)) {
                (Ok(v), Ok(a)) => (v, a),
                (Err(e), _) | (_, Err(e)) => {
                    println!("SHARING FAIL {n} VMs, {ms} ms rounds: {e}");
                    failed = true;
                    continue;
                }
            };
            if n == 1 {
                lone = nat.rounds_per_s;
            }
            let busy = |p: &Point| p.rounds_per_s * c.kernel_us / 1e6;
            let (vb, nb) = (busy(&vm), busy(&nat));
            let what = format!("{n} VMs on cuda, {ms} ms rounds");
            let anchor = format!("{n} native processes, same loop");
            out.push(fig(
                format!("{what}: GPU busy (work)"),
                vb,
                "fraction",
                &anchor,
                nb,
            ));
            out.push(fig(
                format!("{what}: rounds"),
                vm.rounds_per_s,
                "1/s",
                &anchor,
                nat.rounds_per_s,
            ));
            for f in &out[out.len() - 2..] {
                println!("{}", f.line());
            }
            let (g, met) = goal(n, target_us, vb, vm.rounds_per_s / lone);
            println!(
                "GOAL {} {what}: {g} (busy {vb:.3}, device time {:.3}, native {nb:.3}, \
                 to the lone native process {:.2}x; {})",
                if met { "met" } else { "missed" },
                vm.device_busy,
                vm.rounds_per_s / lone,
                turns(vm.handovers_per_s, vm.rounds_per_s)
            );
            vm_line.push((n, vb));
            native_line.push((n, nb));
        }
        series.push(Series {
            label: format!("VMs, {ms} ms rounds"),
            points: vm_line,
            thick: true,
        });
        series.push(Series {
            label: format!("native processes, {ms} ms rounds"),
            points: native_line,
            thick: false,
        });
    }
    plot(
        &series,
        "GPU busy with N VMs (BAND, cuda) and N native processes",
        "fixed-work rounds (copy in, saxpy, matmul) counted; busy = rounds/s x a round's kernel time alone",
        std::path::Path::new("out/bench-sharing-busy.png"),
    );
    if failed {
        println!("SHARING FAIL: some points were not measured");
        std::process::exit(1);
    }
    println!("SHARING PASS: every point measured");
    out
}
