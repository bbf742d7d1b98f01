//! The whole stack on a real GPU: `vgpu-worker --backend cuda` + `vmm` + payload guests
//! under KVM, every request going guest -> virtqueue -> vhost-user -> cuda backend -> GPU.
//!
//! Skips (saying why) where there is no KVM or no usable CUDA GPU (the worker cannot open
//! one); `VGPU_REQUIRE_CUDA=1` turns a skip into a failure, so a run on the GPU machine
//! cannot pass by skipping. On the GPU machine (no cargo) run the prebuilt test binary from
//! a `release/deps` folder beside `release/vmm` and `release/vgpu-worker`, with
//! `VGPU_PAYLOAD_DIR` pointing at prebuilt payloads (docs/cuda.md).
//!
//! `gpu_copy_sweep` (ignored by default) is the guest side of the CUDA backend benchmark:
//! vecadd's copy bandwidth for buffers of 4 KiB to 512 MiB (the largest vecadd's heap
//! holds), one VM per size.

use std::time::Duration;

use vgpu_tests::bins::payload;
use vgpu_tests::require_kvm;
use vgpu_tests::run::run_payload;
use vgpu_tests::worker::Worker;

const DEADLINE: Duration = Duration::from_secs(120);

/// Starts a cuda worker with `memory` bytes and `queues` queues; None (after saying why)
/// when this machine has no usable GPU.
fn cuda_worker(name: &str, memory: &str, queues: u16) -> Option<Worker> {
    match Worker::start("cuda", name, memory, queues, &["--gpu", "0"]) {
        Ok(w) => Some(w),
        Err(why) => {
            assert!(
                std::env::var_os("VGPU_REQUIRE_CUDA").is_none(),
                "VGPU_REQUIRE_CUDA is set but the cuda worker did not start: {why}"
            );
            eprintln!("SKIPPED: no usable CUDA GPU: {why}");
            None
        }
    }
}

/// Runs payload `name` with `arg` against a fresh cuda worker of `queues` queues; returns
/// the guest's output and the worker's log, or None when skipped.
fn on_gpu(name: &str, queues: u16, arg: &str, ok_line: &str) -> Option<(String, String)> {
    let w = cuda_worker(name, "1G", queues)?;
    let out = run_payload(
        &payload(name),
        &[
            "--memory",
            "512M",
            "--vgpu",
            &w.vgpu_arg(),
            "--payload-arg",
            arg,
        ],
        DEADLINE,
    );
    let log = w.output();
    assert_eq!(out.code, Some(0), "{name}: {out:?}\nworker:\n{log}");
    assert!(out.stdout.contains(ok_line), "{name}: {out:?}");
    println!("{}", out.stdout);
    assert!(
        log.contains("guest memory pinned for direct copies"),
        "{name}: the worker did not pin guest RAM: {log}"
    );
    Some((out.stdout, log))
}

#[test]
fn vecadd_passes_on_the_gpu() {
    require_kvm!();
    if let Some((out, _)) = on_gpu("vecadd", 2, "n=1000003 iters=2000", "VECADD OK") {
        assert!(
            out.contains("backend 1"),
            "the guest did not see a cuda vGPU: {out}"
        );
    }
}

#[test]
fn streams_pass_on_the_gpu() {
    require_kvm!();
    on_gpu("streams", 4, "streams=4", "STREAMS OK");
}

#[test]
fn hostile_guest_is_refused_on_the_gpu() {
    require_kvm!();
    on_gpu("hostile", 2, "", "HOSTILE OK");
}

#[test]
#[ignore = "benchmark: run on the GPU machine (docs/cuda.md)"]
fn gpu_copy_sweep() {
    require_kvm!();
    for (n, label) in [
        (1usize << 10, "4KiB"),
        (1 << 14, "64KiB"),
        (1 << 18, "1MiB"),
        (1 << 22, "16MiB"),
        (1 << 24, "64MiB"),
        (1 << 26, "256MiB"),
        (1 << 27, "512MiB"),
    ] {
        // a, b, c and a second c in the guest heap (which lives below the 3 GiB hole, so
        // 512 MiB buffers are the largest vecadd can hold); a, b, c on the device.
        let (guest_mem, share) = if n >= 1 << 27 {
            ("3G", "4G")
        } else {
            ("2G", "4G")
        };
        let Some(w) = cuda_worker(label, share, 1) else {
            return;
        };
        let out = run_payload(
            &payload("vecadd"),
            &[
                "--memory",
                guest_mem,
                "--vgpu",
                &w.vgpu_arg(),
                "--payload-arg",
                &format!("n={n} iters=2000"),
            ],
            DEADLINE,
        );
        let log = w.output();
        let lines: Vec<&str> = out
            .stdout
            .lines()
            .filter(|l| l.starts_with("BENCH"))
            .collect();
        assert!(
            lines.iter().any(|l| l.contains("vgpu_htod_bandwidth"))
                && lines.iter().any(|l| l.contains("vgpu_dtoh_bandwidth")),
            "{label}: no copy figures: {out:?}\nworker:\n{log}"
        );
        if out.code != Some(0) {
            // The copies are timed before the guest verifies c element by element; a
            // guest too slow to finish that in time still measured its copies.
            println!(
                "GUEST {label} note: the VM did not finish its own checks: {:?}",
                out.code
            );
        }
        for line in lines {
            println!("GUEST {label} {line}");
        }
    }
}

#[test]
#[ignore = "benchmark: run on the GPU machine (docs/cuda.md)"]
fn gpu_round_trips_with_and_without_queue_polling() {
    require_kvm!();
    // The same guest (vecadd's small-buffer round trips) against a worker whose queue
    // thread sleeps on every kick (0) and one that polls its ring 50 µs after each
    // request (`--poll-us`, vgpud's `--queue-poll-us`).
    for poll in ["0", "50"] {
        let w = match Worker::start("cuda", "poll", "1G", 1, &["--gpu", "0", "--poll-us", poll]) {
            Ok(w) => w,
            Err(why) => {
                assert!(
                    std::env::var_os("VGPU_REQUIRE_CUDA").is_none(),
                    "VGPU_REQUIRE_CUDA is set but the cuda worker did not start: {why}"
                );
                eprintln!("SKIPPED: no usable CUDA GPU: {why}");
                return;
            }
        };
        let out = run_payload(
            &payload("vecadd"),
            &[
                "--memory",
                "512M",
                "--vgpu",
                &w.vgpu_arg(),
                "--payload-arg",
                "n=1024 iters=5000",
            ],
            DEADLINE,
        );
        assert_eq!(out.code, Some(0), "{out:?}\nworker:\n{}", w.output());
        for line in out.stdout.lines().filter(|l| l.starts_with("BENCH")) {
            println!("POLL {poll}us {line}");
        }
    }
}
