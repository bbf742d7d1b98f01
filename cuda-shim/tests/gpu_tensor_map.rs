//! TMA tensor maps end to end on a CUDA GPU: the library (`dlopen`ed, entry points through
//! `cuGetProcAddress_v2`) against `vgpu-worker --backend cuda`, compared with what the
//! GPU's own driver, loaded in this test process through cudarc, encodes for the same
//! arguments at the same device address (this process maps memory of its own there). Skipped (saying why) where the cuda worker
//! cannot start; `VGPU_REQUIRE_CUDA=1` turns the skip into a failure. `VGPU_CUDA_LIBRARY`
//! names a prebuilt library to load instead of the workspace's. One test per file: the
//! library is one per process.

mod common;

use std::ffi::{c_int, c_uint, c_void};
use std::ptr::null_mut;

use common::cuda::*;
use cudarc::driver::sys;

const TENSOR_MAP_ACCESS_SUPPORTED: c_int = 127;
const MIB: u64 = 1 << 20;

#[repr(C, align(128))]
struct TensorMap([u8; 128]);

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

/// A 1024 x 1024 f16 matrix, 64 x 64 boxes, swizzle 128B, L2 promotion 128B.
const DIMS: [u64; 2] = [1024, 1024];
const STRIDES: [u64; 1] = [2048];
const BOXES: [u32; 2] = [64, 64];
const ELEMS: [u32; 2] = [1, 1];

/// What the GPU's driver itself encodes for the matrix at `addr` (this process's own
/// context current).
fn native(addr: u64) -> [u8; 128] {
    use sys::*;
    let mut out = CUtensorMap { opaque: [0; 16] };
    // SAFETY: `out` lives on this frame; the arrays hold rank (strides rank - 1) entries;
    // the address is only encoded.
    let rc = unsafe {
        cuTensorMapEncodeTiled(
            &mut out,
            CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
            2,
            addr as usize as *mut c_void,
            DIMS.as_ptr(),
            STRIDES.as_ptr(),
            BOXES.as_ptr(),
            ELEMS.as_ptr(),
            CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
            CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B,
            CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
            CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
        )
    };
    assert_eq!(
        rc,
        CUresult::CUDA_SUCCESS,
        "the driver's cuTensorMapEncodeTiled"
    );
    let mut bytes = [0u8; 128];
    for (chunk, word) in bytes.chunks_exact_mut(8).zip(out.opaque.iter()) {
        chunk.copy_from_slice(&word.to_le_bytes());
    }
    bytes
}

/// Makes device 0's primary context of the real driver current on this thread.
fn native_context() {
    let mut dev: sys::CUdevice = 0;
    let mut ctx: sys::CUcontext = null_mut();
    // SAFETY: each call writes one value into a local of this frame.
    unsafe {
        assert_eq!(sys::cuInit(0), sys::CUresult::CUDA_SUCCESS);
        assert_eq!(sys::cuDeviceGet(&mut dev, 0), sys::CUresult::CUDA_SUCCESS);
        assert_eq!(
            sys::cuDevicePrimaryCtxRetain(&mut ctx, dev),
            sys::CUresult::CUDA_SUCCESS
        );
        assert_eq!(sys::cuCtxSetCurrent(ctx), sys::CUresult::CUDA_SUCCESS);
    }
}

