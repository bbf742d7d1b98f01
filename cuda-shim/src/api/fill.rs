//! Small asynchronous memsets as launches of the device's built-in `fill` kernel.
//!
//! A `MEMSET` request is served by the worker on its own: the kernels posted before it
//! end first, then the memset runs, then the launches behind it are taken. A program that
//! clears a few bytes before each kernel (cuBLASLt clears 4 bytes of its workspace before
//! every GEMM) would leave the GPU idle between its kernels for that hand-over, about
//! 28 µs per kernel on the H200. As a launch, the memset joins its neighbours' batch and
//! the GPU goes from one kernel to the next as it does natively. The kernel writes whole
//! 32-bit words, so a memset that starts on a word and covers whole words, up to
//! [`FILL_MAX_BYTES`], inside one device allocation, from a thread with a current
//! context, goes this way; any other stays a `MEMSET` request. The device
//! checks the launch as any other: `dst` and the words it writes must lie in one
//! allocation. Its time is charged as compute (docs/cuda-api.md, "How they map onto the
//! vGPU").

use std::ffi::{c_uint, c_void};

use crate::driver::{Driver, Res};
use crate::image::Image;

/// Largest memset run as a `fill` launch: one the worker would serve in microseconds.
pub const FILL_MAX_BYTES: u64 = 64 << 10;
/// Threads per block of a fill launch.
const FILL_BLOCK: u64 = 256;

/// The library's handle of the built-in `fill` kernel, loaded on first use (and again
/// if the program unloaded the module behind it).
fn fill_function(d: &mut Driver) -> Res<u64> {
    if let Some(f) = d.extra.fill_kernel.filter(|f| d.functions.contains_key(f)) {
        return Ok(f);
    }
    let module = super::module::load_image(d, Image::Builtin)?;
    let f = d.handle();
    super::module::enter_function(d, module, vgpu_proto::builtin::FILL.name, f)?;
    d.extra.fill_kernel = Some(f);
    Ok(f)
}

/// The 32-bit word that repeats `value`, an element of `elem` bytes (1, 2 or 4).
fn word(value: u32, elem: u32) -> u32 {
    match elem {
        1 => (value & 0xff) * 0x0101_0101,
        2 => (value & 0xffff) * 0x0001_0001,
        _ => value,
    }
}

/// Enqueues the memset of `bytes` bytes at `dst` (elements of `elem` bytes of `value`)
/// on queue `queue`, which the caller ordered for it, as a `fill` launch, when it is one
/// (see the module's docs). Returns whether it did; `false` leaves the memset to the
/// caller.
pub(crate) fn try_fill(
    d: &mut Driver,
    dst: u64,
    value: u32,
    bytes: u64,
    elem: u32,
    queue: usize,
) -> Res<bool> {
    if dst % 4 != 0 || bytes % 4 != 0 || bytes == 0 || bytes > FILL_MAX_BYTES {
        return Ok(false);
    }
    // Device memory only: pinned host memory the GPU reaches (`cuMemHostAlloc`'s mapped
    // memory) and module variables stay with the device's memset.
    let inside = d.alloc_of(dst).is_some_and(|(base, a)| {
        a.module == 0
            && dst
                .checked_add(bytes)
                .is_some_and(|end| end <= base + a.size)
    });
    if !inside {
        return Ok(false);
    }
    // A launch needs a current context; a memset on a created stream does not (it runs
    // in the stream's), and goes to the device as such from a thread without one.
    if d.current_ctx().is_err() {
        return Ok(false);
    }
    let f = match fill_function(d) {
        Ok(f) => f,
        Err(code) => {
            tracing::debug!(
                code,
                "no built-in fill kernel: memsets go to the device as such"
            );
            return Ok(false);
        }
    };
    let mut dst = dst;
    let mut value = word(value, elem);
    let mut n = bytes / 4;
    let mut params: [*mut c_void; 3] = [
        (&mut dst as *mut u64).cast(),
        (&mut value as *mut u32).cast(),
        (&mut n as *mut u64).cast(),
    ];
    // At most FILL_MAX_BYTES / 4 / FILL_BLOCK = 64 blocks.
    let grid = n.div_ceil(FILL_BLOCK) as c_uint;
    let p = super::launch::prepare(
        d,
        f as crate::types::CUfunction,
        [grid, 1, 1],
        [FILL_BLOCK as c_uint, 1, 1],
        0,
        params.as_mut_ptr(),
        std::ptr::null_mut(),
    )?;
    super::launch::post(d, queue, &p)?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::word;

    #[test]
    fn a_memset_value_repeats_over_a_word() {
        assert_eq!(word(0xab, 1), 0xabab_abab);
        assert_eq!(word(0x1ab, 1), 0xabab_abab);
        assert_eq!(word(0x1234, 2), 0x1234_1234);
        assert_eq!(word(0x5_1234, 2), 0x1234_1234);
        assert_eq!(word(0xdead_beef, 4), 0xdead_beef);
        assert_eq!(word(0, 1), 0);
    }
}
