//! A program's launch loop through the library against a sim `vgpu-worker`: launches
//! posted behind a long kernel do not wait for it. The library keeps up to 128 requests in
//! flight per queue, more than one of the worker's batches, so the worker can gather the
//! next batch while it runs the last (`vgpu-device/src/vhost/burst.rs`); the loop's
//! result shows every launch ran once, in order. One test per file: the library is one
//! per process.

mod common;

use std::ffi::c_uint;
use std::ptr::null_mut;
use std::time::{Duration, Instant};

use common::cuda::*;

/// Launches posted behind the long kernel: more than one batch of the worker's (64).
const ROUNDS: usize = 100;
const N: usize = 4096;
/// The long kernel, and how long posting the launches behind it may take at most.
const LONG_US: u64 = 400_000;
const POST_LIMIT: Duration = Duration::from_millis(200);

#[test]
fn launches_behind_a_long_kernel_are_posted_without_waiting_and_run_in_order() {
    let (_worker, cu) = common::cuda::start("api-burst");
    assert_eq!(call!(cu, "cuInit", fn(c_uint), 0), OK);
    let _ctx = cu.primary_context(0);
    let bytes = N * 4;
    let (mut y, mut ones) = (0u64, 0u64);
    for p in [&mut y, &mut ones] {
        assert_eq!(call!(cu, "cuMemAlloc", fn(*mut u64, usize), p, bytes), OK);
    }
    assert_eq!(
        call!(cu, "cuMemsetD32", fn(u64, c_uint, usize), y, 0, N),
        OK
    );
    assert_eq!(
        call!(
            cu,
            "cuMemsetD32",
            fn(u64, c_uint, usize),
            ones,
            1f32.to_bits(),
            N
        ),
        OK
    );
    let module = cu.builtin_module();
    let (spin, vadd) = (
        cu.function(module, c"spin"),
        cu.function(module, c"vector_add"),
    );
    let mut stream: Ptr = null_mut();
    assert_eq!(
        call!(cu, "cuStreamCreate", fn(*mut Ptr, c_uint), &mut stream, 0),
        OK
    );
    let launch = |f: Ptr, grid: c_uint, block: c_uint, params: &mut [Ptr]| {
        cu.launch_1d(f, grid, block, stream, params)
    };
    let mut n = N as u64;
    let mut add: [Ptr; 4] = [
        (&mut y as *mut u64).cast(),
        (&mut ones as *mut u64).cast(),
        (&mut y as *mut u64).cast(),
        (&mut n as *mut u64).cast(),
    ];
    let grid = (N / 256) as c_uint;
    // Timed once, waited for.
    assert_eq!(launch(vadd, grid, 256, &mut add), OK);
    assert_eq!(cu.sync(stream), OK);
    let mut us = LONG_US;
    assert_eq!(launch(spin, 1, 1, &mut [(&mut us as *mut u64).cast()]), OK);
    let t = Instant::now();
    for round in 0..ROUNDS {
        assert_eq!(
            launch(vadd, grid, 256, &mut add),
            OK,
            "add of round {round}"
        );
    }
    let posted = t.elapsed();
    assert!(
        posted < POST_LIMIT,
        "posting {ROUNDS} launches behind a {LONG_US} µs kernel took {posted:?}: the \
         library waited for room in its queue"
    );
    assert_eq!(cu.sync(stream), OK);
    let mut back = vec![0u8; bytes];
    assert_eq!(cu.dtoh(&mut back, y), OK);
    let sums = floats(&back);
    assert!(
        sums.iter().all(|&v| v == (ROUNDS + 1) as f32),
        "every add ran once: {:?}",
        &sums[..8]
    );
}