/// Maps `size` bytes of this process's own device memory at `addr` (the vGPU's address of
/// the worker's allocation), so the driver here encodes an address it has mapped, as the
/// worker's does. Fails the test if the range is taken in this process.
fn mirror(addr: u64, size: usize) {
    use sys::*;
    let location = CUmemLocation {
        type_: CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
        id: 0,
    };
    let prop = CUmemAllocationProp {
        type_: CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
        requestedHandleTypes: CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE,
        location,
        win32HandleMetaData: null_mut(),
        allocFlags: CUmemAllocationProp_st__bindgen_ty_1 {
            compressionType: 0,
            gpuDirectRDMACapable: 0,
            usage: 0,
            reserved: [0; 4],
        },
    };
    let access = CUmemAccessDesc {
        location,
        flags: CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
    };
    let mut at: CUdeviceptr = 0;
    let mut handle: CUmemGenericAllocationHandle = 0;
    // SAFETY: each call reads structs of this frame and writes one value into a local;
    // the range is reserved here before it is mapped.
    unsafe {
        assert_eq!(
            cuMemAddressReserve(&mut at, size, 0, addr, 0),
            CUresult::CUDA_SUCCESS
        );
        assert_eq!(at, addr, "the vGPU's range is taken in this process");
        assert_eq!(
            cuMemCreate(&mut handle, size, &prop, 0),
            CUresult::CUDA_SUCCESS
        );
        assert_eq!(cuMemMap(at, size, 0, handle, 0), CUresult::CUDA_SUCCESS);
        assert_eq!(cuMemSetAccess(at, size, &access, 1), CUresult::CUDA_SUCCESS);
    }
}

#[test]
fn cuda_tensor_maps_through_the_library_match_the_driver() {
    let worker = match common::Worker::start("cuda", "gpu-tensor-map", "1G", 1, &["--gpu", "0"]) {
        Ok(w) => w,
        Err(why) => {
            assert!(
                std::env::var_os("VGPU_REQUIRE_CUDA").is_none(),
                "VGPU_REQUIRE_CUDA is set but the cuda worker did not start: {why}"
            );
            eprintln!("SKIPPED (cuda): {why}");
            return;
        }
    };
    // SAFETY: set before the library reads the environment, while this test is the only
    // thread that touches it.
    unsafe { std::env::set_var("VGPU_SOCKET", &worker.socket) };
    // The GPU machine's suite passes its prebuilt library (no cargo there to build one).
    let cu = match std::env::var_os("VGPU_CUDA_LIBRARY") {
        Some(path) => Cuda::load_from(std::path::Path::new(&path)),
        None => Cuda::load(),
    };
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
    if v == 0 {
        eprintln!("SKIPPED (cuda): the GPU has no tensor memory accelerator");
        return;
    }
    let mut d: u64 = 0;
    assert_eq!(
        call!(
            cu,
            "cuMemAlloc",
            fn(*mut u64, usize),
            &mut d,
            (8 * MIB) as usize
        ),
        OK
    );
    let mut map = TensorMap([0; 128]);
    let out: *mut c_void = (&mut map as *mut TensorMap).cast();
    let encode: TiledFn = cu.f("cuTensorMapEncodeTiled");
    let at = |addr: u64| {
        // SAFETY: the arrays are consts of rank (strides rank - 1) entries; `out` is a
        // 128-byte aligned TensorMap.
        unsafe {
            encode(
                out,
                6,
                2,
                addr as *mut c_void,
                DIMS.as_ptr(),
                STRIDES.as_ptr(),
                BOXES.as_ptr(),
                ELEMS.as_ptr(),
                0,
                3,
                2,
                0,
            )
        }
    };
    assert_eq!(at(d), OK);
    let ours = map.0;
    native_context();
    mirror(d, (8 * MIB) as usize);
    assert_eq!(
        ours,
        native(d),
        "the vGPU's descriptor differs from the driver's"
    );
    // Replacing the address re-encodes: as the driver encodes the new address.
    let replace = call!(
        cu,
        "cuTensorMapReplaceAddress",
        fn(*mut c_void, *mut c_void),
        out,
        (d + 4 * MIB) as *mut c_void
    );
    assert_eq!(replace, OK);
    assert_eq!(map.0, native(d + 4 * MIB));
    assert_ne!(map.0, ours);
    // A tensor past its allocation, or in memory the vGPU does not hold, is refused.
    assert_eq!(at(d + 7 * MIB), INVALID_VALUE);
    assert_eq!(at(d + 64 * MIB), INVALID_VALUE);
    assert_eq!(call!(cu, "cuMemFree", fn(u64), d), OK);
    assert_eq!(at(d), INVALID_VALUE, "freed memory");
    drop(worker);
}
