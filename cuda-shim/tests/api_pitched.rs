//! The library through its C ABI against a sim `vgpu-worker`: pitched allocations, 2D and
//! 3D copies, 2D memsets, stream-ordered allocation and memory pools, pointer attributes,
//! each with the bad input a program could pass (sizes past the share, pitches that
//! overflow, ranges past an allocation, foreign handles). One test per file.

mod common;

use std::ffi::{c_int, c_uint, c_void};
use std::ptr::null_mut;

use common::cuda::*;

const OUT_OF_MEMORY: R = 2;
const HOST: c_uint = 1;
const DEVICE: c_uint = 2;
const ARRAY: c_uint = 3;

/// `CUDA_MEMCPY2D`.
#[repr(C)]
#[derive(Clone, Copy)]
struct Memcpy2d {
    src_x: usize,
    src_y: usize,
    src_type: c_uint,
    src_host: *const c_void,
    src_device: u64,
    src_array: Ptr,
    src_pitch: usize,
    dst_x: usize,
    dst_y: usize,
    dst_type: c_uint,
    dst_host: *mut c_void,
    dst_device: u64,
    dst_array: Ptr,
    dst_pitch: usize,
    width: usize,
    height: usize,
}

/// `CUDA_MEMCPY3D`.
#[repr(C)]
#[derive(Clone, Copy)]
struct Memcpy3d {
    src_x: usize,
    src_y: usize,
    src_z: usize,
    src_lod: usize,
    src_type: c_uint,
    src_host: *const c_void,
    src_device: u64,
    src_array: Ptr,
    reserved0: Ptr,
    src_pitch: usize,
    src_height: usize,
    dst_x: usize,
    dst_y: usize,
    dst_z: usize,
    dst_lod: usize,
    dst_type: c_uint,
    dst_host: *mut c_void,
    dst_device: u64,
    dst_array: Ptr,
    reserved1: Ptr,
    dst_pitch: usize,
    dst_height: usize,
    width: usize,
    height: usize,
    depth: usize,
}

fn zeroed<T>() -> T {
    // SAFETY: only used for the plain C structs above, for which all zeros is valid.
    unsafe { std::mem::zeroed() }
}

/// `CUmemPoolProps`.
#[derive(Clone, Copy)]
#[repr(C)]
struct PoolProps {
    alloc_type: c_int,
    handle_types: c_int,
    location: [c_int; 2],
    win32: Ptr,
    max_size: usize,
    usage: u16,
    reserved: [u8; 54],
}

