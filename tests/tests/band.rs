//! BAND end to end (issue 5): two payload guests run spin kernels of different lengths
//! (0.2 ms and 5 ms) on one sim GPU with shares 70/30, every kernel passing vgpud's
//! scheduler through the grant path; the long-burst vGPU is held near its share.

use std::time::{Duration, Instant};

use vgpu_tests::daemon::{gpu_load, wait_running, TestDaemon};
use vgpu_tests::require_kvm;

/// Mean compute utilization of each vGPU over `secs` seconds of samples.
fn sample(c: &vgpud::client::Client, a: u32, b: u32, secs: u64) -> (f64, f64) {
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

#[test]
fn shares_hold_with_short_and_long_kernels() {
    require_kvm!();
    let d = TestDaemon::start("band", &["--sim-gpus", "1", "--sim-memory", "2G"]);
    let c = &d.client;
    let a = c
        .create_vm(&gpu_load(
            "rounds=1000000 spin_us=200 check=200",
            0,
            0.7,
            256 << 20,
        ))
        .expect("vm a");
    let b = c
        .create_vm(&gpu_load(
            "rounds=1000000 spin_us=5000 check=20",
            0,
            0.3,
            256 << 20,
        ))
        .expect("vm b");
    wait_running(c, a.id);
    wait_running(c, b.id);
    let (va, vb) = (a.vgpu.expect("vgpu a"), b.vgpu.expect("vgpu b"));
    // Past the first scheduling periods and the stats window.
    std::thread::sleep(Duration::from_secs(2));
    let (ua, ub) = sample(c, va, vb, 4);
    eprintln!("compute utilization while competing: vGPU a (70%, 0.2 ms kernels) {ua:.3}, vGPU b (30%, 5 ms kernels) {ub:.3}");
    // Without a scheduler the 5 ms kernels would take most of the GPU (a 0.2 ms kernel
    // waits behind each one); BAND holds them near 30%.
    assert!(
        ub < 0.38,
        "the long-kernel vGPU took {ub:.3} of the GPU, share 0.30"
    );
    assert!(
        ua > ub,
        "the 70% vGPU got {ua:.3}, less than the 30% one's {ub:.3}"
    );
    assert!(ua + ub > 0.5, "the GPU idled: {ua:.3} + {ub:.3}");
    for vm in [a.id, b.id] {
        c.delete_vm(vm).expect("delete");
    }
}
