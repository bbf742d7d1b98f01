//! TMA tensor maps through the C ABI against a sim `vgpu-worker`, which has none:
//! `cuTensorMapEncodeTiled`, `cuTensorMapEncodeIm2col` and `cuTensorMapReplaceAddress`
//! answer `CUDA_ERROR_NOT_SUPPORTED` for well-formed maps and leave the descriptor alone,
//! `TENSOR_MAP_ACCESS_SUPPORTED` reads 0, and every malformed argument answers
//! `CUDA_ERROR_INVALID_VALUE` (refused by the library itself: the device would have said
//! `NOT_SUPPORTED`). One test per file: the library is one per process.

mod common;

use std::ffi::{c_int, c_uint, c_void};
use std::ptr::{null, null_mut};

use common::cuda::*;

const TENSOR_MAP_ACCESS_SUPPORTED: c_int = 127;
const VERSION_NOT_SUFFICIENT: c_int = 2;

/// A `CUtensorMap`: 128 bytes, 128-byte aligned as CUDA 13's header declares it.
#[repr(C, align(128))]
#[derive(Clone, Copy)]
struct TensorMap([u8; 128]);

/// `cuTensorMapEncodeTiled`'s arguments.
#[derive(Clone, Copy)]
struct Tiled {
    data_type: c_uint,
    rank: c_uint,
    addr: u64,
    dims: [u64; 5],
    strides: [u64; 4],
    boxes: [u32; 5],
    elems: [u32; 5],
    interleave: c_uint,
    swizzle: c_uint,
    l2: c_uint,
    oob: c_uint,
}

type TiledFn = unsafe extern "C" fn(
    *mut c_void,
    c_uint,
    c_uint,
    *mut c_void,
    *const u64,
    *const u64,
    *const u32,
    *const u32,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
) -> R;

type Im2colFn = unsafe extern "C" fn(
    *mut c_void,
    c_uint,
    c_uint,
    *mut c_void,
    *const u64,
    *const u64,
    *const c_int,
    *const c_int,
    c_uint,
    c_uint,
    *const u32,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
) -> R;

fn tiled(cu: &Cuda, out: *mut c_void, t: &Tiled) -> R {
    let f: TiledFn = cu.f("cuTensorMapEncodeTiled");
    // SAFETY: the arrays live in `t` and hold 5 (dims) or 4 (strides) entries, more than
    // any rank these tests pass reads; `out` is a TensorMap or a refused pointer.
    unsafe {
        f(
            out,
            t.data_type,
            t.rank,
            t.addr as *mut c_void,
            t.dims.as_ptr(),
            t.strides.as_ptr(),
            t.boxes.as_ptr(),
            t.elems.as_ptr(),
            t.interleave,
            t.swizzle,
            t.l2,
            t.oob,
        )
    }
}

