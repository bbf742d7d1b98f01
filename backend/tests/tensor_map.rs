//! TMA tensor maps on a CUDA GPU: what the cuda backend encodes for a tensor in a vGPU
//! allocation (`Modules::encode_tensor_map`) is byte for byte what the driver's own
//! `cuTensorMapEncodeTiled`/`cuTensorMapEncodeIm2col` give for the same arguments in the
//! same process, and maps the backend must not encode are refused. Skipped without a GPU
//! (`VGPU_REQUIRE_CUDA=1` turns the skip into a failure) and on a GPU without TMA
//! (compute capability below 9.0). The sim backend has no tensor maps.

use std::ffi::c_void;

use cudarc::driver::sys;
use vgpu_backend::{Backend, BackendError, CudaConfig, CudaGpu, SimConfig, SimGpu};
use vgpu_proto::{features, tensor_map_kind, TensorMapArgs, TENSOR_MAP_BYTES};

const MIB: u64 = 1 << 20;

/// The cuda backend, or why there is none (a skip, unless `VGPU_REQUIRE_CUDA` is set).
fn cuda() -> Option<CudaGpu> {
    let why = match CudaGpu::probe() {
        Ok(_) => {
            let reserve = CudaGpu::context_reserve_of(0, &Default::default())
                .expect("context reserve")
                .total()
                .expect("reserve fits u64");
            return Some(
                CudaGpu::new(CudaConfig {
                    memory: 256 * MIB + reserve,
                    va_size: 4 << 30,
                    ..CudaConfig::default()
                })
                .expect("cuda backend"),
            );
        }
        Err(why) => why,
    };
    assert!(
        std::env::var_os("VGPU_REQUIRE_CUDA").is_none(),
        "VGPU_REQUIRE_CUDA is set but the cuda backend cannot run: {why}"
    );
    eprintln!("SKIPPED (cuda): {why}");
    None
}

/// The bytes of a driver-encoded map.
fn bytes_of(map: &sys::CUtensorMap) -> [u8; TENSOR_MAP_BYTES] {
    let mut out = [0u8; TENSOR_MAP_BYTES];
    for (chunk, word) in out.chunks_exact_mut(8).zip(map.opaque.iter()) {
        chunk.copy_from_slice(&word.to_le_bytes());
    }
    out
}

/// Device 0's primary context (the backend's), current on this thread while held.
struct Primary(sys::CUdevice);

impl Primary {
    fn current() -> Primary {
        let mut dev: sys::CUdevice = 0;
        let mut ctx: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: each call writes one value into a local of this frame.
        unsafe {
            assert_eq!(sys::cuDeviceGet(&mut dev, 0), sys::CUresult::CUDA_SUCCESS);
            assert_eq!(
                sys::cuDevicePrimaryCtxRetain(&mut ctx, dev),
                sys::CUresult::CUDA_SUCCESS
            );
            assert_eq!(sys::cuCtxSetCurrent(ctx), sys::CUresult::CUDA_SUCCESS);
        }
        Primary(dev)
    }
}

impl Drop for Primary {
    fn drop(&mut self) {
        // SAFETY: releases the retain of `current` (the backend holds its own).
        let _ = unsafe { sys::cuDevicePrimaryCtxRelease_v2(self.0) };
    }
}

/// The driver's own tiled encoding of `m` (an f16 map, 128B swizzle, 128B L2 promotion).
fn driver_tiled(m: &TensorMapArgs) -> [u8; TENSOR_MAP_BYTES] {
    use sys::*;
    let mut out = CUtensorMap { opaque: [0; 16] };
    // SAFETY: `out` lives on this frame; the arrays are `m`'s, at least rank long.
    let rc = unsafe {
        cuTensorMapEncodeTiled(
            &mut out,
            CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
            m.rank,
            m.global_address as usize as *mut c_void,
            m.global_dim.as_ptr(),
            m.global_strides.as_ptr(),
            m.box_dim.as_ptr(),
            m.element_strides.as_ptr(),
            CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
            CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B,
            CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
            CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
        )
    };
    assert_eq!(rc, CUresult::CUDA_SUCCESS, "cuTensorMapEncodeTiled");
    bytes_of(&out)
}

/// The driver's own im2col encoding of `m` (f16, 128B swizzle, no L2 promotion).
fn driver_im2col(m: &TensorMapArgs) -> [u8; TENSOR_MAP_BYTES] {
    use sys::*;
    let mut out = CUtensorMap { opaque: [0; 16] };
    // SAFETY: as in `driver_tiled`; the corners hold rank - 2 entries.
    let rc = unsafe {
        cuTensorMapEncodeIm2col(
            &mut out,
            CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
            m.rank,
            m.global_address as usize as *mut c_void,
            m.global_dim.as_ptr(),
            m.global_strides.as_ptr(),
            m.pixel_box_lower.as_ptr(),
            m.pixel_box_upper.as_ptr(),
            m.channels_per_pixel,
            m.pixels_per_column,
            m.element_strides.as_ptr(),
            CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
            CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B,
            CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_NONE,
            CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
        )
    };
    assert_eq!(rc, CUresult::CUDA_SUCCESS, "cuTensorMapEncodeIm2col");
    bytes_of(&out)
}

