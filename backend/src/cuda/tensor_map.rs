//! TMA tensor map descriptors (`ENCODE_TENSOR_MAP`): encoded by the GPU's driver
//! (`cuTensorMapEncodeTiled`, `cuTensorMapEncodeIm2col`) in the worker. A vGPU's device
//! addresses are this process's GPU virtual addresses (the vGPU's fixed range, kept across
//! swapping and migration), so the descriptor the driver writes here is the one the
//! tenant's kernels need.

use cudarc::driver::sys;
use vgpu_proto::{tensor_map_kind, TensorMapArgs, TENSOR_MAP_BYTES};

use super::driver::{check, CuError};

/// `value` as a CUDA enum: `Some` only for the values `all` lists (the arguments passed
/// `TensorMapArgs::check`, but a value outside the enum must never become one).
fn pick<T: Copy>(all: &[T], value: u32) -> Option<T> {
    all.get(usize::try_from(value).ok()?).copied()
}

fn data_type(v: u32) -> Option<sys::CUtensorMapDataType> {
    use sys::CUtensorMapDataType::*;
    pick(
        &[
            CU_TENSOR_MAP_DATA_TYPE_UINT8,
            CU_TENSOR_MAP_DATA_TYPE_UINT16,
            CU_TENSOR_MAP_DATA_TYPE_UINT32,
            CU_TENSOR_MAP_DATA_TYPE_INT32,
            CU_TENSOR_MAP_DATA_TYPE_UINT64,
            CU_TENSOR_MAP_DATA_TYPE_INT64,
            CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
            CU_TENSOR_MAP_DATA_TYPE_FLOAT32,
            CU_TENSOR_MAP_DATA_TYPE_FLOAT64,
            CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
            CU_TENSOR_MAP_DATA_TYPE_FLOAT32_FTZ,
            CU_TENSOR_MAP_DATA_TYPE_TFLOAT32,
            CU_TENSOR_MAP_DATA_TYPE_TFLOAT32_FTZ,
            CU_TENSOR_MAP_DATA_TYPE_16U4_ALIGN8B,
            CU_TENSOR_MAP_DATA_TYPE_16U4_ALIGN16B,
            CU_TENSOR_MAP_DATA_TYPE_16U6_ALIGN16B,
        ],
        v,
    )
}

fn interleave(v: u32) -> Option<sys::CUtensorMapInterleave> {
    use sys::CUtensorMapInterleave::*;
    pick(
        &[
            CU_TENSOR_MAP_INTERLEAVE_NONE,
            CU_TENSOR_MAP_INTERLEAVE_16B,
            CU_TENSOR_MAP_INTERLEAVE_32B,
        ],
        v,
    )
}

fn swizzle(v: u32) -> Option<sys::CUtensorMapSwizzle> {
    use sys::CUtensorMapSwizzle::*;
    pick(
        &[
            CU_TENSOR_MAP_SWIZZLE_NONE,
            CU_TENSOR_MAP_SWIZZLE_32B,
            CU_TENSOR_MAP_SWIZZLE_64B,
            CU_TENSOR_MAP_SWIZZLE_128B,
            CU_TENSOR_MAP_SWIZZLE_128B_ATOM_32B,
            CU_TENSOR_MAP_SWIZZLE_128B_ATOM_32B_FLIP_8B,
            CU_TENSOR_MAP_SWIZZLE_128B_ATOM_64B,
        ],
        v,
    )
}

fn l2_promotion(v: u32) -> Option<sys::CUtensorMapL2promotion> {
    use sys::CUtensorMapL2promotion::*;
    pick(
        &[
            CU_TENSOR_MAP_L2_PROMOTION_NONE,
            CU_TENSOR_MAP_L2_PROMOTION_L2_64B,
            CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
            CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
        ],
        v,
    )
}

fn oob_fill(v: u32) -> Option<sys::CUtensorMapFloatOOBfill> {
    use sys::CUtensorMapFloatOOBfill::*;
    pick(
        &[
            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
            CU_TENSOR_MAP_FLOAT_OOB_FILL_NAN_REQUEST_ZERO_FMA,
        ],
        v,
    )
}

/// Why the parameters could not be handed to the driver.
#[derive(Debug)]
pub(super) enum EncodeError {
    /// A field outside the CUDA enums (the caller skipped `TensorMapArgs::check`).
    Value(&'static str),
    /// The driver refused.
    Driver(CuError),
}

/// Encodes `map` with the driver of the current context. The caller checked the
/// parameters (`TensorMapArgs::check`) and the tensor's range.
pub(super) fn encode(map: &TensorMapArgs) -> Result<[u8; TENSOR_MAP_BYTES], EncodeError> {
    let dt = data_type(map.data_type).ok_or(EncodeError::Value("data type"))?;
    let il = interleave(map.interleave).ok_or(EncodeError::Value("interleave"))?;
    let sw = swizzle(map.swizzle).ok_or(EncodeError::Value("swizzle"))?;
    let l2 = l2_promotion(map.l2_promotion).ok_or(EncodeError::Value("L2 promotion"))?;
    let oob = oob_fill(map.oob_fill).ok_or(EncodeError::Value("OOB fill"))?;
    let least = if map.kind == tensor_map_kind::IM2COL {
        3
    } else {
        1
    };
    if map.rank < least || map.rank > vgpu_proto::MAX_TENSOR_RANK {
        return Err(EncodeError::Value("rank"));
    }
    let mut out = sys::CUtensorMap { opaque: [0; 16] };
    let addr = map.global_address as usize as *mut std::ffi::c_void;
    let rc = match map.kind {
        tensor_map_kind::TILED => {
            // SAFETY: `out` is a CUtensorMap on this frame (aligned as the type demands);
            // the arrays are this struct's, each at least `rank` (<= 5) entries long, as
            // the driver reads them; the global address is only encoded, not accessed.
            unsafe {
                sys::cuTensorMapEncodeTiled(
                    &mut out,
                    dt,
                    map.rank,
                    addr,
                    map.global_dim.as_ptr(),
                    map.global_strides.as_ptr(),
                    map.box_dim.as_ptr(),
                    map.element_strides.as_ptr(),
                    il,
                    sw,
                    l2,
                    oob,
                )
            }
        }
        tensor_map_kind::IM2COL => {
            // SAFETY: as above; the corner arrays hold 3 (>= rank - 2) entries each.
            unsafe {
                sys::cuTensorMapEncodeIm2col(
                    &mut out,
                    dt,
                    map.rank,
                    addr,
                    map.global_dim.as_ptr(),
                    map.global_strides.as_ptr(),
                    map.pixel_box_lower.as_ptr(),
                    map.pixel_box_upper.as_ptr(),
                    map.channels_per_pixel,
                    map.pixels_per_column,
                    map.element_strides.as_ptr(),
                    il,
                    sw,
                    l2,
                    oob,
                )
            }
        }
        _ => return Err(EncodeError::Value("kind")),
    };
    let call = if map.kind == tensor_map_kind::TILED {
        "cuTensorMapEncodeTiled"
    } else {
        "cuTensorMapEncodeIm2col"
    };
    check(rc, call).map_err(EncodeError::Driver)?;
    let mut bytes = [0u8; TENSOR_MAP_BYTES];
    for (chunk, word) in bytes.chunks_exact_mut(8).zip(out.opaque.iter()) {
        chunk.copy_from_slice(&word.to_le_bytes());
    }
    Ok(bytes)
}
