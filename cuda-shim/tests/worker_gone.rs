//! A worker that dies under a running program: the waiting call answers
//! CUDA_ERROR_DEVICE_UNAVAILABLE within moments (not after the request timeout), and so
//! does every later call; the program is never aborted.

mod common;

use std::ffi::{c_int, c_uint, c_void};
use std::ptr::null_mut;
use std::time::{Duration, Instant};

use common::cuda::*;

const DEVICE_UNAVAILABLE: R = 46;

#[test]
fn a_dead_worker_answers_device_unavailable() {
    let (worker, cu) = common::cuda::start("gone");
    assert_eq!(call!(cu, "cuInit", fn(c_uint), 0), OK);
    let mut ctx: Ptr = null_mut();
    assert_eq!(
        call!(
            cu,
            "cuCtxCreate",
            fn(*mut Ptr, Ptr, c_uint, c_int),
            &mut ctx,
            null_mut(),
            0,
            0
        ),
        OK
    );
    let mut d = 0u64;
    assert_eq!(
        call!(cu, "cuMemAlloc", fn(*mut u64, usize), &mut d, 4096),
        OK
    );
    let mut module: Ptr = null_mut();
    let image = c"vgpu:builtin";
    assert_eq!(
        call!(
            cu,
            "cuModuleLoadData",
            fn(*mut Ptr, *const c_void),
            &mut module,
            image.as_ptr().cast()
        ),
        OK
    );
    let mut spin: Ptr = null_mut();
    assert_eq!(
        call!(
            cu,
            "cuModuleGetFunction",
            fn(*mut Ptr, Ptr, *const std::ffi::c_char),
            &mut spin,
            module,
            c"spin".as_ptr()
        ),
        OK
    );
    let mut s: Ptr = null_mut();
    assert_eq!(
        call!(cu, "cuStreamCreate", fn(*mut Ptr, c_uint), &mut s, 0),
        OK
    );
    let mut us = 5_000_000u64;
    let mut params: [Ptr; 1] = [(&mut us as *mut u64).cast()];
    let launch = call!(
        cu,
        "cuLaunchKernel",
        fn(Ptr, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, Ptr, *mut Ptr, *mut Ptr),
        spin,
        1,
        1,
        1,
        1,
        1,
        1,
        0,
        s,
        params.as_mut_ptr(),
        null_mut()
    );
    assert_eq!(launch, OK);

    let killer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(200));
        drop(worker);
    });
    let start = Instant::now();
    assert_eq!(
        call!(cu, "cuStreamSynchronize", fn(Ptr), s),
        DEVICE_UNAVAILABLE
    );
    let waited = start.elapsed();
    assert!(waited < Duration::from_secs(3), "noticed after {waited:?}");
    killer.join().expect("killer");
    assert_eq!(
        call!(cu, "cuMemAlloc", fn(*mut u64, usize), &mut d, 4096),
        DEVICE_UNAVAILABLE
    );
    assert_eq!(call!(cu, "cuCtxSynchronize", fn()), DEVICE_UNAVAILABLE);
}
