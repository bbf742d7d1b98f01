//! `cuLaunchKernel`: grid and block checked as the real driver checks them, parameters
//! laid out from the function's signature (the PTX `.entry` list, or the built-in's),
//! from `kernelParams` or from `extra`'s parameter buffer; the launch is enqueued and the
//! call returns. By-value parameters over 8 bytes (structs) travel in the launch's
//! parameter blob on a device with `features::PARAM_BLOBS`.

use std::ffi::{c_uint, c_void};

use vgpu_proto::{
    KernelArg, LaunchArgs, MAX_PARAM_BLOB_BYTES, MAX_SHARED_BYTES, MAX_THREADS_PER_BLOCK,
};

use guest_driver::Transport;

use crate::driver::{self, Driver, Res};
use crate::extra::{Op, PreparedLaunch};
use crate::guard;
use crate::image::{buffer_layout, kernel_arg, ParamKind, ParamSpec, Signature};
use crate::types::{
    res, CUfunction, CUresult, CUstream, CU_LAUNCH_PARAM_BUFFER_POINTER,
    CU_LAUNCH_PARAM_BUFFER_SIZE, CU_LAUNCH_PARAM_END,
};

/// Where the parameter bytes come from.
enum Params {
    /// `kernelParams`: one pointer per parameter.
    Pointers(*mut *mut c_void),
    /// `extra`'s buffer and its size.
    Buffer(*const u8, usize),
}

/// Reads `extra`: BUFFER_POINTER, BUFFER_SIZE, END.
///
/// # Safety
/// `extra` must be a CU_LAUNCH_PARAM_END-terminated array of (key, value) pointers.
unsafe fn parse_extra(extra: *mut *mut c_void) -> Res<Params> {
    let mut buf: *const u8 = std::ptr::null();
    let mut size: Option<usize> = None;
    let mut i = 0;
    loop {
        // SAFETY: the array is END-terminated (caller's contract); we stop at END.
        let key = unsafe { *extra.add(i) } as usize;
        if key == CU_LAUNCH_PARAM_END {
            break;
        }
        // SAFETY: every key but END is followed by its value.
        let value = unsafe { *extra.add(i + 1) };
        match key {
            CU_LAUNCH_PARAM_BUFFER_POINTER => buf = value.cast(),
            CU_LAUNCH_PARAM_BUFFER_SIZE => {
                if value.is_null() {
                    return Err(res::INVALID_VALUE);
                }
                // SAFETY: BUFFER_SIZE's value points to a size_t (API contract).
                size = Some(unsafe { value.cast::<usize>().read_unaligned() });
            }
            _ => return Err(res::INVALID_VALUE),
        }
        i += 2;
        if i > 64 {
            return Err(res::INVALID_VALUE);
        }
    }
    match (buf.is_null(), size) {
        (false, Some(n)) => Ok(Params::Buffer(buf, n)),
        _ => Err(res::INVALID_VALUE),
    }
}

/// The kernel arguments and the parameter blob their `Blob` ones point into.
struct Packed {
    args: Vec<KernelArg>,
    blob: Vec<u8>,
}

/// The wire argument for parameter `p` (its bytes `bytes`): a struct over 8 bytes goes
/// into `blob` when the device takes blobs.
fn pack_one(
    p: &ParamSpec,
    bytes: &[u8],
    blobs: bool,
    blob: &mut Vec<u8>,
    is_ptr: impl Fn(u64) -> bool,
) -> Res<KernelArg> {
    if blobs && p.kind == ParamKind::Bytes {
        let offset = u32::try_from(blob.len()).map_err(|_| res::INVALID_VALUE)?;
        let len = u32::try_from(bytes.len()).map_err(|_| res::INVALID_VALUE)?;
        if offset.saturating_add(len) > MAX_PARAM_BLOB_BYTES {
            crate::api::stubs::log_once("by-value kernel parameters over 4 KiB in all");
            return Err(res::NOT_SUPPORTED);
        }
        blob.extend_from_slice(bytes);
        return KernelArg::blob(offset, len).ok_or(res::INVALID_VALUE);
    }
    kernel_arg(p, bytes, is_ptr)
}

