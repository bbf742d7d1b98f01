//! The vGPU device on the sim backend: guest copy throughput HtoD and DtoH from
//! 4 KiB to 256 MiB beside a plain host memcpy of the same size in the same run, the
//! small-request round trip, and requests/s with 1, 8 and 64 requests per doorbell.

use std::time::{Duration, Instant};

use crate::bench::{bench_value, Figure, VM_DEADLINE};
use crate::bins::payload;
use crate::run::run_payload;
use crate::worker::Worker;

/// Host memcpy bandwidth for `bytes`, MB/s (best of a few, like the guest's single copy
/// after warm-up).
fn memcpy_mb_s(bytes: usize) -> f64 {
    let src = vec![0x5au8; bytes];
    let mut dst = vec![0u8; bytes];
    let reps = (64 << 20) / bytes.max(1) + 1;
    let mut best = Duration::MAX;
    for _ in 0..3 {
        let t = Instant::now();
        for _ in 0..reps {
            dst.copy_from_slice(std::hint::black_box(&src));
        }
        best = best.min(t.elapsed() / reps as u32);
    }
    std::hint::black_box(&dst);
    bytes as f64 / best.as_secs_f64().max(1e-12) / 1e6
}

fn fig(
    name: String,
    value: f64,
    unit: &str,
    anchor_name: &str,
    anchor: f64,
    anchor_unit: &str,
) -> Figure {
    Figure {
        name,
        value,
        unit: unit.into(),
        anchor_name: anchor_name.into(),
        anchor,
        anchor_unit: anchor_unit.into(),
    }
}

pub fn run() -> Vec<Figure> {
    if !crate::bins::have_kvm() {
        eprintln!("vgpu-bench device: /dev/kvm is not available; nothing to measure");
        std::process::exit(2);
    }
    let mut out = Vec::new();
    let sizes: [(usize, &str); 6] = [
        (4 << 10, "4 KiB"),
        (64 << 10, "64 KiB"),
        (1 << 20, "1 MiB"),
        (16 << 20, "16 MiB"),
        (64 << 20, "64 MiB"),
        (256 << 20, "256 MiB"),
    ];
    for (i, (bytes, label)) in sizes.iter().enumerate() {
        let w = Worker::start("sim", &format!("bench-{i}"), "1G", 1, &[])
            .unwrap_or_else(|e| panic!("{e}"));
        let arg = format!("n={} iters=2000", bytes / 4);
        let o = run_payload(
            &payload("vecadd"),
            &[
                "--memory",
                "2G",
                "--vgpu",
                &w.vgpu_arg(),
                "--payload-arg",
                &arg,
            ],
            VM_DEADLINE,
        );
        drop(w);
        assert_eq!(o.code, Some(0), "vecadd {label}: {o:?}");
        let host = memcpy_mb_s(*bytes);
        for (dir, key) in [
            ("HtoD", "vgpu_htod_bandwidth"),
            ("DtoH", "vgpu_dtoh_bandwidth"),
        ] {
            let v = bench_value(&o, key).unwrap_or(f64::NAN);
            out.push(fig(
                format!("guest {dir} {label}"),
                v / 1000.0,
                "GB/s",
                "host memcpy",
                host / 1000.0,
                "GB/s",
            ));
        }
        if i == 0 {
            let rt = bench_value(&o, "vgpu_request_roundtrip").unwrap_or(f64::NAN);
            let one = bench_value(&o, "vgpu_requests_per_s_batch1").unwrap_or(f64::NAN);
            out.push(fig(
                "small-request round trip (STREAM_SYNC)".into(),
                rt / 1000.0,
                "us",
                "1 request per doorbell, as a rate",
                1e6 / one,
                "us",
            ));
            for b in [8, 64] {
                let v =
                    bench_value(&o, &format!("vgpu_requests_per_s_batch{b}")).unwrap_or(f64::NAN);
                out.push(fig(
                    format!("requests/s, {b} per doorbell"),
                    v,
                    "req/s",
                    "1 per doorbell",
                    one,
                    "req/s",
                ));
            }
        }
    }
    out
}
