//! A burst: more launches posted at once than one batch holds, served with the queue's
//! launch runner (`vhost/burst.rs`).

use super::*;

#[test]
fn a_burst_of_batches_runs_on_the_queue_s_launch_runner_in_ring_order() {
    let mut ring = Ring::new(
        BatchLimits {
            max_launches: 8,
            max_expected_ns: 10_000_000_000,
        },
        false,
    );
    let buf = ring.alloc(100 * 64);
    let fill = ring.function("fill");
    ring.post_launch(la(fill), &fill_args(buf, 0, 16), &[]);
    ring.kick();
    let calls = ring.calls().len();
    let seen = ring.space(64);
    // Launch i fills its own 16 words with i + 1; launch 37 is refused by the device's
    // checks, and a copy right after launch 69 reads that launch's words.
    for i in 0..100u32 {
        let la = if i == 37 {
            LaunchArgs {
                block: [0, 1, 1],
                ..la(fill)
            }
        } else {
            la(fill)
        };
        ring.post_launch(la, &fill_args(buf + u64::from(i) * 64, i + 1, 16), &[]);
        if i == 69 {
            ring.post(
                Request::MemcpyDtoH(MemcpyDtoHArgs {
                    src: buf + 69 * 64,
                    size: 64,
                }),
                &[D(seen, 64, true)],
            );
        }
    }
    let out: Vec<Status> = ring
        .kick()
        .into_iter()
        .map(|r| r.expect("response").status().expect("status"))
        .collect();
    assert_eq!(out.len(), 101);
    for (k, s) in out.iter().enumerate() {
        let want = if k == 37 {
            Status::InvalidArgument
        } else {
            Status::Ok
        };
        assert_eq!(*s, want, "response {k}");
    }
    let words = ring.dtoh_words(buf, 100 * 16);
    for (i, w) in words.chunks(16).enumerate() {
        let want = if i == 37 { 0 } else { i as u32 + 1 };
        assert!(w.iter().all(|v| *v == want), "launch {i}: {w:?}");
    }
    assert_eq!(
        ring.read(seen, 4),
        70u32.to_le_bytes(),
        "the copy ran after the launch before it"
    );
    // 70 launches (one refused) before the copy, 30 after: batches of 8, in order.
    let after = &ring.calls()[calls..];
    assert_eq!(
        after,
        [8, 8, 8, 8, 7, 8, 8, 8, 6, 8, 8, 8, 6],
        "batches of 8 launches that passed the checks"
    );
    let threads = ring.backend.threads.lock().expect("lock")[calls..].to_vec();
    assert!(
        threads.iter().all(|t| t == "vgpu5-q0-run"),
        "every batch of the two bursts ran on the queue's launch runner: {threads:?}"
    );
}
