//! A kernel launched as a function, function attributes, occupancy, `cuLaunchKernelEx`,
//! cluster occupancy, context limits, and a library's unloading.

use super::*;

pub(crate) fn launches_attributes_occupancy_and_limits(t: &Setup) {
    let Setup {
        ref cu,
        lib,
        lib2,
        vadd,
        func,
        mut module,
    } = *t;
    // A kernel passes to cuLaunchKernel as a function.
    let n = 4096usize;
    let bytes = n * 4;
    let (mut a, mut b, mut c) = (0u64, 0u64, 0u64);
    for p in [&mut a, &mut b, &mut c] {
        assert_eq!(call!(cu, "cuMemAlloc", fn(*mut u64, usize), p, bytes), OK);
    }
    let ha: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let hb: Vec<f32> = (0..n).map(|i| 3.0 * i as f32).collect();
    for (d, h) in [(a, &ha), (b, &hb)] {
        assert_eq!(
            call!(
                cu,
                "cuMemcpyHtoD",
                fn(u64, *const c_void, usize),
                d,
                h.as_ptr().cast(),
                bytes
            ),
            OK
        );
    }
    let mut n64 = n as u64;
    let mut params: [Ptr; 4] = [
        (&mut a as *mut u64).cast(),
        (&mut b as *mut u64).cast(),
        (&mut c as *mut u64).cast(),
        (&mut n64 as *mut u64).cast(),
    ];
    let pp = params.as_mut_ptr();
    let launch = |f: Ptr, shared: c_uint| {
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
            f,
            (n / 256) as c_uint,
            1,
            1,
            256,
            1,
            1,
            shared,
            null_mut(),
            pp,
            null_mut()
        )
    };
    assert_eq!(launch(vadd, 0), OK);
    let read_c = || {
        let mut back = vec![0u8; bytes];
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
        floats(&back)
    };
    assert!(read_c()
        .iter()
        .enumerate()
        .all(|(i, &v)| v == 4.0 * i as f32));

    // Function attributes: what the library knows, what it does not, what may be set.
    let get = |a: c_int, f: Ptr| {
        let mut v: c_int = -7;
        let r = call!(
            cu,
            "cuFuncGetAttribute",
            fn(*mut c_int, c_int, Ptr),
            &mut v,
            a,
            f
        );
        (r, v)
    };
    assert_eq!(get(0, func), (OK, 1024));
    assert_eq!(get(6, func), (OK, 90), "binary version: the device's 9.0");
    assert_eq!(
        get(8, func),
        (OK, 48 << 10),
        "dynamic shared memory without opt-in"
    );
    assert_eq!(get(9, func), (OK, -1));
    // Reported by the device: a sim kernel runs on host threads, with no registers,
    // static shared, constant or local memory.
    for a in 1..=4 {
        assert_eq!(get(a, func), (OK, 0), "attribute {a}");
    }
    assert_eq!(get(99, func).0, INVALID_VALUE);
    assert_eq!(get(0, 0x7777 as Ptr).0, INVALID_HANDLE);
    assert_eq!(
        call!(
            cu,
            "cuFuncGetAttribute",
            fn(*mut c_int, c_int, Ptr),
            null_mut(),
            0,
            func
        ),
        INVALID_VALUE
    );
    let set = |a: c_int, v: c_int, f: Ptr| {
        call!(cu, "cuFuncSetAttribute", fn(Ptr, c_int, c_int), f, a, v)
    };
    // Above 48 KiB of dynamic shared memory: opt in, then launch with it.
    assert_eq!(set(8, 100 << 10, func), OK);
    assert_eq!(get(8, func), (OK, 100 << 10));
    assert_eq!(
        set(8, 300 << 10, func),
        INVALID_VALUE,
        "above the opt-in limit"
    );
    assert_eq!(set(8, -1, func), INVALID_VALUE);
    assert_eq!(set(9, 50, func), OK);
    assert_eq!(set(9, 101, func), INVALID_VALUE);
    assert_eq!(set(0, 512, func), INVALID_VALUE, "read-only");
    assert_eq!(set(11, 2, func), NOT_SUPPORTED, "clusters");
    // Cluster permissions and preferences (cuBLAS sets them): valid values accepted.
    assert_eq!(set(14, 1, func), OK, "non-portable cluster sizes allowed");
    assert_eq!(set(15, 2, func), OK, "a cluster scheduling preference");
    assert_eq!(set(14, 2, func), INVALID_VALUE);
    assert_eq!(set(15, 3, func), INVALID_VALUE);
    assert_eq!(set(8, 1024, 0x7777 as Ptr), INVALID_HANDLE);
    assert_eq!(launch(vadd, 100 << 10), OK);
    assert!(read_c()
        .iter()
        .enumerate()
        .all(|(i, &v)| v == 4.0 * i as f32));
    // The kernel form of the same calls.
    let mut kv: c_int = 0;
    assert_eq!(
        call!(
            cu,
            "cuKernelGetAttribute",
            fn(*mut c_int, c_int, Ptr, c_int),
            &mut kv,
            8,
            vadd,
            0
        ),
        OK
    );
    assert_eq!(kv, 100 << 10);
    assert_eq!(
        call!(
            cu,
            "cuKernelGetAttribute",
            fn(*mut c_int, c_int, Ptr, c_int),
            &mut kv,
            8,
            vadd,
            1
        ),
        INVALID_DEVICE
    );
    assert_eq!(
        call!(
            cu,
            "cuKernelSetAttribute",
            fn(c_int, c_int, Ptr, c_int),
            8,
            4096,
            vadd,
            0
        ),
        OK
    );
    assert_eq!(get(8, func), (OK, 4096));
    assert_eq!(
        call!(cu, "cuFuncSetCacheConfig", fn(Ptr, c_int), func, 1),
        OK
    );
    assert_eq!(
        call!(cu, "cuFuncSetCacheConfig", fn(Ptr, c_int), func, 9),
        INVALID_VALUE
    );
    assert_eq!(
        call!(cu, "cuFuncSetCacheConfig", fn(Ptr, c_int), 0x7777 as Ptr, 1),
        INVALID_HANDLE
    );

    // Occupancy, from the device's limits.
    let dattr = |a: c_int| {
        let mut v: c_int = 0;
        assert_eq!(
            call!(
                cu,
                "cuDeviceGetAttribute",
                fn(*mut c_int, c_int, c_int),
                &mut v,
                a,
                0
            ),
            OK
        );
        v
    };
    let (threads_sm, blocks_sm, smem_sm, sms) = (dattr(39), dattr(106), dattr(81), dattr(16));
    let mut blocks: c_int = 0;
    let occ = |blocks: &mut c_int, block: c_int, smem: usize| {
        call!(
            cu,
            "cuOccupancyMaxActiveBlocksPerMultiprocessor",
            fn(*mut c_int, Ptr, c_int, usize),
            blocks,
            func,
            block,
            smem
        )
    };
    assert_eq!(occ(&mut blocks, 256, 0), OK);
    assert_eq!(blocks, (threads_sm / 256).min(blocks_sm));
    assert_eq!(occ(&mut blocks, 64, 64 << 10), OK);
    assert_eq!(
        blocks,
        (smem_sm / ((64 << 10) + 1024))
            .min(threads_sm / 64)
            .min(blocks_sm)
    );
    assert_eq!(occ(&mut blocks, 0, 0), INVALID_VALUE);
    assert_eq!(occ(&mut blocks, 2048, 0), OK);
    assert_eq!(blocks, 0, "more threads than a block may have");
    assert_eq!(
        call!(
            cu,
            "cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags",
            fn(*mut c_int, Ptr, c_int, usize, c_uint),
            &mut blocks,
            func,
            128,
            0,
            8
        ),
        INVALID_VALUE,
        "an unknown flag"
    );
    let (mut min_grid, mut block) = (0 as c_int, 0 as c_int);
    assert_eq!(
        call!(
            cu,
            "cuOccupancyMaxPotentialBlockSize",
            fn(
                *mut c_int,
                *mut c_int,
                Ptr,
                Option<unsafe extern "C" fn(c_int) -> usize>,
                usize,
                c_int,
            ),
            &mut min_grid,
            &mut block,
            func,
            None,
            0,
            0
        ),
        OK
    );
    assert_eq!(block, 1024);
    assert_eq!(min_grid, (threads_sm / 1024).min(blocks_sm) * sms);
    unsafe extern "C" fn smem_of(block: c_int) -> usize {
        // 96 KiB per block of more than 256 threads, none below.
        if block > 256 {
            96 << 10
        } else {
            0
        }
    }
    assert_eq!(
        call!(
            cu,
            "cuOccupancyMaxPotentialBlockSizeWithFlags",
            fn(
                *mut c_int,
                *mut c_int,
                Ptr,
                Option<unsafe extern "C" fn(c_int) -> usize>,
                usize,
                c_int,
                c_uint,
            ),
            &mut min_grid,
            &mut block,
            func,
            Some(smem_of),
            0,
            512,
            0
        ),
        OK
    );
    assert!(block <= 512 && block % 32 == 0, "block {block}");
    let mut smem: usize = 0;
    assert_eq!(
        call!(
            cu,
            "cuOccupancyAvailableDynamicSMemPerBlock",
            fn(*mut usize, Ptr, c_int, c_int),
            &mut smem,
            func,
            2,
            128
        ),
        OK
    );
    assert_eq!(smem, (smem_sm as usize / 2 - 1024).min(dattr(97) as usize));
    assert_eq!(
        call!(
            cu,
            "cuOccupancyAvailableDynamicSMemPerBlock",
            fn(*mut usize, Ptr, c_int, c_int),
            null_mut(),
            func,
            2,
            128
        ),
        INVALID_VALUE
    );

    // cuLaunchKernelEx: attributes the launch satisfies, and those it refuses.
    let mut s: Ptr = null_mut();
    assert_eq!(
        call!(cu, "cuStreamCreate", fn(*mut Ptr, c_uint), &mut s, 0),
        OK
    );
    assert_eq!(
        call!(cu, "cuMemsetD32", fn(u64, c_uint, usize), c, 0, n),
        OK
    );
    let launch_ex = |attrs: &[LaunchAttribute]| {
        let cfg = LaunchConfig {
            grid: [(n / 128) as c_uint, 1, 1],
            block: [128, 1, 1],
            shared: 0,
            stream: s,
            attrs: attrs.as_ptr(),
            num_attrs: attrs.len() as c_uint,
        };
        call!(
            cu,
            "cuLaunchKernelEx",
            fn(*const LaunchConfig, Ptr, *mut Ptr, *mut Ptr),
            &cfg,
            func,
            pp,
            null_mut()
        )
    };
    assert_eq!(
        launch_ex(&[attr(8, &[1]), attr(4, &[1, 1, 1]), attr(6, &[1])]),
        OK
    );
    assert_eq!(call!(cu, "cuStreamSynchronize", fn(Ptr), s), OK);
    assert!(read_c()
        .iter()
        .enumerate()
        .all(|(i, &v)| v == 4.0 * i as f32));
    assert_eq!(launch_ex(&[attr(2, &[1])]), NOT_SUPPORTED, "cooperative");
    assert_eq!(
        launch_ex(&[attr(4, &[2, 1, 1])]),
        NOT_SUPPORTED,
        "a cluster"
    );
    assert_eq!(
        launch_ex(&[attr(12, &[])]),
        NOT_SUPPORTED,
        "a completion event"
    );
    assert_eq!(launch_ex(&[attr(77, &[])]), INVALID_VALUE);

    // Cluster occupancy (cuBLAS asks at cublasCreate): clusters of one block fit as the
    // blocks do, larger clusters do not launch on a vGPU (none), the largest size is 1.
    let clusters = |attrs: &[LaunchAttribute]| {
        let cfg = LaunchConfig {
            grid: [64, 1, 1],
            block: [128, 1, 1],
            shared: 0,
            stream: s,
            attrs: attrs.as_ptr(),
            num_attrs: attrs.len() as c_uint,
        };
        let mut num: c_int = -1;
        let r = call!(
            cu,
            "cuOccupancyMaxActiveClusters",
            fn(*mut c_int, Ptr, *const LaunchConfig),
            &mut num,
            func,
            &cfg
        );
        (r, num)
    };
    let per_sm = cu.blocks_per_sm(func, 128, 0);
    let sms = cu.device_attribute(16);
    assert!(per_sm > 0);
    // A sim vGPU runs no clusters, and says so.
    let mut cluster_launch: c_int = -1;
    assert_eq!(
        call!(
            cu,
            "cuDeviceGetAttribute",
            fn(*mut c_int, c_int, c_int),
            &mut cluster_launch,
            120,
            0
        ),
        OK
    );
    assert_eq!(cluster_launch, 0);
    assert_eq!(clusters(&[]), (OK, per_sm * sms));
    assert_eq!(clusters(&[attr(4, &[1, 1, 1])]), (OK, per_sm * sms));
    assert_eq!(clusters(&[attr(4, &[2, 1, 1])]), (OK, 0));
    assert_eq!(clusters(&[attr(4, &[0, 1, 1])]).0, INVALID_VALUE);
    let mut size: c_int = 0;
    assert_eq!(
        call!(
            cu,
            "cuOccupancyMaxPotentialClusterSize",
            fn(*mut c_int, Ptr, *const LaunchConfig),
            &mut size,
            func,
            std::ptr::null()
        ),
        INVALID_VALUE
    );
    assert_eq!(
        call!(
            cu,
            "cuLaunchKernelEx",
            fn(*const LaunchConfig, Ptr, *mut Ptr, *mut Ptr),
            std::ptr::null(),
            func,
            pp,
            null_mut()
        ),
        INVALID_VALUE
    );
    assert_eq!(
        call!(
            cu,
            "cuLaunchCooperativeKernel",
            fn(Ptr, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, Ptr, *mut Ptr),
            func,
            1,
            1,
            1,
            32,
            1,
            1,
            0,
            s,
            pp
        ),
        NOT_SUPPORTED
    );

    // Limits: the sim device has no stack, heap or FIFO limits.
    let mut v: usize = 7;
    assert_eq!(
        call!(cu, "cuCtxGetLimit", fn(*mut usize, c_int), &mut v, 0),
        UNSUPPORTED_LIMIT
    );
    assert_eq!(
        call!(cu, "cuCtxGetLimit", fn(*mut usize, c_int), &mut v, 6),
        OK
    );
    assert_eq!(v, 0, "no persisting L2 cache");
    // The shared memory a kernel may use, as cuBLASLt asks it: the opt-in maximum.
    assert_eq!(
        call!(cu, "cuCtxGetLimit", fn(*mut usize, c_int), &mut v, 7),
        OK
    );
    assert_eq!(v, 227 << 10);
    assert_eq!(call!(cu, "cuCtxSetLimit", fn(c_int, usize), 6, 0), OK);
    assert_eq!(
        call!(cu, "cuCtxSetLimit", fn(c_int, usize), 6, 1 << 20),
        UNSUPPORTED_LIMIT
    );
    assert_eq!(
        call!(cu, "cuCtxSetLimit", fn(c_int, usize), 2, 1 << 30),
        UNSUPPORTED_LIMIT
    );
    assert_eq!(
        call!(cu, "cuCtxGetLimit", fn(*mut usize, c_int), &mut v, 99),
        INVALID_VALUE
    );
    assert_eq!(
        call!(cu, "cuCtxGetLimit", fn(*mut usize, c_int), null_mut(), 0),
        INVALID_VALUE
    );

    // Unloading a library unloads its module: its kernels are gone.
    assert_eq!(call!(cu, "cuLibraryUnload", fn(Ptr), lib), OK);
    assert_eq!(call!(cu, "cuLibraryUnload", fn(Ptr), lib), INVALID_HANDLE);
    assert_eq!(launch(vadd, 0), INVALID_HANDLE);
    assert_eq!(
        call!(
            cu,
            "cuLibraryGetModule",
            fn(*mut Ptr, Ptr),
            &mut module,
            lib
        ),
        INVALID_HANDLE
    );
    assert_eq!(call!(cu, "cuLibraryUnload", fn(Ptr), lib2), OK);
}