#[test]
fn tensor_maps_answer_as_documented_on_a_vgpu_without_them() {
    let (_worker, cu) = common::cuda::start("api-tensor-map");
    let mut map = TensorMap([0xa5; 128]);
    let out: *mut c_void = (&mut map as *mut TensorMap).cast();
    // A 1024 x 256 f16 matrix, 64 x 64 boxes swizzled 128B.
    let good = |addr: u64| Tiled {
        data_type: 6,
        rank: 2,
        addr,
        dims: [1024, 256, 0, 0, 0],
        strides: [2048, 0, 0, 0],
        boxes: [64, 64, 0, 0, 0],
        elems: [1, 1, 0, 0, 0],
        interleave: 0,
        swizzle: 3,
        l2: 2,
        oob: 0,
    };
    assert_eq!(tiled(&cu, out, &good(0x2000_0000_0000)), NOT_INITIALIZED);
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
    // No current context yet.
    assert_eq!(tiled(&cu, out, &good(0x2000_0000_0000)), INVALID_CONTEXT);
    assert_eq!(call!(cu, "cuCtxSetCurrent", fn(Ptr), ctx), OK);
    let mut v: c_int = -1;
    assert_eq!(
        call!(
            cu,
            "cuDeviceGetAttribute",
            fn(*mut c_int, c_int, c_int),
            &mut v,
            TENSOR_MAP_ACCESS_SUPPORTED,
            0
        ),
        OK
    );
    assert_eq!(v, 0, "a sim vGPU has no tensor memory accelerator");
    let mut d: u64 = 0;
    assert_eq!(
        call!(cu, "cuMemAlloc", fn(*mut u64, usize), &mut d, 1 << 20),
        OK
    );

    // Well-formed: not supported here, and the descriptor is left as it was.
    let g = good(d);
    assert_eq!(tiled(&cu, out, &g), NOT_SUPPORTED);
    assert_eq!(map.0, [0xa5; 128]);

    // Malformed: each refused by the library.
    let misaligned = out.cast::<u8>().wrapping_add(32).cast::<c_void>();
    assert_eq!(tiled(&cu, null_mut(), &g), INVALID_VALUE, "NULL tensor map");
    assert_eq!(
        tiled(&cu, misaligned, &g),
        INVALID_VALUE,
        "tensor map off 64 bytes"
    );
    let bad: [(&str, Tiled); 14] = [
        ("rank 0", Tiled { rank: 0, ..g }),
        ("rank 6", Tiled { rank: 6, ..g }),
        ("NULL address", Tiled { addr: 0, ..g }),
        ("address off 16", Tiled { addr: d + 8, ..g }),
        (
            "dim 0",
            Tiled {
                dims: [1024, 0, 0, 0, 0],
                ..g
            },
        ),
        (
            "stride off 16",
            Tiled {
                strides: [2056, 0, 0, 0],
                ..g
            },
        ),
        (
            "stride 2^40",
            Tiled {
                strides: [1 << 40, 0, 0, 0],
                ..g
            },
        ),
        (
            "box 0",
            Tiled {
                boxes: [64, 0, 0, 0, 0],
                ..g
            },
        ),
        (
            "box 257",
            Tiled {
                boxes: [64, 257, 0, 0, 0],
                ..g
            },
        ),
        (
            "element stride 9",
            Tiled {
                elems: [1, 9, 0, 0, 0],
                ..g
            },
        ),
        ("data type 16", Tiled { data_type: 16, ..g }),
        ("interleave 3", Tiled { interleave: 3, ..g }),
        ("swizzle 7", Tiled { swizzle: 7, ..g }),
        (
            "NaN fill of integers",
            Tiled {
                data_type: 3,
                boxes: [32, 64, 0, 0, 0],
                oob: 1,
                ..g
            },
        ),
    ];
    for (what, t) in bad {
        assert_eq!(tiled(&cu, out, &t), INVALID_VALUE, "{what}");
    }
    // NULL arrays: refused when the rank reads them; rank 1 has no strides to read.
    let f: TiledFn = cu.f("cuTensorMapEncodeTiled");
    let one = Tiled {
        rank: 1,
        dims: [1024, 0, 0, 0, 0],
        boxes: [64, 0, 0, 0, 0],
        elems: [1, 0, 0, 0, 0],
        ..g
    };
    // SAFETY: valid arrays where the rank reads them, NULL where it reads none.
    let rc = unsafe {
        f(
            out,
            6,
            1,
            d as *mut c_void,
            one.dims.as_ptr(),
            null(),
            one.boxes.as_ptr(),
            one.elems.as_ptr(),
            0,
            3,
            2,
            0,
        )
    };
    assert_eq!(rc, NOT_SUPPORTED, "rank 1 without strides is well-formed");
    // SAFETY: as above.
    let rc = unsafe {
        f(
            out,
            6,
            2,
            d as *mut c_void,
            g.dims.as_ptr(),
            null(),
            g.boxes.as_ptr(),
            g.elems.as_ptr(),
            0,
            3,
            2,
            0,
        )
    };
    assert_eq!(rc, INVALID_VALUE, "NULL strides for rank 2");
    // SAFETY: as above.
    let rc = unsafe {
        f(
            out,
            6,
            2,
            d as *mut c_void,
            g.dims.as_ptr(),
            g.strides.as_ptr(),
            null(),
            g.elems.as_ptr(),
            0,
            3,
            2,
            0,
        )
    };
    assert_eq!(rc, INVALID_VALUE, "NULL box dims");

    // Im2col: an NHWC f16 activation (N 2, H 8, W 8, C 64), padding 1.
    let im2col: Im2colFn = cu.f("cuTensorMapEncodeIm2col");
    let dims = [64u64, 8, 8, 2];
    let strides = [128u64, 1024, 8192];
    let elems = [1u32; 4];
    let run = |rank: c_uint, lower: [c_int; 2], channels: c_uint, pixels: c_uint| {
        let upper: [c_int; 2] = [-1, -1];
        // SAFETY: arrays of at least `rank` (strides rank - 1, corners rank - 2) entries.
        unsafe {
            im2col(
                out,
                6,
                rank,
                d as *mut c_void,
                dims.as_ptr(),
                strides.as_ptr(),
                lower.as_ptr(),
                upper.as_ptr(),
                channels,
                pixels,
                elems.as_ptr(),
                0,
                3,
                0,
                0,
            )
        }
    };
    assert_eq!(run(4, [-1, -1], 64, 128), NOT_SUPPORTED);
    assert_eq!(run(2, [-1, -1], 64, 128), INVALID_VALUE, "im2col rank 2");
    assert_eq!(
        run(4, [-129, -1], 64, 128),
        INVALID_VALUE,
        "corner below -128"
    );
    assert_eq!(run(4, [-1, -1], 0, 128), INVALID_VALUE, "no channels");
    assert_eq!(run(4, [-1, -1], 257, 128), INVALID_VALUE, "257 channels");
    assert_eq!(run(4, [-1, -1], 64, 1025), INVALID_VALUE, "1025 pixels");
    assert_eq!(map.0, [0xa5; 128]);

    // Replacing the address: only of a map this library encoded (none here).
    let replace = |m: *mut c_void, addr: u64| {
        call!(
            cu,
            "cuTensorMapReplaceAddress",
            fn(*mut c_void, *mut c_void),
            m,
            addr as *mut c_void
        )
    };
    assert_eq!(replace(out, d), NOT_SUPPORTED);
    assert_eq!(replace(null_mut(), d), INVALID_VALUE);
    assert_eq!(replace(misaligned, d), INVALID_VALUE);
    assert_eq!(map.0, [0xa5; 128]);

    // The entry points exist from CUDA 12.0.
    for name in [
        c"cuTensorMapEncodeTiled",
        c"cuTensorMapEncodeIm2col",
        c"cuTensorMapReplaceAddress",
    ] {
        let mut p: Ptr = null_mut();
        let mut status: c_int = -1;
        // SAFETY: valid name and out pointers.
        let r = unsafe { (cu.get_proc)(name.as_ptr(), &mut p, 11080, 0, &mut status) };
        assert_eq!((r, status), (OK, VERSION_NOT_SUFFICIENT), "{name:?}");
        assert!(p.is_null());
    }
    // The library and the context still work.
    assert_eq!(call!(cu, "cuMemFree", fn(u64), d), OK);
}
