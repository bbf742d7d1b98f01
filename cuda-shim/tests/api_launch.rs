//! The library through its C ABI, loaded with `dlopen` against a sim `vgpu-worker`:
//! built-in modules, launches (kernelParams and extra), streams, events, asynchronous
//! errors, modules the sim refuses. One test per file: the library is one per process.

mod common;

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::ptr::null_mut;
use std::time::{Duration, Instant};

use common::cuda::*;

#[test]
fn modules_launches_streams_and_events() {
    let (worker, cu) = common::cuda::start("api-launch");
    assert_eq!(call!(cu, "cuInit", fn(c_uint), 0), OK);
    let dev: c_int = 0;
    let primary = cu.primary_context(dev);
    let n_el = 1usize << 16;
    let bytes = n_el * 4;
    let (mut a, mut b, mut c) = (0u64, 0u64, 0u64);
    for p in [&mut a, &mut b, &mut c] {
        assert_eq!(call!(cu, "cuMemAlloc", fn(*mut u64, usize), p, bytes), OK);
    }
    let ha: Vec<f32> = (0..n_el).map(|i| i as f32).collect();
    let hb: Vec<f32> = (0..n_el).map(|i| 2.0 * i as f32).collect();
    let htod = |d: u64, h: &[f32]| {
        call!(
            cu,
            "cuMemcpyHtoD",
            fn(u64, *const c_void, usize),
            d,
            h.as_ptr().cast(),
            bytes
        )
    };
    assert_eq!(htod(a, &ha), OK);
    assert_eq!(htod(b, &hb), OK);
    let mut back = vec![0u8; bytes];
    let mut pinned: Ptr = null_mut();
    assert_eq!(
        call!(
            cu,
            "cuMemAllocHost",
            fn(*mut Ptr, usize),
            &mut pinned,
            bytes
        ),
        OK
    );

    // Streams, built-in kernels, asynchronous copies.
    let (mut s1, mut s2): (Ptr, Ptr) = (null_mut(), null_mut());
    assert_eq!(
        call!(cu, "cuStreamCreate", fn(*mut Ptr, c_uint), &mut s1, 0),
        OK
    );
    assert_eq!(
        call!(cu, "cuStreamCreate", fn(*mut Ptr, c_uint), &mut s2, 1),
        OK
    );
    let module = cu.builtin_module();
    let mut vadd: Ptr = null_mut();
    let mut saxpy: Ptr = null_mut();
    let mut spin: Ptr = null_mut();
    let mut gather: Ptr = null_mut();
    let get_fn = |out: &mut Ptr, name: &CStr| {
        call!(
            cu,
            "cuModuleGetFunction",
            fn(*mut Ptr, Ptr, *const c_char),
            out,
            module,
            name.as_ptr()
        )
    };
    assert_eq!(get_fn(&mut vadd, c"vector_add"), OK);
    assert_eq!(get_fn(&mut saxpy, c"saxpy"), OK);
    assert_eq!(get_fn(&mut spin, c"spin"), OK);
    assert_eq!(get_fn(&mut gather, c"gather"), OK);
    let mut none: Ptr = null_mut();
    assert_eq!(get_fn(&mut none, c"no_such_kernel"), NOT_FOUND);

    macro_rules! launch {
        ($f:expr, $grid:expr, $block:expr, $stream:expr, $params:expr, $extra:expr) => {
            call!(
                cu,
                "cuLaunchKernel",
                fn(
                    Ptr,
                    c_uint,
                    c_uint,
                    c_uint,
                    c_uint,
                    c_uint,
                    c_uint,
                    c_uint,
                    Ptr,
                    *mut Ptr,
                    *mut Ptr,
                ),
                $f,
                $grid,
                1,
                1,
                $block,
                1,
                1,
                0,
                $stream,
                $params,
                $extra
            )
        };
    }
    // vector_add with kernelParams: c = a + b.
    let mut n64 = n_el as u64;
    let mut params: [Ptr; 4] = [
        (&mut a as *mut u64).cast(),
        (&mut b as *mut u64).cast(),
        (&mut c as *mut u64).cast(),
        (&mut n64 as *mut u64).cast(),
    ];
    assert_eq!(
        launch!(vadd, 256, 256, s1, params.as_mut_ptr(), null_mut()),
        OK
    );
    // saxpy with a parameter buffer, after vector_add on the same stream (it rewrites b):
    // y (= b) = 0.5 * x (= a) + y.
    #[repr(C)]
    struct SaxpyArgs {
        alpha: f32,
        _pad: u32,
        x: u64,
        y: u64,
        n: u64,
    }
    let mut args = SaxpyArgs {
        alpha: 0.5,
        _pad: 0,
        x: a,
        y: b,
        n: n_el as u64,
    };
    let mut size = std::mem::size_of::<SaxpyArgs>();
    let mut extra: [Ptr; 5] = [
        1 as Ptr,
        (&mut args as *mut SaxpyArgs).cast(),
        2 as Ptr,
        (&mut size as *mut usize).cast(),
        null_mut(),
    ];
    assert_eq!(
        launch!(saxpy, 256, 256, s1, null_mut(), extra.as_mut_ptr()),
        OK
    );
    // Bad launches.
    let mut small = 8usize;
    let mut short: [Ptr; 5] = [
        1 as Ptr,
        (&mut args as *mut SaxpyArgs).cast(),
        2 as Ptr,
        (&mut small as *mut usize).cast(),
        null_mut(),
    ];
    assert_eq!(
        launch!(saxpy, 1, 32, s2, null_mut(), short.as_mut_ptr()),
        INVALID_VALUE
    );
    assert_eq!(
        launch!(vadd, 1, 2048, s1, params.as_mut_ptr(), null_mut()),
        INVALID_VALUE
    );
    assert_eq!(
        launch!(vadd, 0, 32, s1, params.as_mut_ptr(), null_mut()),
        INVALID_VALUE
    );
    assert_eq!(
        launch!(vadd, 1, 32, s1, params.as_mut_ptr(), extra.as_mut_ptr()),
        INVALID_VALUE
    );
    assert_eq!(
        launch!(0x777770 as Ptr, 1, 32, s1, params.as_mut_ptr(), null_mut()),
        INVALID_HANDLE
    );
    assert_eq!(
        launch!(vadd, 1, 32, 0x55550 as Ptr, params.as_mut_ptr(), null_mut()),
        INVALID_HANDLE
    );

    assert_eq!(call!(cu, "cuStreamSynchronize", fn(Ptr), s1), OK);
    assert_eq!(call!(cu, "cuStreamSynchronize", fn(Ptr), s2), OK);
    // Asynchronous copies into pinned memory, then the host reads it.
    assert_eq!(
        call!(
            cu,
            "cuMemcpyDtoHAsync",
            fn(*mut c_void, u64, usize, Ptr),
            pinned,
            c,
            bytes,
            s1
        ),
        OK
    );
    assert_eq!(call!(cu, "cuStreamSynchronize", fn(Ptr), s1), OK);
    // SAFETY: `bytes` bytes of pinned memory the device finished writing.
    let got = floats(unsafe { std::slice::from_raw_parts(pinned.cast::<u8>(), bytes) });
    assert!(
        got.iter().enumerate().all(|(i, &v)| v == 3.0 * i as f32),
        "vector_add"
    );
    assert_eq!(
        call!(
            cu,
            "cuMemcpyDtoHAsync",
            fn(*mut c_void, u64, usize, Ptr),
            pinned,
            b,
            bytes,
            s2
        ),
        OK
    );
    assert_eq!(call!(cu, "cuStreamSynchronize", fn(Ptr), s2), OK);
    // SAFETY: as above.
    let got = floats(unsafe { std::slice::from_raw_parts(pinned.cast::<u8>(), bytes) });
    assert!(
        got.iter().enumerate().all(|(i, &v)| v == 2.5 * i as f32),
        "saxpy"
    );
    // More asynchronous copies from pageable memory than the ring has descriptors for
    // (three each): the oldest complete to make room, none fails.
    let chunk = bytes / 64;
    for i in 0..64 {
        let src = ha[i * chunk / 4..].as_ptr().cast::<c_void>();
        let dst = c + (i * chunk) as u64;
        assert_eq!(
            call!(
                cu,
                "cuMemcpyHtoDAsync",
                fn(u64, *const c_void, usize, Ptr),
                dst,
                src,
                chunk,
                s1
            ),
            OK,
            "copy {i}"
        );
    }
    assert_eq!(call!(cu, "cuStreamSynchronize", fn(Ptr), s1), OK);
    assert_eq!(
        call!(
            cu,
            "cuMemcpyDtoH",
            fn(*mut c_void, u64, usize),
            back.as_mut_ptr().cast(),
            c,
            bytes
        ),
        OK
    );
    assert_eq!(floats(&back), ha);

    // Asynchronous memsets and copies from pageable memory, many per doorbell.
    for v in 1..=5u32 {
        assert_eq!(
            call!(
                cu,
                "cuMemsetD32Async",
                fn(u64, u32, usize, Ptr),
                c,
                v,
                n_el,
                s1
            ),
            OK
        );
    }
    assert_eq!(
        call!(
            cu,
            "cuMemcpyHtoDAsync",
            fn(u64, *const c_void, usize, Ptr),
            a,
            hb.as_ptr().cast(),
            bytes,
            s1
        ),
        OK
    );
    assert_eq!(
        call!(
            cu,
            "cuMemcpyDtoDAsync",
            fn(u64, u64, usize, Ptr),
            b,
            a,
            bytes,
            s1
        ),
        OK
    );
    assert_eq!(
        call!(cu, "cuMemsetD8Async", fn(u64, u8, usize, Ptr), a, 0, 4, s1),
        OK
    );
    assert_eq!(
        call!(
            cu,
            "cuMemsetD16Async",
            fn(u64, u16, usize, Ptr),
            a,
            0,
            2,
            s1
        ),
        OK
    );
    assert_eq!(
        call!(
            cu,
            "cuMemcpyDtoH",
            fn(*mut c_void, u64, usize),
            back.as_mut_ptr().cast(),
            b,
            bytes
        ),
        OK
    );
    assert_eq!(
        floats(&back),
        hb,
        "the default stream waits for blocking streams"
    );
    assert_eq!(
        call!(
            cu,
            "cuMemcpyDtoH",
            fn(*mut c_void, u64, usize),
            back.as_mut_ptr().cast(),
            c,
            4
        ),
        OK
    );
    assert_eq!(u32::from_le_bytes([back[0], back[1], back[2], back[3]]), 5);

    // Events.
    let (mut e0, mut e1, mut e2): (Ptr, Ptr, Ptr) = (null_mut(), null_mut(), null_mut());
    assert_eq!(
        call!(cu, "cuEventCreate", fn(*mut Ptr, c_uint), &mut e0, 0),
        OK
    );
    assert_eq!(
        call!(cu, "cuEventCreate", fn(*mut Ptr, c_uint), &mut e1, 0),
        OK
    );
    assert_eq!(
        call!(cu, "cuEventCreate", fn(*mut Ptr, c_uint), &mut e2, 2),
        OK
    );
    assert_eq!(call!(cu, "cuEventQuery", fn(Ptr), e0), OK, "never recorded");
    assert_eq!(call!(cu, "cuEventRecord", fn(Ptr, Ptr), e0, s1), OK);
    let mut us = 30_000u64;
    let mut sp: [Ptr; 1] = [(&mut us as *mut u64).cast()];
    assert_eq!(launch!(spin, 1, 1, s1, sp.as_mut_ptr(), null_mut()), OK);
    assert_eq!(call!(cu, "cuEventRecord", fn(Ptr, Ptr), e1, s1), OK);
    assert_eq!(call!(cu, "cuEventRecord", fn(Ptr, Ptr), e2, s1), OK);
    assert_eq!(call!(cu, "cuEventQuery", fn(Ptr), e1), NOT_READY);
    assert_eq!(call!(cu, "cuStreamQuery", fn(Ptr), s1), NOT_READY);
    let mut ms: f32 = 0.0;
    assert_eq!(
        call!(
            cu,
            "cuEventElapsedTime",
            fn(*mut f32, Ptr, Ptr),
            &mut ms,
            e0,
            e1
        ),
        NOT_READY
    );
    assert_eq!(
        call!(cu, "cuStreamWaitEvent", fn(Ptr, Ptr, c_uint), s2, e1, 0),
        OK
    );
    assert_eq!(
        call!(cu, "cuEventQuery", fn(Ptr), e1),
        OK,
        "s2 waited for e1"
    );
    assert_eq!(call!(cu, "cuEventSynchronize", fn(Ptr), e2), OK);
    assert_eq!(
        call!(
            cu,
            "cuEventElapsedTime",
            fn(*mut f32, Ptr, Ptr),
            &mut ms,
            e0,
            e1
        ),
        OK
    );
    assert!(ms >= 25.0, "elapsed {ms} ms around a 30 ms kernel");
    assert_eq!(
        call!(
            cu,
            "cuEventElapsedTime",
            fn(*mut f32, Ptr, Ptr),
            &mut ms,
            e0,
            e2
        ),
        INVALID_HANDLE,
        "timing disabled"
    );
    assert_eq!(call!(cu, "cuStreamQuery", fn(Ptr), s1), OK);
    for e in [e0, e1, e2] {
        assert_eq!(call!(cu, "cuEventDestroy", fn(Ptr), e), OK);
    }
    assert_eq!(call!(cu, "cuEventDestroy", fn(Ptr), e0), INVALID_HANDLE);
    assert_eq!(
        call!(cu, "cuEventRecord", fn(Ptr, Ptr), e0, s1),
        INVALID_HANDLE
    );

    // A thread blocked in cuStreamSynchronize does not block another thread's work on
    // another (non-blocking) stream: that work completes while the kernel still runs.
    let mut long_us = 1_000_000u64;
    let mut lp: [Ptr; 1] = [(&mut long_us as *mut u64).cast()];
    let launched = Instant::now();
    assert_eq!(launch!(spin, 1, 1, s1, lp.as_mut_ptr(), null_mut()), OK);
    let (s1_addr, s2_addr, primary_addr) = (s1 as usize, s2 as usize, primary as usize);
    std::thread::scope(|scope| {
        let cu = &cu;
        let waiter = scope.spawn(move || {
            assert_eq!(
                call!(cu, "cuCtxSetCurrent", fn(Ptr), primary_addr as Ptr),
                OK
            );
            assert_eq!(
                call!(cu, "cuStreamSynchronize", fn(Ptr), s1_addr as Ptr),
                OK
            );
            launched.elapsed()
        });
        std::thread::sleep(Duration::from_millis(50));
        let s2 = s2_addr as Ptr;
        assert_eq!(
            call!(
                cu,
                "cuMemsetD32Async",
                fn(u64, u32, usize, Ptr),
                c,
                9,
                n_el,
                s2
            ),
            OK
        );
        assert_eq!(call!(cu, "cuStreamSynchronize", fn(Ptr), s2), OK);
        let other = launched.elapsed();
        let waited = waiter.join().expect("waiter");
        assert!(
            waited >= Duration::from_millis(950),
            "the waiter returned early: {waited:?}"
        );
        assert!(
            other < Duration::from_millis(700),
            "work on another stream finished {other:?} after the launch: it waited for the kernel"
        );
    });

    // A kernel fault is reported by the next synchronising call, as CUDA reports it.
    let mut idx = 0u64;
    assert_eq!(
        call!(cu, "cuMemAlloc", fn(*mut u64, usize), &mut idx, 16),
        OK
    );
    assert_eq!(
        call!(cu, "cuMemsetD32", fn(u64, u32, usize), idx, 1_000_000, 4),
        OK
    );
    let (mut four, mut src_len) = (4u64, 16u64);
    let mut gp: [Ptr; 5] = [
        (&mut a as *mut u64).cast(),
        (&mut idx as *mut u64).cast(),
        (&mut c as *mut u64).cast(),
        (&mut four as *mut u64).cast(),
        (&mut src_len as *mut u64).cast(),
    ];
    assert_eq!(launch!(gather, 1, 32, s2, gp.as_mut_ptr(), null_mut()), OK);
    assert_eq!(call!(cu, "cuStreamSynchronize", fn(Ptr), s2), LAUNCH_FAILED);
    assert_eq!(call!(cu, "cuStreamSynchronize", fn(Ptr), s2), OK);

    // Modules the sim cannot run, and images that are not modules.
    let ptx = c".version 8.0\n.target sm_90\n.address_size 64\n.visible .entry k(.param .u64 p)\n{\n ret;\n}\n";
    let mut m2: Ptr = null_mut();
    assert_eq!(
        call!(
            cu,
            "cuModuleLoadData",
            fn(*mut Ptr, *const c_void),
            &mut m2,
            ptx.as_ptr().cast()
        ),
        NO_BINARY_FOR_GPU
    );
    assert_eq!(
        call!(
            cu,
            "cuModuleLoadData",
            fn(*mut Ptr, *const c_void),
            &mut m2,
            c"garbage".as_ptr().cast()
        ),
        INVALID_IMAGE
    );
    assert_eq!(
        call!(
            cu,
            "cuModuleLoadData",
            fn(*mut Ptr, *const c_void),
            &mut m2,
            c"\x7fELF\x02\x01\x01".as_ptr().cast()
        ),
        NO_BINARY_FOR_GPU
    );
    assert_eq!(
        call!(
            cu,
            "cuModuleLoad",
            fn(*mut Ptr, *const c_char),
            &mut m2,
            c"/no/such/file.ptx".as_ptr()
        ),
        FILE_NOT_FOUND
    );
    // The sim's built-in module declares `counter` and `table` and no `scale`; a variable
    // is a copy target within its size; either output may be NULL.
    let (mut gaddr, mut gsize) = (0u64, 0usize);
    assert_eq!(
        call!(
            cu,
            "cuModuleGetGlobal",
            fn(*mut u64, *mut usize, Ptr, *const c_char),
            &mut gaddr,
            &mut gsize,
            module,
            c"counter".as_ptr()
        ),
        OK
    );
    assert_eq!(gsize, 8);
    let word = 0x0123_4567_89ab_cdefu64;
    assert_eq!(
        call!(
            cu,
            "cuMemcpyHtoD",
            fn(u64, *const u64, usize),
            gaddr,
            &word,
            8
        ),
        OK
    );
    let mut back = 0u64;
    assert_eq!(
        call!(
            cu,
            "cuMemcpyDtoH",
            fn(*mut u64, u64, usize),
            &mut back,
            gaddr,
            8
        ),
        OK
    );
    assert_eq!(back, word);
    assert_eq!(call!(cu, "cuMemFree", fn(u64), gaddr), INVALID_VALUE);
    assert_eq!(
        call!(
            cu,
            "cuModuleGetGlobal",
            fn(*mut u64, *mut usize, Ptr, *const c_char),
            &mut gaddr,
            &mut gsize,
            module,
            c"scale".as_ptr()
        ),
        NOT_FOUND
    );
    assert_eq!(
        call!(
            cu,
            "cuModuleGetGlobal",
            fn(*mut u64, *mut usize, Ptr, *const c_char),
            null_mut(),
            null_mut(),
            module,
            null_mut()
        ),
        INVALID_VALUE
    );
    assert_eq!(call!(cu, "cuModuleUnload", fn(Ptr), module), OK);
    assert_eq!(call!(cu, "cuModuleUnload", fn(Ptr), module), INVALID_HANDLE);
    assert_eq!(
        launch!(vadd, 1, 32, s1, params.as_mut_ptr(), null_mut()),
        INVALID_HANDLE,
        "function of an unloaded module"
    );

    // Freed pointers.
    assert_eq!(call!(cu, "cuMemFree", fn(u64), a), OK);
    assert_eq!(call!(cu, "cuMemFree", fn(u64), a), INVALID_VALUE);
    assert_eq!(
        call!(
            cu,
            "cuMemcpyHtoD",
            fn(u64, *const c_void, usize),
            a,
            ha.as_ptr().cast(),
            4
        ),
        INVALID_VALUE
    );
    assert_eq!(
        call!(cu, "cuMemsetD8", fn(u64, u8, usize), a, 0, 1),
        INVALID_VALUE
    );

    for s in [s1, s2] {
        assert_eq!(call!(cu, "cuStreamDestroy", fn(Ptr), s), OK);
    }
    assert_eq!(call!(cu, "cuStreamDestroy", fn(Ptr), s1), INVALID_HANDLE);
    assert_eq!(
        call!(cu, "cuStreamSynchronize", fn(Ptr), s1),
        INVALID_HANDLE
    );
    for p in [b, c, idx] {
        assert_eq!(call!(cu, "cuMemFree", fn(u64), p), OK);
    }
    assert_eq!(call!(cu, "cuMemFreeHost", fn(Ptr), pinned), OK);
    assert_eq!(call!(cu, "cuMemFreeHost", fn(Ptr), pinned), INVALID_VALUE);
    assert_eq!(call!(cu, "cuCtxSynchronize", fn()), OK);
    assert_eq!(call!(cu, "cuDevicePrimaryCtxRelease", fn(c_int), dev), OK);
    drop(worker);
}
