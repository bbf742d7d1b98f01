//! Context limits. The worker sets the context's stack, heap and printf FIFO limits when
//! it starts and charges what they reserve to the vGPU's memory share (docs/cuda.md,
//! "Context reserve"); it reports them in `GET_ATTRIBUTES`. `cuCtxGetLimit` answers
//! them (or the lower value a program set); `cuCtxSetLimit` takes a value up to the
//! charged one (the reserve already covers it) and refuses a larger one with
//! `CUDA_ERROR_OUT_OF_MEMORY`, since the share holds no more for it. A device without
//! such limits (sim) and the limits a vGPU does not offer (device runtime, CIG, L2 fetch
//! granularity) answer `CUDA_ERROR_UNSUPPORTED_LIMIT`; persisting L2 cache is 0 and
//! stays 0.

use std::ffi::c_int;

use crate::driver::{self, Driver, Res};
use crate::types::{res, CUresult};
use crate::{guard, out};

/// `CUlimit` values.
const STACK_SIZE: c_int = 0;
const PRINTF_FIFO_SIZE: c_int = 1;
const MALLOC_HEAP_SIZE: c_int = 2;
const PERSISTING_L2_CACHE_SIZE: c_int = 6;
/// One past the last limit CUDA 13.0 defines.
const LIMIT_MAX: c_int = 10;

/// The charged value of limit 0 to 2, if the device reports it.
fn charged(d: &Driver, limit: c_int) -> Option<u64> {
    let g = &d.attributes;
    let v = match limit {
        STACK_SIZE => u64::from(g.stack_bytes),
        PRINTF_FIFO_SIZE => u64::from(g.printf_fifo_kib) << 10,
        MALLOC_HEAP_SIZE => u64::from(g.heap_kib) << 10,
        _ => 0,
    };
    (v > 0).then_some(v)
}

fn get(d: &Driver, limit: c_int) -> Res<u64> {
    d.current_ctx()?;
    match limit {
        STACK_SIZE | PRINTF_FIFO_SIZE | MALLOC_HEAP_SIZE => {
            let c = charged(d, limit).ok_or(res::UNSUPPORTED_LIMIT)?;
            Ok(d.extra.limits[limit as usize].unwrap_or(c).min(c))
        }
        PERSISTING_L2_CACHE_SIZE => Ok(0),
        l if (0..LIMIT_MAX).contains(&l) => Err(res::UNSUPPORTED_LIMIT),
        _ => Err(res::INVALID_VALUE),
    }
}

fn set(d: &mut Driver, limit: c_int, value: u64) -> Res<()> {
    d.current_ctx()?;
    match limit {
        STACK_SIZE | PRINTF_FIFO_SIZE | MALLOC_HEAP_SIZE => {
            let c = charged(d, limit).ok_or(res::UNSUPPORTED_LIMIT)?;
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
            d.extra.limits[limit as usize] = Some(value);
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
        let v = driver::with(|d| get(d, limit))?;
        // SAFETY: checked non-null; a writable size_t from the caller.
        unsafe { out(pvalue, v as usize) }
    })
}

#[no_mangle]
pub extern "C" fn cuCtxSetLimit(limit: c_int, value: usize) -> CUresult {
    guard("cuCtxSetLimit", || {
        driver::with(|d| set(d, limit, value as u64))
    })
}