fn args(d: &Driver, sig: &Signature, params: Params) -> Res<Packed> {
    let is_ptr = |v: u64| d.alloc_of(v).is_some();
    let blobs = d.info.features & vgpu_proto::features::PARAM_BLOBS != 0;
    let mut blob = Vec::new();
    let args = match params {
        Params::Pointers(pp) => {
            if pp.is_null() && !sig.is_empty() {
                return Err(res::INVALID_VALUE);
            }
            sig.iter()
                .enumerate()
                .map(|(i, p)| {
                    // SAFETY: kernelParams holds one pointer per parameter (API contract).
                    let at = unsafe { *pp.add(i) }.cast::<u8>();
                    if at.is_null() {
                        return Err(res::INVALID_VALUE);
                    }
                    // SAFETY: each parameter pointer addresses a value of the parameter's size.
                    let bytes = unsafe { std::slice::from_raw_parts(at, p.size) };
                    pack_one(p, bytes, blobs, &mut blob, is_ptr)
                })
                .collect::<Res<Vec<_>>>()?
        }
        Params::Buffer(buf, size) => {
            let (need, offs) = buffer_layout(sig);
            if size < need {
                return Err(res::INVALID_VALUE);
            }
            // SAFETY: the buffer holds `size` bytes (API contract), at least `need`.
            let bytes = unsafe { std::slice::from_raw_parts(buf, need) };
            sig.iter()
                .zip(offs)
                .map(|(p, o)| pack_one(p, &bytes[o..o + p.size], blobs, &mut blob, is_ptr))
                .collect::<Res<Vec<_>>>()?
        }
    };
    Ok(Packed { args, blob })
}