/// A 1024 x 1024 f16 matrix at `addr` (2 MiB), 64 x 64 boxes: a Hopper GEMM's tile loads.
fn gemm_tile(addr: u64) -> TensorMapArgs {
    TensorMapArgs {
        kind: tensor_map_kind::TILED,
        data_type: 6,
        rank: 2,
        swizzle: 3,
        l2_promotion: 2,
        global_address: addr,
        global_dim: [1024, 1024, 0, 0, 0],
        global_strides: [2048, 0, 0, 0],
        box_dim: [64, 64, 0, 0, 0],
        element_strides: [1, 1, 0, 0, 0],
        ..TensorMapArgs::default()
    }
}

#[test]
fn cuda_tensor_map_matches_the_drivers_own_encoding() {
    let Some(gpu) = cuda() else { return };
    if gpu.info().features & features::TENSOR_MAPS == 0 {
        eprintln!(
            "SKIPPED (cuda): {} has no tensor memory accelerator",
            gpu.info().name
        );
        let a = gpu.alloc(4 * MIB).expect("alloc");
        let e = gpu.modules().encode_tensor_map(&gemm_tile(a.addr));
        assert!(matches!(e, Err(BackendError::NotSupported(_))), "{e:?}");
        return;
    }
    let a = gpu.alloc(4 * MIB).expect("alloc");
    let tiled = gemm_tile(a.addr + 2 * MIB);
    let ours = gpu.modules().encode_tensor_map(&tiled).expect("encoded");
    let _ctx = Primary::current();
    assert_eq!(
        ours,
        driver_tiled(&tiled),
        "tiled map differs from the driver's"
    );
    assert_ne!(ours, [0u8; TENSOR_MAP_BYTES]);
    // Another address gives another descriptor: the address is in it.
    let other = gpu
        .modules()
        .encode_tensor_map(&gemm_tile(a.addr))
        .expect("encoded");
    assert_ne!(other, ours);
    assert_eq!(other, driver_tiled(&gemm_tile(a.addr)));

    // NHWC f16 activations (N 4, H 16, W 16, C 64) as im2col columns, padding 1.
    let im2col = TensorMapArgs {
        kind: tensor_map_kind::IM2COL,
        data_type: 6,
        rank: 4,
        swizzle: 3,
        global_address: a.addr,
        global_dim: [64, 16, 16, 4, 0],
        global_strides: [128, 2048, 32768, 0],
        element_strides: [1, 1, 1, 1, 0],
        pixel_box_lower: [-1, -1, 0],
        pixel_box_upper: [-1, -1, 0],
        channels_per_pixel: 64,
        pixels_per_column: 128,
        ..TensorMapArgs::default()
    };
    let ours = gpu.modules().encode_tensor_map(&im2col).expect("encoded");
    assert_eq!(
        ours,
        driver_im2col(&im2col),
        "im2col map differs from the driver's"
    );

    // What the backend must not encode: a tensor past its allocation, memory it never
    // allocated, malformed parameters.
    let past = gemm_tile(a.addr + 3 * MIB);
    let e = gpu.modules().encode_tensor_map(&past);
    assert!(matches!(e, Err(BackendError::BadPointer { .. })), "{e:?}");
    let foreign = gemm_tile(a.addr + 64 * MIB);
    let e = gpu.modules().encode_tensor_map(&foreign);
    assert!(matches!(e, Err(BackendError::BadPointer { .. })), "{e:?}");
    let malformed = TensorMapArgs {
        box_dim: [64, 512, 0, 0, 0],
        ..tiled
    };
    let e = gpu.modules().encode_tensor_map(&malformed);
    assert!(matches!(e, Err(BackendError::InvalidArgument(_))), "{e:?}");
    gpu.free(a.addr).expect("free");
    let e = gpu.modules().encode_tensor_map(&tiled);
    assert!(matches!(e, Err(BackendError::BadPointer { .. })), "{e:?}");
}

#[test]
fn sim_backend_has_no_tensor_maps() {
    let sim = SimGpu::new(SimConfig::default()).expect("sim");
    assert_eq!(sim.info().features & features::TENSOR_MAPS, 0);
    let a = sim.alloc(4 * MIB).expect("alloc");
    let e = sim.modules().encode_tensor_map(&gemm_tile(a.addr));
    assert!(matches!(e, Err(BackendError::NotSupported(_))), "{e:?}");
}
