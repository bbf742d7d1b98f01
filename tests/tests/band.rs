//! BAND end to end: two payload guests run spin kernels of different lengths
//! (0.2 ms and 5 ms) on one sim GPU with shares 70/30, every kernel passing vgpud's
//! scheduler through the grant path; the long-burst vGPU is held near its share.

use std::time::{Duration, Instant};

use vgpu_tests::daemon::{gpu_load, wait_running, TestDaemon};
use vgpu_tests::require_kvm;

/// Mean compute utilization of each vGPU over `secs` seconds of samples.
fn sample(c: &vgpu_api::client::Client, a: u32, b: u32, secs: u64) -> (f64, f64) {
    let (mut ua, mut ub, mut n) = (0.0, 0.0, 0.0);
    let end = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < end {
        std::thread::sleep(Duration::from_millis(250));
        let sa = c.vgpu_stats(a).expect("stats a");
        let sb = c.vgpu_stats(b).expect("stats b");
        if sa.window_ms > 0 && sb.window_ms > 0 {
            ua += sa.compute_utilization;
            ub += sb.compute_utilization;
            n += 1.0;
        }
    }
    assert!(n > 0.0, "no stats samples");
    (ua / n, ub / n)
}

/// Runs the two workloads under `policy`; returns their compute utilizations while they
/// compete, and how many times a second the compute engine went from one to the other.
fn measure(policy: &str) -> (f64, f64, f64) {
    // VGPU_TEST_BACKEND=cuda runs the same test on a real GPU (the GPU machine).
    let cuda = std::env::var("VGPU_TEST_BACKEND").is_ok_and(|b| b == "cuda");
    let mut args = vec!["--policy", policy];
    if cuda {
        args.extend(["--backend", "cuda"]);
    } else {
        args.extend(["--sim-gpus", "1", "--sim-memory", "2G"]);
    }
    // A cuda share holds the context's reserve (stacks of every resident thread: 273 MiB
    // on the H200 at the default limits) beside what the guest allocates.
    let share = if cuda { 1 << 30 } else { 256 << 20 };
    let d = TestDaemon::start(&format!("band-{policy}"), &args);
    let c = &d.client;
    let a = c
        .create_vm(&gpu_load(
            "rounds=1000000 spin_us=200 check=200",
            0,
            0.7,
            share,
        ))
        .expect("vm a");
    let b = c
        .create_vm(&gpu_load(
            "rounds=1000000 spin_us=5000 check=20",
            0,
            0.3,
            share,
        ))
        .expect("vm b");
    wait_running(c, a.id);
    wait_running(c, b.id);
    let (va, vb) = (a.vgpu.expect("vgpu a"), b.vgpu.expect("vgpu b"));
    // Past the first scheduling periods and the stats window.
    std::thread::sleep(Duration::from_secs(2));
    let handovers = || c.gpus().expect("gpus")[0].compute_handovers;
    let (h0, t0) = (handovers(), std::time::Instant::now());
    let (ua, ub) = sample(c, va, vb, 4);
    let per_s = handovers().saturating_sub(h0) as f64 / t0.elapsed().as_secs_f64();
    eprintln!("{policy}: compute utilization while competing: vGPU a (70%, 0.2 ms kernels) {ua:.3}, vGPU b (30%, 5 ms kernels) {ub:.3}; {per_s:.0} hand-overs a second");
    for vm in [a.id, b.id] {
        c.delete_vm(vm).expect("delete");
    }
    (ua, ub, per_s)
}

#[test]
fn band_holds_long_kernels_to_their_share() {
    require_kvm!();
    let (ua, ub, band_hands) = measure("band");
    let (_, fifo_b, fifo_hands) = measure("fifo");
    // Without a scheduler the 5 ms kernels take most of the GPU (each 0.2 ms kernel waits
    // behind one); BAND holds them near their 30%.
    assert!(
        ub < 0.38,
        "the long-kernel vGPU took {ub:.3} of the GPU under BAND, share 0.30"
    );
    assert!(fifo_b > ub + 0.15, "FIFO gave the long-kernel vGPU {fifo_b:.3}, BAND {ub:.3}: the scheduler made no difference");
    assert!(ua + ub > 0.4, "the GPU idled under BAND: {ua:.3} + {ub:.3}");
    // Both ran, so the engine went from one to the other: the GPU's count says so.
    assert!(
        band_hands > 0.0,
        "no hand-overs counted while two vGPUs shared the compute engine"
    );
    // FIFO hands over at every request of the other; BAND lets a turn run several.
    assert!(
        band_hands < fifo_hands,
        "BAND handed over {band_hands:.0} times a second, FIFO {fifo_hands:.0}"
    );
}
