//! Small asynchronous memsets as launches of the device's built-in `fill` kernel
//! (`src/api/fill.rs`), through the library's C ABI against a sim `vgpu-worker` whose
//! per-request timeline is on: the values `cuMemsetD8Async`, `cuMemsetD16Async` and
//! `cuMemsetD32Async` write, the bytes around them untouched, and which memsets went to
//! the GPU as kernels (those of whole words up to 64 KiB inside one allocation) and which
//! as the device's memset (an unaligned one, a larger one, a synchronous one). One test
//! per file: the library is one per process.

mod common;

use std::ffi::c_uint;
use std::ptr::null_mut;
use std::time::{Duration, Instant};

use common::cuda::*;

/// Requests of `resource` in the worker's timeline files under `dir`.
fn timeline_rows(dir: &std::path::Path, resource: &str) -> usize {
    let mut n = 0;
    for e in std::fs::read_dir(dir)
        .expect("timeline directory")
        .flatten()
    {
        let text = std::fs::read_to_string(e.path()).unwrap_or_default();
        let mut lines = text.lines();
        let Some(header) = lines.next() else { continue };
        let col = header
            .split(',')
            .position(|c| c == "resource")
            .expect("a resource column");
        n += lines
            .filter(|l| l.split(',').nth(col) == Some(resource))
            .count();
    }
    n
}

#[test]
fn small_asynchronous_memsets_run_as_fill_launches() {
    let dir = std::env::temp_dir().join(format!("vgpu-api-fill-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("timeline directory");
    // SAFETY: set before the worker starts (it inherits it), while this test is the only
    // thread that touches the environment; removed once it started.
    unsafe { std::env::set_var("VGPU_TIMELINE", &dir) };
    let (worker, cu) = common::cuda::start("api-fill");
    // SAFETY: as above.
    unsafe { std::env::remove_var("VGPU_TIMELINE") };
    assert_eq!(call!(cu, "cuInit", fn(c_uint), 0), OK);
    cu.primary_context(0);
    const BYTES: usize = 256 << 10;
    let mut a = 0u64;
    assert_eq!(
        call!(cu, "cuMemAlloc", fn(*mut u64, usize), &mut a, BYTES),
        OK
    );
    let mut s: Ptr = null_mut();
    assert_eq!(
        call!(cu, "cuStreamCreate", fn(*mut Ptr, c_uint), &mut s, 1),
        OK
    );
    // A synchronous memset: the device's.
    assert_eq!(
        call!(cu, "cuMemsetD8", fn(u64, u8, usize), a, 0x11, BYTES),
        OK
    );
    let d8 = |at: u64, v: u8, n: usize| {
        call!(cu, "cuMemsetD8Async", fn(u64, u8, usize, Ptr), at, v, n, s)
    };
    // Whole words up to 64 KiB: fill launches.
    assert_eq!(d8(a, 0xab, 4096), OK);
    assert_eq!(
        call!(
            cu,
            "cuMemsetD16Async",
            fn(u64, u16, usize, Ptr),
            a + 4096,
            0x1234,
            2048,
            s
        ),
        OK
    );
    assert_eq!(
        call!(
            cu,
            "cuMemsetD32Async",
            fn(u64, c_uint, usize, Ptr),
            a + 8192,
            0xdead_beef,
            16,
            s
        ),
        OK
    );
    // Not whole words, and more than 64 KiB: the device's memset.
    assert_eq!(d8(a + 8192 + 64 + 1, 0x5a, 6), OK);
    assert_eq!(d8(a + (64 << 10), 0x77, 128 << 10), OK);
    assert_eq!(cu.sync(s), OK);

    let mut back = vec![0u8; BYTES];
    assert_eq!(cu.dtoh(&mut back, a), OK);
    let mut want = vec![0x11u8; BYTES];
    want[..4096].fill(0xab);
    for w in want[4096..8192].chunks_mut(2) {
        w.copy_from_slice(&0x1234u16.to_le_bytes());
    }
    for w in want[8192..8192 + 64].chunks_mut(4) {
        w.copy_from_slice(&0xdead_beefu32.to_le_bytes());
    }
    want[8192 + 65..8192 + 71].fill(0x5a);
    want[64 << 10..192 << 10].fill(0x77);
    let first_wrong = back.iter().zip(&want).position(|(g, w)| g != w);
    assert_eq!(first_wrong, None, "bytes as the memsets wrote them");

    // The worker writes its timeline every second.
    let deadline = Instant::now() + Duration::from_secs(10);
    while timeline_rows(&dir, "compute") < 3 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
    }
    std::thread::sleep(Duration::from_millis(1200));
    assert_eq!(
        timeline_rows(&dir, "compute"),
        3,
        "the three memsets of whole words ran as kernels"
    );
    // The synchronous memset, the unaligned one, the large one and the copy back.
    assert_eq!(timeline_rows(&dir, "copy"), 4);
    drop(worker);
    let _ = std::fs::remove_dir_all(&dir);
}
