//! The library through its C ABI against a sim `vgpu-worker`: pitched allocations, 2D and
//! 3D copies, 2D memsets, stream-ordered allocation and memory pools, pointer attributes,
//! each with the bad input a program could pass (sizes past the share, pitches that
//! overflow, ranges past an allocation, foreign handles). One test per file. The test's
//! parts: this file (set-up, 2D and 3D copies, unified and peer copies), then
//! `api_pitched/memsets.rs` and `api_pitched/pools.rs`, in that order on the same library.

mod common;
#[path = "api_pitched/memsets.rs"]
mod memsets;
#[path = "api_pitched/pools.rs"]
mod pools;

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

/// What the parts of the test share: the library with its primary context current, a
/// pitched allocation `dp` of `h` rows of `w` bytes, `pitch` apart, and a stream.
struct Setup {
    cu: Cuda,
    w: usize,
    h: usize,
    dp: u64,
    pitch: usize,
    s: Ptr,
}

#[test]
fn pitched_copies_memsets_pools_and_pointer_attributes() {
    let (_worker, cu) = common::cuda::start("api-pitched");
    assert_eq!(call!(cu, "cuInit", fn(c_uint), 0), OK);
    let ctx = cu.primary_context(0);

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
            fn(*mut Ptr, Ptr, c_uint, c_int),
            &mut other,
            null_mut(),
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

    let t = Setup {
        cu,
        w,
        h,
        dp,
        pitch,
        s,
    };
    memsets::two_d_memsets(&t);
    pools::stream_ordered_allocation_pools_and_pointer_attributes(&t);
}
