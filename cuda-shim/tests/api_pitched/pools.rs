//! Stream-ordered allocation from the default pool, pool attributes and access, an
//! explicit pool with a size limit, and pointer attributes.

use super::*;

pub(crate) fn stream_ordered_allocation_pools_and_pointer_attributes(t: &Setup) {
    let Setup {
        ref cu,
        h,
        dp,
        pitch,
        s,
        ..
    } = *t;
    // Stream-ordered allocation: from the default pool, freed in stream order.
    let mut attr: c_int = 0;
    assert_eq!(
        call!(
            cu,
            "cuDeviceGetAttribute",
            fn(*mut c_int, c_int, c_int),
            &mut attr,
            115,
            0
        ),
        OK
    );
    assert_eq!(attr, 1, "memory pools supported");
    let mut pa = 0u64;
    let alloc_async = |p: &mut u64, n: usize, s: Ptr| {
        call!(cu, "cuMemAllocAsync", fn(*mut u64, usize, Ptr), p, n, s)
    };
    assert_eq!(alloc_async(&mut pa, 1 << 20, s), OK);
    assert_eq!(
        call!(
            cu,
            "cuMemsetD32Async",
            fn(u64, c_uint, usize, Ptr),
            pa,
            7,
            1 << 18,
            s
        ),
        OK
    );
    let mut word = [0u32; 4];
    assert_eq!(
        call!(
            cu,
            "cuMemcpyDtoHAsync",
            fn(*mut c_void, u64, usize, Ptr),
            word.as_mut_ptr().cast(),
            pa + 4096,
            16,
            s
        ),
        OK
    );
    assert_eq!(call!(cu, "cuStreamSynchronize", fn(Ptr), s), OK);
    assert_eq!(word, [7; 4]);
    let mut pool: Ptr = null_mut();
    assert_eq!(
        call!(
            cu,
            "cuDeviceGetDefaultMemPool",
            fn(*mut Ptr, c_int),
            &mut pool,
            0
        ),
        OK
    );
    let mut cur: Ptr = null_mut();
    assert_eq!(
        call!(cu, "cuDeviceGetMemPool", fn(*mut Ptr, c_int), &mut cur, 0),
        OK
    );
    assert_eq!(cur, pool);
    assert_eq!(
        call!(
            cu,
            "cuDeviceGetDefaultMemPool",
            fn(*mut Ptr, c_int),
            &mut pool,
            1
        ),
        INVALID_DEVICE
    );
    let pool_u64 = |pool: Ptr, a: c_int| {
        let mut v = u64::MAX;
        let r = call!(
            cu,
            "cuMemPoolGetAttribute",
            fn(Ptr, c_int, *mut c_void),
            pool,
            a,
            (&mut v as *mut u64).cast()
        );
        (r, v)
    };
    assert_eq!(pool_u64(pool, 7), (OK, 1 << 20), "used now");
    assert_eq!(
        pool_u64(pool, 5),
        (OK, 1 << 20),
        "reserved: the same, nothing is cached"
    );
    assert_eq!(call!(cu, "cuMemFreeAsync", fn(u64, Ptr), pa, s), OK);
    assert_eq!(call!(cu, "cuStreamSynchronize", fn(Ptr), s), OK);
    assert_eq!(pool_u64(pool, 7), (OK, 0));
    assert_eq!(
        pool_u64(pool, 8),
        (OK, 1 << 20),
        "the high-water mark stays"
    );
    let mut zero = 0u64;
    assert_eq!(
        call!(
            cu,
            "cuMemPoolSetAttribute",
            fn(Ptr, c_int, *mut c_void),
            pool,
            8,
            (&mut zero as *mut u64).cast()
        ),
        OK
    );
    assert_eq!(pool_u64(pool, 8), (OK, 0));
    let mut one = 1u64;
    assert_eq!(
        call!(
            cu,
            "cuMemPoolSetAttribute",
            fn(Ptr, c_int, *mut c_void),
            pool,
            8,
            (&mut one as *mut u64).cast()
        ),
        INVALID_VALUE,
        "a high-water mark resets only to 0"
    );
    assert_eq!(
        call!(cu, "cuMemFreeAsync", fn(u64, Ptr), pa, s),
        INVALID_VALUE,
        "freed twice"
    );
    assert_eq!(
        call!(cu, "cuMemFreeAsync", fn(u64, Ptr), dp + 8, s),
        INVALID_VALUE,
        "inside an allocation"
    );
    assert_eq!(alloc_async(&mut pa, 0, s), INVALID_VALUE);
    assert_eq!(
        alloc_async(&mut pa, 1 << 30, s),
        OUT_OF_MEMORY,
        "past the share"
    );
    assert_eq!(alloc_async(&mut pa, 64, 0x7777 as Ptr), INVALID_HANDLE);
    assert_eq!(
        call!(cu, "cuMemPoolDestroy", fn(Ptr), pool),
        INVALID_VALUE,
        "the default pool"
    );
    assert_eq!(call!(cu, "cuMemPoolTrimTo", fn(Ptr, usize), pool, 0), OK);

    // Pool attributes and access: what may be set, and bad input.
    let mut reuse: c_int = 0;
    assert_eq!(
        call!(
            cu,
            "cuMemPoolSetAttribute",
            fn(Ptr, c_int, *mut c_void),
            pool,
            1,
            (&mut reuse as *mut c_int).cast()
        ),
        OK
    );
    let mut threshold = 64u64 << 20;
    assert_eq!(
        call!(
            cu,
            "cuMemPoolSetAttribute",
            fn(Ptr, c_int, *mut c_void),
            pool,
            4,
            (&mut threshold as *mut u64).cast()
        ),
        OK
    );
    assert_eq!(
        pool_u64(pool, 4),
        (OK, 64 << 20),
        "the release threshold, as set"
    );
    assert_eq!(pool_u64(pool, 99).0, INVALID_VALUE);
    assert_eq!(
        call!(
            cu,
            "cuMemPoolSetAttribute",
            fn(Ptr, c_int, *mut c_void),
            pool,
            7,
            (&mut threshold as *mut u64).cast()
        ),
        INVALID_VALUE,
        "used memory is read-only"
    );
    assert_eq!(
        call!(
            cu,
            "cuMemPoolGetAttribute",
            fn(Ptr, c_int, *mut c_void),
            pool,
            7,
            null_mut()
        ),
        INVALID_VALUE
    );
    assert_eq!(
        pool_u64(0x7777 as Ptr, 7).0,
        INVALID_VALUE,
        "a foreign pool"
    );
    assert_eq!(
        call!(cu, "cuMemPoolTrimTo", fn(Ptr, usize), 0x7777 as Ptr, 0),
        INVALID_VALUE
    );
    // CUmemAccessDesc: location (device 0), flags (read-write).
    let rw: [c_int; 3] = [1, 0, 3];
    assert_eq!(
        call!(
            cu,
            "cuMemPoolSetAccess",
            fn(Ptr, *const c_int, usize),
            pool,
            rw.as_ptr(),
            1
        ),
        OK
    );
    let ro: [c_int; 3] = [1, 0, 1];
    assert_eq!(
        call!(
            cu,
            "cuMemPoolSetAccess",
            fn(Ptr, *const c_int, usize),
            pool,
            ro.as_ptr(),
            1
        ),
        INVALID_VALUE,
        "the device always reads and writes its pools"
    );
    let other: [c_int; 3] = [1, 5, 3];
    assert_eq!(
        call!(
            cu,
            "cuMemPoolSetAccess",
            fn(Ptr, *const c_int, usize),
            pool,
            other.as_ptr(),
            1
        ),
        INVALID_DEVICE
    );
    assert_eq!(
        call!(
            cu,
            "cuMemPoolSetAccess",
            fn(Ptr, *const c_int, usize),
            pool,
            std::ptr::null(),
            1
        ),
        INVALID_VALUE
    );
    let mut flags: c_int = 0;
    let loc: [c_int; 2] = [1, 0];
    assert_eq!(
        call!(
            cu,
            "cuMemPoolGetAccess",
            fn(*mut c_int, Ptr, *const c_int),
            &mut flags,
            pool,
            loc.as_ptr()
        ),
        OK
    );
    assert_eq!(flags, 3);
    assert_eq!(
        call!(
            cu,
            "cuMemPoolGetAccess",
            fn(*mut c_int, Ptr, *const c_int),
            &mut flags,
            0x7777 as Ptr,
            loc.as_ptr()
        ),
        INVALID_VALUE
    );
    assert_eq!(
        call!(cu, "cuDeviceGetMemPool", fn(*mut Ptr, c_int), null_mut(), 0),
        INVALID_VALUE
    );

    // An explicit pool with a size limit.
    let props = PoolProps {
        alloc_type: 1,
        handle_types: 0,
        location: [1, 0],
        win32: null_mut(),
        max_size: 2 << 20,
        usage: 0,
        reserved: [0; 54],
    };
    let mut mine: Ptr = null_mut();
    assert_eq!(
        call!(
            cu,
            "cuMemPoolCreate",
            fn(*mut Ptr, *const PoolProps),
            &mut mine,
            &props
        ),
        OK
    );
    let from = |p: &mut u64, n: usize, pool: Ptr| {
        call!(
            cu,
            "cuMemAllocFromPoolAsync",
            fn(*mut u64, usize, Ptr, Ptr),
            p,
            n,
            pool,
            s
        )
    };
    let (mut p1, mut p2) = (0u64, 0u64);
    assert_eq!(from(&mut p1, 1 << 20, mine), OK);
    assert_eq!(
        from(&mut p2, 2 << 20, mine),
        OUT_OF_MEMORY,
        "past the pool's maxSize"
    );
    assert_eq!(
        from(&mut p2, 64, 0x7777 as Ptr),
        INVALID_VALUE,
        "a foreign pool"
    );
    assert_eq!(pool_u64(mine, 7), (OK, 1 << 20));
    assert_eq!(call!(cu, "cuDeviceSetMemPool", fn(c_int, Ptr), 0, mine), OK);
    assert_eq!(alloc_async(&mut p2, 4096, s), OK);
    assert_eq!(pool_u64(mine, 7), (OK, (1 << 20) + 4096));
    assert_eq!(
        call!(cu, "cuMemFree", fn(u64), p2),
        OK,
        "a synchronous free of a pool's memory"
    );
    assert_eq!(pool_u64(mine, 7), (OK, 1 << 20));
    assert_eq!(
        call!(cu, "cuDeviceSetMemPool", fn(c_int, Ptr), 0, 0x7777 as Ptr),
        INVALID_VALUE
    );
    let mut bad = props;
    bad.handle_types = 1;
    assert_eq!(
        call!(
            cu,
            "cuMemPoolCreate",
            fn(*mut Ptr, *const PoolProps),
            &mut mine,
            &bad
        ),
        NOT_SUPPORTED,
        "IPC handles"
    );
    bad = props;
    bad.location = [1, 3];
    assert_eq!(
        call!(
            cu,
            "cuMemPoolCreate",
            fn(*mut Ptr, *const PoolProps),
            &mut mine,
            &bad
        ),
        INVALID_DEVICE
    );
    assert_eq!(
        call!(
            cu,
            "cuMemPoolCreate",
            fn(*mut Ptr, *const PoolProps),
            &mut mine,
            std::ptr::null()
        ),
        INVALID_VALUE
    );
    assert_eq!(call!(cu, "cuMemFreeAsync", fn(u64, Ptr), p1, s), OK);
    assert_eq!(call!(cu, "cuMemPoolDestroy", fn(Ptr), mine), OK);
    assert_eq!(call!(cu, "cuMemPoolDestroy", fn(Ptr), mine), INVALID_VALUE);
    assert_eq!(pool_u64(mine, 7).0, INVALID_VALUE);

    // Pointer attributes, several at once; an unknown pointer gets zeros, no error.
    let (mut mt, mut start, mut size, mut managed) = (0u32, 0u64, 0usize, 9u32);
    let attrs: [c_int; 4] = [2, 11, 12, 8];
    let mut data: [Ptr; 4] = [
        (&mut mt as *mut u32).cast(),
        (&mut start as *mut u64).cast(),
        (&mut size as *mut usize).cast(),
        (&mut managed as *mut u32).cast(),
    ];
    let get_attrs = |data: &mut [Ptr; 4], p: u64| {
        call!(
            cu,
            "cuPointerGetAttributes",
            fn(c_uint, *const c_int, *mut Ptr, u64),
            4,
            attrs.as_ptr(),
            data.as_mut_ptr(),
            p
        )
    };
    assert_eq!(get_attrs(&mut data, dp + 700), OK);
    assert_eq!((mt, start, size, managed), (DEVICE, dp, pitch * h, 0));
    assert_eq!(get_attrs(&mut data, 0x1234), OK);
    assert_eq!((mt, start, size, managed), (0, 0, 0, 0));
    assert_eq!(
        call!(
            cu,
            "cuPointerGetAttributes",
            fn(c_uint, *const c_int, *mut Ptr, u64),
            0,
            attrs.as_ptr(),
            data.as_mut_ptr(),
            dp
        ),
        INVALID_VALUE
    );
    let p2p: [c_int; 1] = [5];
    assert_eq!(
        call!(
            cu,
            "cuPointerGetAttributes",
            fn(c_uint, *const c_int, *mut Ptr, u64),
            1,
            p2p.as_ptr(),
            data.as_mut_ptr(),
            dp
        ),
        NOT_SUPPORTED
    );
}
