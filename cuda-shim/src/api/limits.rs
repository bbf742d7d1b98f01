//! Context limits. The worker sets the context's stack, heap and printf FIFO limits when
//! it starts and charges what they reserve to the vGPU's memory share (docs/cuda.md,
//! "Context reserve"); it reports them in `GET_ATTRIBUTES`. `cuCtxGetLimit` answers
//! them (or the lower value a program set); `cuCtxSetLimit` takes a value up to the
//! charged one (the reserve already covers it) and refuses a larger one with
//! `CUDA_ERROR_OUT_OF_MEMORY`, since the share holds no more for it. A device without
//! such limits (sim) and the device runtime's sync depth answer
//! `CUDA_ERROR_UNSUPPORTED_LIMIT`, as the driver does for the latter. The read-only limits
//! answer what the driver answers for a context of this GPU, and may be set to that value
//! only: the device runtime's pending launches (2048), the L2 fetch granularity (64
//! bytes), the shared memory a kernel may use (the device's opt-in maximum per block;
//! cuBLASLt asks it and refuses the GPU without it), CIG (0: not a CIG context);
//! persisting L2 cache is 0 and stays 0.

use std::ffi::c_int;

use vgpu_proto::DeviceAttributes;

use crate::driver::{self, Res};
use crate::types::{res, CUresult};
use crate::{guard, out};

/// `CUlimit` values.
const STACK_SIZE: c_int = 0;
const PRINTF_FIFO_SIZE: c_int = 1;
const MALLOC_HEAP_SIZE: c_int = 2;
const PERSISTING_L2_CACHE_SIZE: c_int = 6;
const DEV_RUNTIME_PENDING_LAUNCH_COUNT: c_int = 4;
const MAX_L2_FETCH_GRANULARITY: c_int = 5;
const SHMEM_SIZE: c_int = 7;
const CIG_ENABLED: c_int = 8;
/// One past the last limit CUDA 13.0 defines.
const LIMIT_MAX: c_int = 10;

/// Limits 0 to 2 as a program lowered them.
type Lowered = [Option<u64>; 3];

/// The charged value of limit 0 to 2, if the device reports it.
fn charged(g: &DeviceAttributes, limit: c_int) -> Option<u64> {
    let v = match limit {
        STACK_SIZE => u64::from(g.stack_bytes),
        PRINTF_FIFO_SIZE => u64::from(g.printf_fifo_kib) << 10,
        MALLOC_HEAP_SIZE => u64::from(g.heap_kib) << 10,
        _ => 0,
    };
    (v > 0).then_some(v)
}

/// The value of a limit this library answers but does not let a program change.
fn fixed(g: &DeviceAttributes, limit: c_int) -> Option<u64> {
    match limit {
        DEV_RUNTIME_PENDING_LAUNCH_COUNT => Some(2048),
        MAX_L2_FETCH_GRANULARITY => Some(64),
        SHMEM_SIZE => Some(u64::from(
            g.max_shared_per_block_optin
                .min(vgpu_proto::MAX_SHARED_BYTES),
        )),
        CIG_ENABLED => Some(0),
        _ => None,
    }
}

fn get(g: &DeviceAttributes, lowered: &Lowered, limit: c_int) -> Res<u64> {
    if let Some(v) = fixed(g, limit) {
        return Ok(v);
    }
    match limit {
        STACK_SIZE | PRINTF_FIFO_SIZE | MALLOC_HEAP_SIZE => {
            let c = charged(g, limit).ok_or(res::UNSUPPORTED_LIMIT)?;
            Ok(lowered[limit as usize].unwrap_or(c).min(c))
        }
        PERSISTING_L2_CACHE_SIZE => Ok(0),
        l if (0..LIMIT_MAX).contains(&l) => Err(res::UNSUPPORTED_LIMIT),
        _ => Err(res::INVALID_VALUE),
    }
}