/// Checks a launch and packs its parameters (copied from the caller's: the result may be
/// kept, by a stream capture, and replayed later).
#[allow(clippy::too_many_arguments)]
pub(crate) fn prepare(
    d: &mut Driver,
    f: CUfunction,
    grid: [c_uint; 3],
    block: [c_uint; 3],
    shared: c_uint,
    kernel_params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> Res<PreparedLaunch> {
    d.current_ctx()?;
    super::library::resolve(d, f as u64)?;
    let d = &*d;
    let func = super::func::lookup(d, f)?;
    if grid.contains(&0) || block.contains(&0) {
        return Err(res::INVALID_VALUE);
    }
    let threads = block.iter().map(|&b| u64::from(b)).product::<u64>();
    if threads > MAX_THREADS_PER_BLOCK || block[0] > 1024 || block[1] > 1024 || block[2] > 64 {
        return Err(res::INVALID_VALUE);
    }
    if grid[1] > 65535 || grid[2] > 65535 || grid[0] > i32::MAX as u32 {
        return Err(res::INVALID_VALUE);
    }
    if shared > MAX_SHARED_BYTES {
        return Err(res::INVALID_VALUE);
    }
    let params = match (kernel_params.is_null(), extra.is_null()) {
        (false, false) => return Err(res::INVALID_VALUE),
        (_, false) => {
            // SAFETY: `extra` is END-terminated (API contract).
            unsafe { parse_extra(extra)? }
        }
        _ => Params::Pointers(kernel_params),
    };
    let packed = args(d, &func.sig, params)?;
    let cluster = func.cluster.launch_dims();
    check_cluster(d, grid, cluster)?;
    Ok(PreparedLaunch {
        device_function: func.device,
        grid,
        block,
        shared_bytes: shared,
        cluster,
        args: packed.args,
        blob: packed.blob,
    })
}

/// Checks a launch's thread block clusters (`[1, 1, 1]`: none): the vGPU must run clusters
/// (`features::CLUSTERS`, else NOT_SUPPORTED as on a GPU without them), the cluster hold
/// at most 16 blocks and the grid be a whole number of clusters (INVALID_VALUE, as the
/// driver answers either).
fn check_cluster(d: &Driver, grid: [c_uint; 3], cluster: [c_uint; 3]) -> Res<()> {
    if cluster == [1, 1, 1] {
        return Ok(());
    }
    if d.info.features & vgpu_proto::features::CLUSTERS == 0 {
        crate::api::stubs::log_once("thread block clusters on this vGPU");
        return Err(res::NOT_SUPPORTED);
    }
    let checked = LaunchArgs {
        grid,
        flags: LaunchArgs::cluster_flags(cluster),
        ..LaunchArgs::default()
    };
    if cluster.iter().any(|&x| x > 255) || checked.cluster() != Ok(cluster) {
        return Err(res::INVALID_VALUE);
    }
    Ok(())
}

/// Enqueues a prepared launch on stream handle `h`, ordered as the legacy default stream
/// demands.
pub(crate) fn submit(d: &mut Driver, h: usize, p: &PreparedLaunch) -> Res<()> {
    let q = d.ordered_queue(h)?;
    post(d, q, p)
}

/// Enqueues a prepared launch on queue `q`, already ordered for it.
pub(crate) fn post(d: &mut Driver, q: usize, p: &PreparedLaunch) -> Res<()> {
    let launch = LaunchArgs {
        function: p.device_function,
        grid: p.grid,
        block: p.block,
        shared_bytes: p.shared_bytes,
        flags: LaunchArgs::cluster_flags(p.cluster),
        ..LaunchArgs::default()
    };
    let t = d.t.clone();
    let mut queue = d.queue(q)?;
    let request = vgpu_proto::launch_request_len(p.args.len(), 0) + p.blob.len();
    // A launch too large for its slot's header area travels in DMA memory of its own,
    // freed when it completes.
    let own_header = if request > guest_driver::vgpu::HEADER_MAX {
        Some(t.dma_alloc(request, 64).map_err(|_| res::OUT_OF_MEMORY)?)
    } else {
        None
    };
    if own_header.is_some() {
        queue.enqueue_keeping(
            &t,
            |s, header| match header {
                // SAFETY: the queue keeps the region until the request completed.
                Some(hd) => unsafe { s.enqueue_launch_in(hd, &launch, &p.args, &[], &p.blob) },
                None => Err(guest_driver::Error::RequestTooLarge),
            },
            own_header,
        )?;
    } else if p.blob.is_empty() {
        queue.enqueue(&t, |s| s.enqueue_launch(&launch, &p.args, &[]), None)?;
    } else {
        queue.enqueue(
            &t,
            |s| s.enqueue_launch_with_blob(&launch, &p.args, &[], &p.blob),
            None,
        )?;
    }
    queue.submit();
    Ok(())
}

/// A launch in thread block clusters of `cluster` blocks as `cuLaunchKernelEx` asks
/// (`[1, 1, 1]`: the function's own cluster, if the program set one; see
/// [`check_cluster`]).
#[allow(clippy::too_many_arguments)]
pub(crate) fn launch(
    f: CUfunction,
    grid: [c_uint; 3],
    block: [c_uint; 3],
    shared: c_uint,
    stream: CUstream,
    kernel_params: *mut *mut c_void,
    extra: *mut *mut c_void,
    cluster: [c_uint; 3],
) -> Res<()> {
    driver::with(|d| {
        let mut p = prepare(d, f, grid, block, shared, kernel_params, extra)?;
        if cluster != [1, 1, 1] {
            check_cluster(d, grid, cluster)?;
            p.cluster = cluster;
        }
        let h = stream as usize;
        d.stream_queue(h)?;
        if crate::api::graph::record(d, h, || Op::Launch(p.clone()))? {
            return Ok(());
        }
        submit(d, h, &p)
    })
}

#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn cuLaunchKernel(
    f: CUfunction,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    shared: c_uint,
    stream: CUstream,
    kernel_params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    guard("cuLaunchKernel", || {
        launch(
            f,
            [gx, gy, gz],
            [bx, by, bz],
            shared,
            stream,
            kernel_params,
            extra,
            [1, 1, 1],
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use vgpu_proto::{ArgKind, ArgValue};

    fn bytes_param(size: usize) -> ParamSpec {
        ParamSpec {
            kind: ParamKind::Bytes,
            size,
            align: 8,
        }
    }

    #[test]
    fn structs_over_eight_bytes_go_into_the_blob() {
        let mut blob = Vec::new();
        let s24 = [3u8; 24];
        let v64 = [4u8; 64];
        let a = pack_one(&bytes_param(24), &s24, true, &mut blob, |_| false).expect("24");
        let b = pack_one(&bytes_param(64), &v64, true, &mut blob, |_| false).expect("64");
        assert_eq!(a.typed(), Ok(ArgValue::Blob { offset: 0, len: 24 }));
        assert_eq!(
            b.typed(),
            Ok(ArgValue::Blob {
                offset: 24,
                len: 64
            })
        );
        assert_eq!(blob.len(), 88);
        assert_eq!(&blob[24..], &v64);
        // A device without blobs: not supported, as before.
        let mut none = Vec::new();
        assert_eq!(
            pack_one(&bytes_param(24), &s24, false, &mut none, |_| false),
            Err(res::NOT_SUPPORTED)
        );
        // Past 4 KiB in all.
        let big = vec![0u8; 4096];
        assert_eq!(
            pack_one(&bytes_param(4096), &big, true, &mut blob, |_| false),
            Err(res::NOT_SUPPORTED)
        );
        // Other kinds are untouched.
        let word = ParamSpec {
            kind: ParamKind::U64,
            size: 8,
            align: 8,
        };
        let w = pack_one(&word, &7u64.to_le_bytes(), true, &mut blob, |_| false).expect("u64");
        assert_eq!(w.kind, ArgKind::U64 as u32);
        assert_eq!(blob.len(), 88);
    }
}
