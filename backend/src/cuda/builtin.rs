//! The built-in kernels on the GPU: argument checks (the same as the sim backend's: kinds,
//! access modes, and every pointer's extent inside one live allocation of this vGPU,
//! aligned to its element), then the launch of the shipped PTX (`backend/kernels/builtin.cu`),
//! timed on the host when it runs alone (`lanes::host_ns`).

use std::ffi::c_void;
use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::sys;
use vgpu_proto::builtin::{self, KernelSig};
use vgpu_proto::ArgValue;

use super::driver::{check, CuError, Event, Stream};
use super::lanes::{host_ns, Lane};
use super::memory::Allocation;
use super::modules::{Func, Held};
use super::CudaGpu;
use crate::args::{check_args, int, ptr, word};
use crate::error::{BackendError, Result};

/// Threads per block of the element-wise kernels.
const BLOCK: u32 = 256;
/// Blocks per multiprocessor the element-wise kernels' grids stop at (grid-stride loops do
/// the rest).
const BLOCKS_PER_SM: u64 = 32;
/// reduce_sum's block of elements (docs/protocol.md).
const REDUCE_BLOCK: u64 = 65536;

/// Grid of `BLOCK`-thread blocks for `work` independent items.
fn grid_for(work: u64, sm_count: u32) -> u32 {
    let cap = u64::from(sm_count.max(1)) * BLOCKS_PER_SM;
    u32::try_from(work.div_ceil(u64::from(BLOCK)).clamp(1, cap)).unwrap_or(1)
}

/// One launch: function, grid, block, parameter values (each passed by address; 4-byte
/// parameters read the low half of their u64 on this little-endian host).
struct Step {
    func: Func,
    grid: u32,
    block: u32,
    params: [u64; 6],
    count: usize,
}

impl Step {
    fn new(func: Func, grid: u32, block: u32, params: &[u64]) -> Self {
        let mut p = [0u64; 6];
        for (d, s) in p.iter_mut().zip(params) {
            *d = *s;
        }
        Self {
            func,
            grid,
            block,
            params: p,
            count: params.len().min(6),
        }
    }

    fn enqueue(&mut self, stream: &Stream) -> std::result::Result<(), CuError> {
        launch_on(
            self.func,
            self.grid,
            self.block,
            stream,
            &mut self.params[..self.count],
        )
    }
}

/// Most parameters of a shipped kernel (storage_bfs's level kernel has 7).
const MAX_PARAMS: usize = 8;

/// Launches `func` on `lane`'s stream with `grid` x `block` threads and 8-byte parameter
/// values (4-byte parameters read the low half on this little-endian host).
///
/// The caller guarantees `func` is a live entry point of a module it keeps loaded, whose
/// parameter list `params` matches, and that every device pointer among them was checked
/// against the vGPU's allocations and stays mapped until the stream is synchronised.
pub(super) fn launch_u64(
    func: Func,
    grid: u32,
    block: u32,
    lane: &Lane,
    params: &mut [u64],
) -> std::result::Result<(), CuError> {
    launch_on(func, grid, block, &lane.stream, params)
}