#[test]
fn pitched_copies_memsets_pools_and_pointer_attributes() {
    let (_worker, cu) = common::cuda::start("api-pitched");
    assert_eq!(call!(cu, "cuInit", fn(c_uint), 0), OK);
    let mut ctx: Ptr = null_mut();
    assert_eq!(
        call!(
            cu,
            "cuDevicePrimaryCtxRetain",
            fn(*mut Ptr, c_int),
            &mut ctx,
            0
        ),
        OK
    );
    assert_eq!(call!(cu, "cuCtxSetCurrent", fn(Ptr), ctx), OK);

    // A pitched allocation: rows of 100 bytes, pitch rounded up to 512.
    let (w, h) = (100usize, 8usize);
    let (mut dp, mut pitch) = (0u64, 0usize);
    let alloc_pitch = |dp: &mut u64, pitch: &mut usize, w: usize, h: usize, e: c_uint| {
        call!(
            cu,
            "cuMemAllocPitch",
            fn(*mut u64, *mut usize, usize, usize, c_uint),
            dp,
            pitch,
            w,
            h,
            e
        )
    };
    assert_eq!(alloc_pitch(&mut dp, &mut pitch, w, h, 4), OK);
    assert_eq!(pitch, 512);
    let (mut x, mut xp) = (0u64, 0usize);
    assert_eq!(
        alloc_pitch(&mut x, &mut xp, w, h, 3),
        INVALID_VALUE,
        "element size 3"
    );
    assert_eq!(alloc_pitch(&mut x, &mut xp, 0, h, 4), INVALID_VALUE);
    assert_eq!(
        alloc_pitch(&mut x, &mut xp, usize::MAX - 10, 2, 4),
        INVALID_VALUE,
        "pitch overflow"
    );
    assert_eq!(
        alloc_pitch(&mut x, &mut xp, 1 << 31, 2, 4),
        INVALID_VALUE,
        "a pitch past the limit"
    );
    assert_eq!(
        alloc_pitch(&mut x, &mut xp, 1 << 20, 1 << 12, 4),
        OUT_OF_MEMORY,
        "4 GiB: past the 256 MiB share"
    );

    // Host rows of 100 bytes, 128 apart, into the pitched allocation and back.
    let src: Vec<u8> = (0..128 * h).map(|i| (i % 251) as u8).collect();
    let mut c2 = Memcpy2d {
        src_type: HOST,
        src_host: src.as_ptr().cast(),
        src_pitch: 128,
        dst_type: DEVICE,
        dst_device: dp,
        dst_pitch: pitch,
        width: w,
        height: h,
        ..zeroed()
    };
    let copy2d = |c: &Memcpy2d| call!(cu, "cuMemcpy2D", fn(*const Memcpy2d), c);
    assert_eq!(copy2d(&c2), OK);
    let mut whole = vec![0u8; pitch * h];
    assert_eq!(
        call!(
            cu,
            "cuMemcpyDtoH",
            fn(*mut c_void, u64, usize),
            whole.as_mut_ptr().cast(),
            dp,
            pitch * h
        ),
        OK
    );
    for r in 0..h {
        assert_eq!(
            &whole[r * pitch..r * pitch + w],
            &src[r * 128..r * 128 + w],
            "row {r}"
        );
    }
    // Back out, device to host, with offsets: rows 2.. from x = 10 into a packed buffer.
    let mut packed = vec![0u8; 50 * 4];
    let back = Memcpy2d {
        src_x: 10,
        src_y: 2,
        src_type: DEVICE,
        src_device: dp,
        src_pitch: pitch,
        dst_type: HOST,
        dst_host: packed.as_mut_ptr().cast(),
        dst_pitch: 50,
        width: 50,
        height: 4,
        ..zeroed()
    };
    assert_eq!(copy2d(&back), OK);
    for r in 0..4 {
        let s = (r + 2) * 128 + 10;
        assert_eq!(&packed[r * 50..r * 50 + 50], &src[s..s + 50], "row {r}");
    }
    // Device to device, asynchronously on a stream, then the unaligned form.
    let (mut dp2, mut pitch2) = (0u64, 0usize);
    assert_eq!(alloc_pitch(&mut dp2, &mut pitch2, w, h, 4), OK);
    let mut s: Ptr = null_mut();
    assert_eq!(
        call!(cu, "cuStreamCreate", fn(*mut Ptr, c_uint), &mut s, 0),
        OK
    );
    let d2d = Memcpy2d {
        src_type: DEVICE,
        src_device: dp,
        src_pitch: pitch,
        dst_type: DEVICE,
        dst_device: dp2,
        dst_pitch: pitch2,
        width: w,
        height: h,
        ..zeroed()
    };
    assert_eq!(
        call!(cu, "cuMemcpy2DAsync", fn(*const Memcpy2d, Ptr), &d2d, s),
        OK
    );
    assert_eq!(call!(cu, "cuStreamSynchronize", fn(Ptr), s), OK);
    let mut whole2 = vec![0u8; pitch2 * h];
    assert_eq!(
        call!(
            cu,
            "cuMemcpyDtoH",
            fn(*mut c_void, u64, usize),
            whole2.as_mut_ptr().cast(),
            dp2,
            pitch2 * h
        ),
        OK
    );
    for r in 0..h {
        assert_eq!(
            &whole2[r * pitch2..r * pitch2 + w],
            &src[r * 128..r * 128 + w]
        );
    }
    assert_eq!(
        call!(cu, "cuMemcpy2DUnaligned", fn(*const Memcpy2d), &d2d),
        OK
    );

    // Bad 2D copies: answered before anything is copied.
    c2.height = h + 1;
    assert_eq!(copy2d(&c2), INVALID_VALUE, "one row past the allocation");
    c2.height = h;
    c2.src_pitch = 64;
    assert_eq!(copy2d(&c2), INVALID_VALUE, "a pitch below the row");
    c2.src_pitch = 128;
    c2.dst_pitch = usize::MAX / 2;
    assert_eq!(copy2d(&c2), INVALID_VALUE, "a pitch past the limit");
    c2.dst_pitch = pitch;
    c2.dst_y = usize::MAX / 4;
    assert_eq!(copy2d(&c2), INVALID_VALUE, "an offset that overflows");
    c2.dst_y = 0;
    c2.dst_type = ARRAY;
    assert_eq!(copy2d(&c2), NOT_SUPPORTED, "arrays are not offered");
    c2.dst_type = 9;
    assert_eq!(copy2d(&c2), INVALID_VALUE);
    c2.dst_type = DEVICE;
    c2.dst_device = 0xdead_0000;
    assert_eq!(copy2d(&c2), INVALID_VALUE, "not an allocation");
    c2.dst_device = dp;
    c2.src_host = std::ptr::null();
    assert_eq!(copy2d(&c2), INVALID_VALUE, "NULL host memory");
    assert_eq!(
        call!(cu, "cuMemcpy2D", fn(*const Memcpy2d), std::ptr::null()),
        INVALID_VALUE
    );
    assert_eq!(
        call!(
            cu,
            "cuMemcpy2DAsync",
            fn(*const Memcpy2d, Ptr),
            &d2d,
            0x7777 as Ptr
        ),
        INVALID_HANDLE
    );

    // 3D: two slices of 4 rows of 16 bytes from a host volume (pitch 32, 6 rows a slice)
    // into a packed device buffer, and back.
    let vol: Vec<u8> = (0..32 * 6 * 2).map(|i| (i * 7 % 253) as u8).collect();
    let mut dv = 0u64;
    assert_eq!(
        call!(cu, "cuMemAlloc", fn(*mut u64, usize), &mut dv, 16 * 4 * 2),
        OK
    );
    let c3 = Memcpy3d {
        src_x: 8,
        src_y: 1,
        src_type: HOST,
        src_host: vol.as_ptr().cast(),
        src_pitch: 32,
        src_height: 6,
        dst_type: DEVICE,
        dst_device: dv,
        dst_pitch: 16,
        dst_height: 4,
        width: 16,
        height: 4,
        depth: 2,
        ..zeroed()
    };
    assert_eq!(call!(cu, "cuMemcpy3D", fn(*const Memcpy3d), &c3), OK);
    let mut flat = vec![0u8; 16 * 4 * 2];
    assert_eq!(
        call!(
            cu,
            "cuMemcpyDtoH",
            fn(*mut c_void, u64, usize),
            flat.as_mut_ptr().cast(),
            dv,
            flat.len()
        ),
        OK
    );
    for z in 0..2 {
        for y in 0..4 {
            let s = z * 32 * 6 + (y + 1) * 32 + 8;
            let d = (z * 4 + y) * 16;
            assert_eq!(&flat[d..d + 16], &vol[s..s + 16], "slice {z} row {y}");
        }
    }
    let mut bad3 = c3;
    bad3.src_height = 3;
    assert_eq!(
        call!(cu, "cuMemcpy3D", fn(*const Memcpy3d), &bad3),
        INVALID_VALUE,
        "slice shorter than the rows copied"
    );
    bad3 = c3;
    bad3.src_lod = 1;
    assert_eq!(
        call!(cu, "cuMemcpy3D", fn(*const Memcpy3d), &bad3),
        INVALID_VALUE
    );
    bad3 = c3;
    bad3.depth = 3;
    assert_eq!(
        call!(cu, "cuMemcpy3DAsync", fn(*const Memcpy3d, Ptr), &bad3, s),
        INVALID_VALUE,
        "a slice past the allocation"
    );

    assert_eq!(
        call!(
            cu,
            "cuMemcpy3DAsync",
            fn(*const Memcpy3d, Ptr),
            std::ptr::null(),
            s
        ),
        INVALID_VALUE
    );
    assert_eq!(
        call!(
            cu,
            "cuMemcpy2DAsync",
            fn(*const Memcpy2d, Ptr),
            std::ptr::null(),
            s
        ),
        INVALID_VALUE
    );

    // Unified copies: the direction from where each address lies.
    let mut du = 0u64;
    assert_eq!(
        call!(cu, "cuMemAlloc", fn(*mut u64, usize), &mut du, 512),
        OK
    );
    let hsrc: Vec<u8> = (0..256).map(|i| i as u8).collect();
    let mut hdst = vec![0u8; 256];
    let umem =
        |dst: u64, src: u64, n: usize| call!(cu, "cuMemcpy", fn(u64, u64, usize), dst, src, n);
    assert_eq!(umem(du, hsrc.as_ptr() as u64, 256), OK, "host to device");
    assert_eq!(umem(du + 256, du, 256), OK, "device to device");
    assert_eq!(
        call!(
            cu,
            "cuMemcpyAsync",
            fn(u64, u64, usize, Ptr),
            hdst.as_mut_ptr() as u64,
            du + 256,
            256,
            s
        ),
        OK,
        "device to host"
    );
    assert_eq!(call!(cu, "cuStreamSynchronize", fn(Ptr), s), OK);
    assert_eq!(hdst, hsrc);
    let mut hcopy = vec![0u8; 256];
    assert_eq!(
        umem(hcopy.as_mut_ptr() as u64, hsrc.as_ptr() as u64, 256),
        OK,
        "host to host"
    );
    assert_eq!(hcopy, hsrc);
    assert_eq!(
        umem(du + 400, du, 256),
        INVALID_VALUE,
        "past the allocation"
    );
    assert_eq!(umem(0, du, 16), INVALID_VALUE, "NULL");
    assert_eq!(umem(du, 0, 16), INVALID_VALUE);
    // Peer copies between two contexts of the one device.
    let mut other: Ptr = null_mut();
    assert_eq!(
        call!(
            cu,
            "cuCtxCreate",
            fn(*mut Ptr, c_uint, c_int),
            &mut other,
            0,
            0
        ),
        OK
    );
    assert_eq!(call!(cu, "cuCtxSetCurrent", fn(Ptr), ctx), OK);
    let peer = |dst: u64, dc: Ptr, src: u64, sc: Ptr| {
        call!(
            cu,
            "cuMemcpyPeer",
            fn(u64, Ptr, u64, Ptr, usize),
            dst,
            dc,
            src,
            sc,
            64
        )
    };
    assert_eq!(peer(du + 64, other, du, ctx), OK);
    assert_eq!(peer(du + 64, 0x7777 as Ptr, du, ctx), INVALID_CONTEXT);
    assert_eq!(peer(0xdead_0000, other, du, ctx), INVALID_VALUE);
    assert_eq!(
        call!(
            cu,
            "cuMemcpyPeerAsync",
            fn(u64, Ptr, u64, Ptr, usize, Ptr),
            du + 128,
            ctx,
            du,
            other,
            64,
            s
        ),
        OK
    );
    assert_eq!(call!(cu, "cuStreamSynchronize", fn(Ptr), s), OK);
    let mut back3 = vec![0u8; 192];
    assert_eq!(umem(back3.as_mut_ptr() as u64, du, 192), OK);
    assert_eq!(&back3[64..128], &hsrc[..64]);
    assert_eq!(&back3[128..192], &hsrc[..64]);
    assert_eq!(call!(cu, "cuCtxDestroy", fn(Ptr), other), OK);
    assert_eq!(call!(cu, "cuCtxSetCurrent", fn(Ptr), ctx), OK);

    // 2D memsets: 32-bit values in 20 of each row's 128 words, the rest untouched.
    assert_eq!(
        call!(cu, "cuMemsetD8", fn(u64, u8, usize), dp, 0, pitch * h),
        OK
    );
    assert_eq!(
        call!(
            cu,
            "cuMemsetD2D32",
            fn(u64, usize, c_uint, usize, usize),
            dp,
            pitch,
            0xA5A5_0001,
            20,
            h
        ),
        OK
    );
    assert_eq!(
        call!(
            cu,
            "cuMemsetD2D16Async",
            fn(u64, usize, u16, usize, usize, Ptr),
            dp + 100,
            pitch,
            0x0202,
            4,
            h,
            s
        ),
        OK
    );
    assert_eq!(call!(cu, "cuStreamSynchronize", fn(Ptr), s), OK);
    assert_eq!(
        call!(
            cu,
            "cuMemcpyDtoH",
            fn(*mut c_void, u64, usize),
            whole.as_mut_ptr().cast(),
            dp,
            pitch * h
        ),
        OK
    );
    for r in 0..h {
        let row = &whole[r * pitch..(r + 1) * pitch];
        for k in 0..20 {
            assert_eq!(
                u32::from_le_bytes(row[k * 4..k * 4 + 4].try_into().unwrap()),
                0xA5A5_0001
            );
        }
        assert!(row[80..100].iter().all(|&b| b == 0));
        assert!(row[100..108].iter().all(|&b| b == 2));
        assert!(row[108..].iter().all(|&b| b == 0));
    }
    let md8 = |d: u64, p: usize, w: usize, h: usize| {
        call!(
            cu,
            "cuMemsetD2D8",
            fn(u64, usize, u8, usize, usize),
            d,
            p,
            1,
            w,
            h
        )
    };
    assert_eq!(
        md8(dp, pitch, w, h + 1),
        INVALID_VALUE,
        "a row past the allocation"
    );
    assert_eq!(md8(dp, 50, w, h), INVALID_VALUE, "a pitch below the row");
    assert_eq!(
        md8(dp, usize::MAX / 2, w, 2),
        INVALID_VALUE,
        "a pitch past the limit"
    );
    assert_eq!(md8(0xdead_0000, pitch, w, h), INVALID_VALUE);
    assert_eq!(
        call!(
            cu,
            "cuMemsetD2D32",
            fn(u64, usize, c_uint, usize, usize),
            dp + 2,
            pitch,
            1,
            4,
            2
        ),
        INVALID_VALUE,
        "misaligned"
    );
    assert_eq!(md8(dp, pitch, 0, h), OK, "nothing to set");

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
