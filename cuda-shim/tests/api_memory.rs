//! The library through its C ABI, loaded with `dlopen` against a sim `vgpu-worker`:
//! errors, the device, contexts, memory, copies, memsets, host memory. One test per file:
//! the library is one per process, as libcuda is.

mod common;

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::ptr::null_mut;

use common::cuda::*;

#[test]
fn devices_contexts_memory_and_copies() {
    let (worker, cu) = common::cuda::start("api-memory");

    // Errors and names, before and without initialisation.
    let mut s: *const c_char = std::ptr::null();
    assert_eq!(
        call!(cu, "cuGetErrorName", fn(R, *mut *const c_char), 1, &mut s),
        OK
    );
    // SAFETY: the library returned a static C string.
    let text = unsafe { CStr::from_ptr(s) };
    assert_eq!(text.to_str().unwrap(), "CUDA_ERROR_INVALID_VALUE");
    assert_eq!(
        call!(
            cu,
            "cuGetErrorString",
            fn(R, *mut *const c_char),
            700,
            &mut s
        ),
        OK
    );
    assert_eq!(
        call!(
            cu,
            "cuGetErrorName",
            fn(R, *mut *const c_char),
            12345,
            &mut s
        ),
        INVALID_VALUE
    );
    let mut n: c_int = 0;
    assert_eq!(
        call!(cu, "cuDeviceGetCount", fn(*mut c_int), &mut n),
        NOT_INITIALIZED
    );
    assert_eq!(call!(cu, "cuInit", fn(c_uint), 1), INVALID_VALUE);
    assert_eq!(call!(cu, "cuInit", fn(c_uint), 0), OK);
    assert_eq!(call!(cu, "cuDriverGetVersion", fn(*mut c_int), &mut n), OK);
    assert_eq!(n, 13000);
    // Unknown entry points: CUDA_SUCCESS with the status SYMBOL_NOT_FOUND, as the driver
    // answers cuGetProcAddress_v2; common unsupported ones: NOT_SUPPORTED.
    let mut p: Ptr = null_mut();
    let mut status = 0;
    // SAFETY: valid arguments.
    let r = unsafe { (cu.get_proc)(c"cuNoSuchThing".as_ptr(), &mut p, 13000, 0, &mut status) };
    assert_eq!((r, status, p.is_null()), (OK, 1, true));
    // Without a status to report it in, the error.
    // SAFETY: valid arguments; a NULL status is allowed.
    let r = unsafe { (cu.get_proc)(c"cuNoSuchThing".as_ptr(), &mut p, 13000, 0, null_mut()) };
    assert_eq!((r, p.is_null()), (NOT_FOUND, true));
    assert_eq!(
        call!(
            cu,
            "cuMemAllocManaged",
            fn(*mut u64, usize, c_uint),
            &mut 0,
            16,
            1
        ),
        NOT_SUPPORTED
    );

    // The device.
    assert_eq!(call!(cu, "cuDeviceGetCount", fn(*mut c_int), &mut n), OK);
    assert_eq!(n, 1);
    let mut dev: c_int = -1;
    assert_eq!(
        call!(cu, "cuDeviceGet", fn(*mut c_int, c_int), &mut dev, 1),
        INVALID_DEVICE
    );
    assert_eq!(
        call!(cu, "cuDeviceGet", fn(*mut c_int, c_int), &mut dev, 0),
        OK
    );
    let mut name = [0 as c_char; 64];
    assert_eq!(
        call!(
            cu,
            "cuDeviceGetName",
            fn(*mut c_char, c_int, c_int),
            name.as_mut_ptr(),
            64,
            dev
        ),
        OK
    );
    // SAFETY: NUL-terminated by the library.
    assert!(unsafe { CStr::from_ptr(name.as_ptr()) }
        .to_str()
        .unwrap()
        .starts_with("vGPU"));
    let mut total: usize = 0;
    assert_eq!(
        call!(
            cu,
            "cuDeviceTotalMem",
            fn(*mut usize, c_int),
            &mut total,
            dev
        ),
        OK
    );
    assert_eq!(total, 256 << 20);
    let attr = |a: c_int| {
        let mut v: c_int = -1;
        let r = call!(
            cu,
            "cuDeviceGetAttribute",
            fn(*mut c_int, c_int, c_int),
            &mut v,
            a,
            0
        );
        (r, v)
    };
    assert_eq!(attr(10), (OK, 32)); // WARP_SIZE
    assert_eq!(attr(75), (OK, 9)); // COMPUTE_CAPABILITY_MAJOR
    assert_eq!(attr(1), (OK, 1024)); // MAX_THREADS_PER_BLOCK
    assert!(attr(16).1 >= 1); // MULTIPROCESSOR_COUNT
    assert_eq!(attr(9999).0, INVALID_VALUE);
    let mut uuid = [0u8; 16];
    assert_eq!(
        call!(
            cu,
            "cuDeviceGetUuid",
            fn(*mut u8, c_int),
            uuid.as_mut_ptr(),
            dev
        ),
        OK
    );
    assert_eq!(&uuid[..4], b"vGPU");

    // Contexts.
    let mut d: u64 = 0;
    assert_eq!(
        call!(cu, "cuMemAlloc", fn(*mut u64, usize), &mut d, 16),
        INVALID_CONTEXT
    );
    let primary = cu.primary_context(dev);
    let mut cur: Ptr = null_mut();
    assert_eq!(call!(cu, "cuCtxGetCurrent", fn(*mut Ptr), &mut cur), OK);
    assert_eq!(cur, primary);
    let mut ctx: Ptr = null_mut();
    assert_eq!(
        call!(
            cu,
            "cuCtxCreate",
            fn(*mut Ptr, Ptr, c_uint, c_int),
            &mut ctx,
            null_mut(),
            0,
            dev
        ),
        OK
    );
    assert_eq!(call!(cu, "cuCtxGetCurrent", fn(*mut Ptr), &mut cur), OK);
    assert_eq!(cur, ctx);
    let mut scratch: u64 = 0;
    assert_eq!(
        call!(cu, "cuMemAlloc", fn(*mut u64, usize), &mut scratch, 4096),
        OK
    );
    assert_eq!(call!(cu, "cuCtxPopCurrent", fn(*mut Ptr), &mut cur), OK);
    assert_eq!(cur, ctx);
    assert_eq!(call!(cu, "cuCtxPushCurrent", fn(Ptr), ctx), OK);
    assert_eq!(call!(cu, "cuCtxSynchronize", fn()), OK);
    assert_eq!(call!(cu, "cuCtxDestroy", fn(Ptr), ctx), OK);
    assert_eq!(call!(cu, "cuCtxDestroy", fn(Ptr), ctx), INVALID_CONTEXT);
    assert_eq!(call!(cu, "cuCtxDestroy", fn(Ptr), primary), INVALID_CONTEXT);
    assert_eq!(
        call!(cu, "cuCtxPushCurrent", fn(Ptr), 0xdead0 as Ptr),
        INVALID_CONTEXT
    );
    assert_eq!(call!(cu, "cuCtxGetCurrent", fn(*mut Ptr), &mut cur), OK);
    assert_eq!(cur, primary, "destroying a context takes it off the stack");
    // The destroyed context's allocation went with it.
    assert_eq!(call!(cu, "cuMemFree", fn(u64), scratch), INVALID_VALUE);

    // Memory and synchronous copies (pageable host memory bounces).
    let n_el = 1usize << 16;
    let bytes = n_el * 4;
    let (mut a, mut b, mut c) = (0u64, 0u64, 0u64);
    for p in [&mut a, &mut b, &mut c] {
        assert_eq!(call!(cu, "cuMemAlloc", fn(*mut u64, usize), p, bytes), OK);
    }
    assert_eq!(
        call!(cu, "cuMemAlloc", fn(*mut u64, usize), &mut d, 0),
        INVALID_VALUE
    );
    assert_eq!(
        call!(cu, "cuMemAlloc", fn(*mut u64, usize), null_mut(), 16),
        INVALID_VALUE
    );
    let (mut free, mut tot) = (0usize, 0usize);
    assert_eq!(
        call!(
            cu,
            "cuMemGetInfo",
            fn(*mut usize, *mut usize),
            &mut free,
            &mut tot
        ),
        OK
    );
    assert_eq!(tot, 256 << 20);
    assert!(free <= tot - 3 * bytes);
    let ha: Vec<f32> = (0..n_el).map(|i| i as f32).collect();
    let hb: Vec<f32> = (0..n_el).map(|i| 2.0 * i as f32).collect();
    assert_eq!(
        call!(
            cu,
            "cuMemcpyHtoD",
            fn(u64, *const c_void, usize),
            a,
            ha.as_ptr().cast(),
            bytes
        ),
        OK
    );
    assert_eq!(
        call!(
            cu,
            "cuMemcpyHtoD",
            fn(u64, *const c_void, usize),
            b,
            hb.as_ptr().cast(),
            bytes
        ),
        OK
    );
    let mut back = vec![0u8; bytes];
    assert_eq!(
        call!(
            cu,
            "cuMemcpyDtoH",
            fn(*mut c_void, u64, usize),
            back.as_mut_ptr().cast(),
            a,
            bytes
        ),
        OK
    );
    assert_eq!(floats(&back), ha);
    // Out of bounds, NULL host pointers.
    assert_eq!(
        call!(
            cu,
            "cuMemcpyHtoD",
            fn(u64, *const c_void, usize),
            a + 8,
            ha.as_ptr().cast(),
            bytes
        ),
        INVALID_VALUE
    );
    assert_eq!(
        call!(
            cu,
            "cuMemcpyHtoD",
            fn(u64, *const c_void, usize),
            a,
            std::ptr::null(),
            4
        ),
        INVALID_VALUE
    );

    // A copy larger than the staging buffer, there and back.
    let big_len = (6 << 20) + 12;
    let mut big_dev = 0u64;
    assert_eq!(
        call!(cu, "cuMemAlloc", fn(*mut u64, usize), &mut big_dev, big_len),
        OK
    );
    let big: Vec<u8> = (0..big_len).map(|i| (i * 7 % 251) as u8).collect();
    assert_eq!(
        call!(
            cu,
            "cuMemcpyHtoD",
            fn(u64, *const c_void, usize),
            big_dev,
            big.as_ptr().cast(),
            big_len
        ),
        OK
    );
    let mut big_back = vec![0u8; big_len];
    assert_eq!(
        call!(
            cu,
            "cuMemcpyDtoH",
            fn(*mut c_void, u64, usize),
            big_back.as_mut_ptr().cast(),
            big_dev,
            big_len
        ),
        OK
    );
    assert!(big == big_back);
    assert_eq!(call!(cu, "cuMemFree", fn(u64), big_dev), OK);

    // Memsets.
    assert_eq!(
        call!(cu, "cuMemsetD8", fn(u64, u8, usize), c, 0xab, bytes),
        OK
    );
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
    assert!(back.iter().all(|&x| x == 0xab));
    assert_eq!(
        call!(cu, "cuMemsetD16", fn(u64, u16, usize), c, 0x1234, n_el * 2),
        OK
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
    assert_eq!(&back[..4], &[0x34, 0x12, 0x34, 0x12]);
    assert_eq!(
        call!(cu, "cuMemsetD32", fn(u64, u32, usize), c, 0xdead_beef, n_el),
        OK
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
    assert_eq!(
        u32::from_le_bytes([back[0], back[1], back[2], back[3]]),
        0xdead_beef
    );
    assert_eq!(
        call!(cu, "cuMemsetD16", fn(u64, u16, usize), c + 1, 1, 4),
        INVALID_VALUE
    );
    assert_eq!(
        call!(cu, "cuMemsetD32", fn(u64, u32, usize), c, 1, n_el + 1),
        INVALID_VALUE
    );
    // Device to device.
    assert_eq!(
        call!(cu, "cuMemcpyDtoD", fn(u64, u64, usize), c, a, bytes),
        OK
    );
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

    // Pinned host memory from the DMA pool: zero-copy, and pointer attributes.
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
    let mut mt: c_uint = 0;
    assert_eq!(
        call!(
            cu,
            "cuPointerGetAttribute",
            fn(*mut c_void, c_int, u64),
            (&mut mt as *mut c_uint).cast(),
            2,
            pinned as u64
        ),
        OK
    );
    assert_eq!(mt, 1, "host memory");
    assert_eq!(
        call!(
            cu,
            "cuPointerGetAttribute",
            fn(*mut c_void, c_int, u64),
            (&mut mt as *mut c_uint).cast(),
            2,
            a + 100
        ),
        OK
    );
    assert_eq!(mt, 2, "device memory");
    let mut start = 0u64;
    assert_eq!(
        call!(
            cu,
            "cuPointerGetAttribute",
            fn(*mut c_void, c_int, u64),
            (&mut start as *mut u64).cast(),
            11,
            a + 100
        ),
        OK
    );
    assert_eq!(start, a);
    assert_eq!(
        call!(
            cu,
            "cuPointerGetAttribute",
            fn(*mut c_void, c_int, u64),
            (&mut mt as *mut c_uint).cast(),
            2,
            0x10
        ),
        INVALID_VALUE
    );
    assert_eq!(
        call!(
            cu,
            "cuMemHostGetDevicePointer",
            fn(*mut u64, Ptr, c_uint),
            &mut d,
            pinned,
            0
        ),
        OK
    );
    assert_eq!(
        d, pinned as u64,
        "pinned memory: the GPU reaches it at its address"
    );

    // Registered (pageable) memory.
    let mut reg = vec![0u8; 8192];
    let regp: Ptr = reg.as_mut_ptr().cast();
    assert_eq!(
        call!(
            cu,
            "cuMemHostRegister",
            fn(Ptr, usize, c_uint),
            regp,
            8192,
            0
        ),
        OK
    );
    assert_eq!(
        call!(cu, "cuMemHostRegister", fn(Ptr, usize, c_uint), regp, 16, 0),
        HOST_MEMORY_ALREADY_REGISTERED
    );
    let mut kind: c_uint = 0;
    let attr_out: *mut c_void = (&mut kind as *mut c_uint).cast();
    let inner = regp as u64 + 100;
    assert_eq!(
        call!(
            cu,
            "cuPointerGetAttribute",
            fn(*mut c_void, c_int, u64),
            attr_out,
            2,
            inner
        ),
        OK
    );
    assert_eq!(kind, 1, "registered memory is host memory");
    assert_eq!(
        call!(
            cu,
            "cuMemcpyDtoH",
            fn(*mut c_void, u64, usize),
            regp,
            a,
            8192
        ),
        OK
    );
    assert_eq!(floats(&reg[..16]), [0.0, 1.0, 2.0, 3.0]);
    assert_eq!(call!(cu, "cuMemHostUnregister", fn(Ptr), regp), OK);
    assert_eq!(
        call!(cu, "cuMemHostUnregister", fn(Ptr), regp),
        HOST_MEMORY_NOT_REGISTERED
    );

    for p in [a, b, c] {
        assert_eq!(call!(cu, "cuMemFree", fn(u64), p), OK);
    }
    assert_eq!(call!(cu, "cuMemFreeHost", fn(Ptr), pinned), OK);
    assert_eq!(call!(cu, "cuMemFreeHost", fn(Ptr), pinned), INVALID_VALUE);
    assert_eq!(call!(cu, "cuCtxSynchronize", fn()), OK);
    assert_eq!(call!(cu, "cuDevicePrimaryCtxRelease", fn(c_int), dev), OK);
    drop(worker);
}