/// [`launch_u64`] on `stream` (same contract).
fn launch_on(
    func: Func,
    grid: u32,
    block: u32,
    stream: &Stream,
    params: &mut [u64],
) -> std::result::Result<(), CuError> {
    // On the stack: this is on every launch's path.
    let mut ptrs = [std::ptr::null_mut::<c_void>(); MAX_PARAMS];
    if params.len() > MAX_PARAMS {
        return Err(CuError {
            code: sys::CUresult::CUDA_ERROR_INVALID_VALUE,
            call: "cuLaunchKernel",
        });
    }
    for (p, v) in ptrs.iter_mut().zip(params.iter_mut()) {
        *p = (v as *mut u64).cast();
    }
    check(
        // SAFETY: `func` is live and `ptrs` holds one pointer per parameter of its list,
        // to values that outlive the call (the driver copies them before returning); the
        // pointers' targets are checked and kept mapped by the caller (contract above).
        unsafe {
            sys::cuLaunchKernel(
                func.0,
                grid,
                1,
                1,
                block,
                1,
                1,
                0,
                stream.raw(),
                ptrs.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        },
        "cuLaunchKernel",
    )
}

/// A checked built-in launch: its kernel launches, the allocations they touch (kept mapped
/// until they have finished), and gather's fault word (scratch) with its index array.
pub(super) struct Prepared {
    steps: [Option<Step>; 2],
    keep: [Option<Arc<Allocation>>; 3],
    fault: Option<(u64, u64)>,
}

/// Whether built-in `sig` can run in a batch: it takes none of the lane's scratch memory
/// and needs no look at the device after it ran (reduce_sum and gather do both).
pub(super) fn batchable(sig: &KernelSig) -> bool {
    sig.name != builtin::REDUCE_SUM.name && sig.name != builtin::GATHER.name
}

/// The most 32-bit words a `fill` writes and still rides along with the kernels before it
/// in a batch (a runtime library's small memset: 64 KiB, the CUDA library's own bound).
pub(super) const RIDER_WORDS: u64 = 16 * 1024;

/// Whether built-in launch `sig(args)` rides along with the batch's open run instead of
/// starting a run of its own: a small `fill`. It records no timing event: its time is the
/// run's, and the run's fault is its fault.
pub(super) fn rides_along(sig: &KernelSig, args: &[ArgValue]) -> bool {
    sig.name == builtin::FILL.name && int(args, 2) <= RIDER_WORDS
}

impl CudaGpu {
    /// A pointer argument checked like the sim backend: `count` elements of `elem` bytes at
    /// `addr` inside one live allocation or one device-mapped host region, `addr` aligned
    /// to `elem`. The Arc keeps an allocation mapped while the kernel runs (a device-mapped
    /// region stays while the vGPU lives: `None`).
    pub(super) fn extent(
        &self,
        addr: u64,
        count: u64,
        elem: u64,
    ) -> Result<Option<Arc<Allocation>>> {
        let len = count.checked_mul(elem).ok_or(BackendError::BadPointer {
            addr,
            len: u64::MAX,
        })?;
        let a = match self.mem.resolve(addr, len) {
            Ok((a, _)) => Some(a),
            Err(_) if self.pinned.device_covers(addr, len) => None,
            Err(e) => return Err(e),
        };
        if addr % elem != 0 {
            return Err(BackendError::Misaligned { addr, align: elem });
        }
        Ok(a)
    }

    /// Runs built-in kernel `sig` (index `index` of `KERNELS`) on `lane`; returns its time
    /// on the GPU in ns as the host saw it ([`host_ns`]).
    pub(super) fn run_builtin(
        &self,
        lane: &mut Lane,
        sig: &'static KernelSig,
        index: usize,
        args: &[ArgValue],
    ) -> Result<u64> {
        let name = sig.name;
        let Prepared {
            mut steps,
            keep,
            fault,
        } = self.prepare_builtin(lane, sig, index, args)?;
        let t = Instant::now();
        for step in steps.iter_mut().flatten() {
            step.enqueue(&lane.stream)
                .map_err(|e| self.launch_err(e, name))?;
        }
        lane.stream
            .synchronize()
            .map_err(|e| self.kernel_err(e, name))?;
        let ns = host_ns(t);
        drop(keep);
        if let Some((fault, idx_addr)) = fault {
            let at = self.read_u64(lane, fault)?;
            if at != u64::MAX {
                let (a, off) = self.mem.resolve(idx_addr.saturating_add(at * 4), 4)?;
                let bad = self.read_u32(lane, a.addr() + off)?;
                return Err(BackendError::KernelFault(format!(
                    "gather: idx[{at}] = {bad} is past src_len = {}",
                    int(args, 4)
                )));
            }
        }
        Ok(ns)
    }

    /// Queues a checked built-in launch on `stream` between `start` and `end` (either
    /// `None`: the caller records it), without waiting (a batch; only a [`batchable`]
    /// kernel); what it touches goes on `held`, which the caller keeps until the kernel has
    /// finished.
    pub(super) fn queue_builtin(
        &self,
        (stream, start, end): (&Stream, Option<&Event>, Option<&Event>),
        held: &mut Vec<Held>,
        prepared: Prepared,
        name: &str,
    ) -> Result<()> {
        let Prepared {
            mut steps, keep, ..
        } = prepared;
        held.extend(keep.into_iter().flatten().map(Held::Alloc));
        if let Some(start) = start {
            start.record(stream).map_err(|e| self.cuda_err(e))?;
        }
        for step in steps.iter_mut().flatten() {
            step.enqueue(stream).map_err(|e| self.launch_err(e, name))?;
        }
        match end {
            Some(end) => end.record(stream).map_err(|e| self.cuda_err(e)),
            None => Ok(()),
        }
    }

    /// Checks a launch of built-in `sig` (index `index` of `KERNELS`) like the sim backend
    /// and lays out its kernel launches (reduce_sum and gather take `lane`'s scratch).
    pub(super) fn prepare_builtin(
        &self,
        lane: &mut Lane,
        sig: &'static KernelSig,
        index: usize,
        args: &[ArgValue],
    ) -> Result<Prepared> {
        check_args(sig, args)?;
        let f = self
            .builtins
            .kernels
            .get(index)
            .copied()
            .ok_or_else(|| BackendError::UnknownFunction(sig.name.to_string()))?;
        let sms = self.info.compute_units;
        // Keeps every allocation the kernel touches mapped until it has finished.
        let mut keep: [Option<Arc<Allocation>>; 3] = [None, None, None];
        let mut steps: [Option<Step>; 2] = [None, None];
        let mut fault_buf = None;
        let mut idx_addr = 0;
        let name = sig.name;
        if name == builtin::VECTOR_ADD.name {
            let n = int(args, 3);
            let (a, b, c) = (ptr(args, 0), ptr(args, 1), ptr(args, 2));
            keep = [
                self.extent(a, n, 4)?,
                self.extent(b, n, 4)?,
                self.extent(c, n, 4)?,
            ];
            steps[0] = Some(Step::new(f, grid_for(n, sms), BLOCK, &[a, b, c, n]));
        } else if name == builtin::SAXPY.name {
            let alpha = match args.first() {
                Some(ArgValue::F32(v)) => v.to_bits(),
                _ => 0,
            };
            let n = int(args, 3);
            let (x, y) = (ptr(args, 1), ptr(args, 2));
            keep[0] = self.extent(x, n, 4)?;
            keep[1] = self.extent(y, n, 4)?;
            steps[0] = Some(Step::new(
                f,
                grid_for(n, sms),
                BLOCK,
                &[u64::from(alpha), x, y, n],
            ));
        } else if name == builtin::FILL.name {
            let n = int(args, 2);
            let dst = ptr(args, 0);
            keep[0] = self.extent(dst, n, 4)?;
            steps[0] = Some(Step::new(
                f,
                grid_for(n, sms),
                BLOCK,
                &[dst, u64::from(word(args, 1)), n],
            ));
        } else if name == builtin::REDUCE_SUM.name {
            let n = int(args, 2);
            let (x, out) = (ptr(args, 0), ptr(args, 1));
            keep[0] = self.extent(x, n, 4)?;
            keep[1] = self.extent(out, 1, 4)?;
            let blocks = n.div_ceil(REDUCE_BLOCK);
            let bytes = usize::try_from(blocks.max(1).saturating_mul(8)).map_err(|_| {
                BackendError::InvalidArgument(format!("reduce_sum: n = {n} is too large"))
            })?;
            let partial = lane.scratch(bytes).map_err(|e| self.cuda_err(e))?;
            steps[0] = Some(Step::new(
                f,
                grid_for(blocks, sms),
                BLOCK,
                &[x, n, partial, blocks],
            ));
            steps[1] = Some(Step::new(
                self.builtins.reduce_final,
                1,
                1,
                &[partial, blocks, out],
            ));
        } else if name == builtin::MATMUL.name {
            let (m, n, k) = (int(args, 3), int(args, 4), int(args, 5));
            let too_big =
                || BackendError::InvalidArgument(format!("matmul: {m} x {n} x {k} overflows"));
            let (mk, kn, mn) = (
                m.checked_mul(k).ok_or_else(too_big)?,
                k.checked_mul(n).ok_or_else(too_big)?,
                m.checked_mul(n).ok_or_else(too_big)?,
            );
            mn.checked_mul(k).ok_or_else(too_big)?;
            let (a, b, c) = (ptr(args, 0), ptr(args, 1), ptr(args, 2));
            keep = [
                self.extent(a, mk, 4)?,
                self.extent(b, kn, 4)?,
                self.extent(c, mn, 4)?,
            ];
            steps[0] = Some(Step::new(f, grid_for(mn, sms), BLOCK, &[a, b, c, m, n, k]));
        } else if name == builtin::GATHER.name {
            let (n, src_len) = (int(args, 3), int(args, 4));
            let (src, idx, dst) = (ptr(args, 0), ptr(args, 1), ptr(args, 2));
            keep = [
                self.extent(src, src_len, 4)?,
                self.extent(idx, n, 4)?,
                self.extent(dst, n, 4)?,
            ];
            let fault = lane.scratch(8).map_err(|e| self.cuda_err(e))?;
            check(
                // SAFETY: sets the 8 bytes of our own scratch buffer, queued on our stream.
                unsafe { sys::cuMemsetD32Async(fault, u32::MAX, 2, lane.stream.raw()) },
                "cuMemsetD32Async",
            )
            .map_err(|e| self.cuda_err(e))?;
            fault_buf = Some(fault);
            idx_addr = idx;
            steps[0] = Some(Step::new(
                f,
                grid_for(n, sms),
                BLOCK,
                &[src, idx, dst, n, src_len, fault],
            ));
        } else if name == builtin::SPIN.name {
            let us = int(args, 0);
            if us > builtin::MAX_SPIN_US {
                return Err(BackendError::InvalidArgument(format!(
                    "spin: duration_us = {us} is above the limit of {} µs; split the burst",
                    builtin::MAX_SPIN_US
                )));
            }
            steps[0] = Some(Step::new(f, 1, 1, &[us * 1000]));
        } else if name == builtin::CHECKSUM.name {
            let n = int(args, 1);
            let (data, out) = (ptr(args, 0), ptr(args, 2));
            keep[0] = self.extent(data, n, 1)?;
            keep[1] = self.extent(out, 1, 8)?;
            steps[0] = Some(Step::new(f, 1, 1, &[data, n, out]));
        } else {
            return Err(BackendError::UnknownFunction(name.to_string()));
        }
        Ok(Prepared {
            steps,
            keep,
            fault: fault_buf.map(|f| (f, idx_addr)),
        })
    }

    /// Reads 8 bytes of device memory (synchronously, on `lane`).
    fn read_u64(&self, lane: &Lane, addr: u64) -> Result<u64> {
        let mut v = 0u64;
        check(
            // SAFETY: writes 8 bytes into `v`, which outlives the synchronisation below; `addr`
            // is our scratch buffer or a checked address of a live allocation.
            unsafe {
                sys::cuMemcpyDtoHAsync_v2((&mut v as *mut u64).cast(), addr, 8, lane.stream.raw())
            },
            "cuMemcpyDtoHAsync",
        )
        .and_then(|()| lane.stream.synchronize())
        .map_err(|e| self.cuda_err(e))?;
        Ok(v)
    }

    /// Reads 4 bytes of device memory (synchronously, on `lane`).
    fn read_u32(&self, lane: &Lane, addr: u64) -> Result<u32> {
        let mut v = 0u32;
        check(
            // SAFETY: as in read_u64, for 4 bytes.
            unsafe {
                sys::cuMemcpyDtoHAsync_v2((&mut v as *mut u32).cast(), addr, 4, lane.stream.raw())
            },
            "cuMemcpyDtoHAsync",
        )
        .and_then(|()| lane.stream.synchronize())
        .map_err(|e| self.cuda_err(e))?;
        Ok(v)
    }
}