fn set(g: &DeviceAttributes, lowered: &mut Lowered, limit: c_int, value: u64) -> Res<()> {
    if let Some(v) = fixed(g, limit) {
        return if value == v {
            Ok(())
        } else {
            Err(res::UNSUPPORTED_LIMIT)
        };
    }
    match limit {
        STACK_SIZE | PRINTF_FIFO_SIZE | MALLOC_HEAP_SIZE => {
            let c = charged(g, limit).ok_or(res::UNSUPPORTED_LIMIT)?;
            if value > c {
                tracing::warn!(
                    limit,
                    asked = value,
                    charged = c,
                    "cuCtxSetLimit above what this vGPU's context reserve holds: ask the \
                     operator for a larger limit (vgpu-worker --cuda-stack, --cuda-heap, \
                     --cuda-printf-fifo)"
                );
                return Err(res::OUT_OF_MEMORY);
            }
            lowered[limit as usize] = Some(value);
            Ok(())
        }
        PERSISTING_L2_CACHE_SIZE if value == 0 => Ok(()),
        l if (0..LIMIT_MAX).contains(&l) => Err(res::UNSUPPORTED_LIMIT),
        _ => Err(res::INVALID_VALUE),
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxGetLimit(pvalue: *mut usize, limit: c_int) -> CUresult {
    guard("cuCtxGetLimit", || {
        if pvalue.is_null() {
            return Err(res::INVALID_VALUE);
        }
        let v = driver::with(|d| {
            d.current_ctx()?;
            get(&d.attributes, &d.extra.limits, limit)
        })?;
        // SAFETY: checked non-null; a writable size_t from the caller.
        unsafe { out(pvalue, v as usize) }
    })
}

#[no_mangle]
pub extern "C" fn cuCtxSetLimit(limit: c_int, value: usize) -> CUresult {
    guard("cuCtxSetLimit", || {
        driver::with(|d| {
            d.current_ctx()?;
            let g = d.attributes;
            set(&g, &mut d.extra.limits, limit, value as u64)
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_are_the_charged_ones_and_only_lowered() {
        let cuda = DeviceAttributes {
            stack_bytes: 1024,
            heap_kib: 8 << 10,
            printf_fifo_kib: 1 << 10,
            ..DeviceAttributes::SIM
        };
        let mut lowered = Lowered::default();
        assert_eq!(get(&cuda, &lowered, STACK_SIZE), Ok(1024));
        assert_eq!(get(&cuda, &lowered, MALLOC_HEAP_SIZE), Ok(8 << 20));
        assert_eq!(get(&cuda, &lowered, PRINTF_FIFO_SIZE), Ok(1 << 20));
        // Up to the charged value: taken (the reserve covers it) and answered.
        assert_eq!(set(&cuda, &mut lowered, STACK_SIZE, 512), Ok(()));
        assert_eq!(get(&cuda, &lowered, STACK_SIZE), Ok(512));
        assert_eq!(set(&cuda, &mut lowered, STACK_SIZE, 1024), Ok(()));
        assert_eq!(get(&cuda, &lowered, STACK_SIZE), Ok(1024));
        // Above it: the share holds no more.
        assert_eq!(
            set(&cuda, &mut lowered, STACK_SIZE, 4096),
            Err(res::OUT_OF_MEMORY)
        );
        assert_eq!(
            set(&cuda, &mut lowered, MALLOC_HEAP_SIZE, 1 << 30),
            Err(res::OUT_OF_MEMORY)
        );
        assert_eq!(get(&cuda, &lowered, STACK_SIZE), Ok(1024));
        // Limits a vGPU does not offer, and numbers outside the enum.
        assert_eq!(get(&cuda, &lowered, 3), Err(res::UNSUPPORTED_LIMIT));
        assert_eq!(set(&cuda, &mut lowered, 4, 1), Err(res::UNSUPPORTED_LIMIT));
        // The read-only limits answer the driver's values and take only those.
        assert_eq!(get(&cuda, &lowered, 4), Ok(2048));
        assert_eq!(get(&cuda, &lowered, MAX_L2_FETCH_GRANULARITY), Ok(64));
        assert_eq!(get(&cuda, &lowered, SHMEM_SIZE), Ok(227 << 10));
        assert_eq!(get(&cuda, &lowered, CIG_ENABLED), Ok(0));
        assert_eq!(
            set(&cuda, &mut lowered, MAX_L2_FETCH_GRANULARITY, 64),
            Ok(())
        );
        assert_eq!(
            set(&cuda, &mut lowered, MAX_L2_FETCH_GRANULARITY, 128),
            Err(res::UNSUPPORTED_LIMIT)
        );
        assert_eq!(get(&cuda, &lowered, 9), Err(res::UNSUPPORTED_LIMIT));
        assert_eq!(get(&cuda, &lowered, PERSISTING_L2_CACHE_SIZE), Ok(0));
        assert_eq!(
            set(&cuda, &mut lowered, PERSISTING_L2_CACHE_SIZE, 1),
            Err(res::UNSUPPORTED_LIMIT)
        );
        assert_eq!(get(&cuda, &lowered, 10), Err(res::INVALID_VALUE));
        assert_eq!(get(&cuda, &lowered, -1), Err(res::INVALID_VALUE));
        // A device that reports none (sim, or before protocol 1.3).
        let sim = DeviceAttributes::SIM;
        assert_eq!(get(&sim, &lowered, STACK_SIZE), Err(res::UNSUPPORTED_LIMIT));
        assert_eq!(
            set(&sim, &mut lowered, STACK_SIZE, 1),
            Err(res::UNSUPPORTED_LIMIT)
        );
    }
}
