//! Kernels on the GPU back to back: a guest function alone ([`CudaGpu::run_ptx`]), or a
//! batch of kernels under one wait ([`CudaGpu::run_batch`]).
//!
//! A batch takes one lane: for each item the checks of a lone launch (the function, the
//! arguments against its parameters, write pointers against read-only mappings, local
//! memory against the stack limit, a built-in's pointer extents), `cuLaunchKernel` and an
//! end event, all on the lane's stream without waiting (a kernel right after another uses
//! that one's end event as its start; only the first, or one after a refused item, records
//! its own start event: one event per kernel instead of two); then one
//! polling wait that walks the end events in order. Each guest function keeps its own hard
//! limit, counted from when the kernel before it was seen finished (on one stream it cannot
//! start earlier), so the whole wait is bounded by the sum of the queued kernels' limits.
//! Each item's device time comes from the events around it (back to back on one stream, a
//! kernel's time includes any gap before it while the CPU was still queuing it: the vGPU
//! held the GPU then anyway). The allocations the kernels point
//! into stay held until the whole batch has finished.
//!
//! An item that fails its checks gets its error and is not queued; its neighbours run. A
//! kernel that faults loses the context: the first kernel not yet seen finished is
//! answered with the fault and every later one with the lost context (once the context is
//! lost, the driver cannot tell the faulting kernel from ones that finished unobserved just
//! before it). Built-in kernels join a batch like guest functions (waited for without a
//! hard limit, as alone), except reduce_sum and gather, which use the lane's scratch memory
//! and look at the device after they ran; those and the storage kernels end the batch so
//! far and run alone.

use std::ffi::c_void;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use cudarc::driver::sys;
use vgpu_proto::ArgValue;

use super::builtin;
use super::driver::{check, Event, Stream};
use super::lanes::Lane;
use super::modules::{self, Kernel, PtxFunc};
use super::{CudaGpu, DEFAULT_SHARED};
use crate::error::{BackendError, Result};
use crate::sync::lock;
use crate::{BatchLaunch, LaunchConfig, LaunchStats};

const KERNEL: &str = "PTX function";

impl CudaGpu {
    /// Launches a guest PTX function with the guest's geometry on `lane` and waits for it;
    /// returns its device time.
    pub(super) fn run_ptx(
        &self,
        lane: &mut Lane,
        f: &PtxFunc,
        config: &LaunchConfig,
        args: &[ArgValue],
        blob: &[u8],
    ) -> Result<u64> {
        let Lane {
            stream,
            start,
            end,
            held,
            ..
        } = lane;
        let run = self
            .queue_ptx(stream, Some(start), end, held, f, config, args, blob)
            .and_then(|()| self.wait_kernel(end, f.name()))
            .and_then(|()| end.since_ns(start).map_err(|e| self.cuda_err(e)));
        // The kernel has finished (or can no longer touch them): the allocations may go.
        held.clear();
        run
    }

    /// Checks a launch of `f` and queues it on `stream` between `start` (`None`: the event
    /// recorded last on the stream marks its start) and `end`, without waiting. What its pointer arguments point into is pushed on `held`, which the caller
    /// keeps until the kernel has finished.
    #[allow(clippy::too_many_arguments)]
    fn queue_ptx(
        &self,
        stream: &Stream,
        start: Option<&Event>,
        end: &Event,
        held: &mut Vec<modules::Held>,
        f: &PtxFunc,
        config: &LaunchConfig,
        args: &[ArgValue],
        blob: &[u8],
    ) -> Result<()> {
        // The driver would grow every thread's stack to the function's need, uncharged.
        super::limits::check_local(f.name(), f.local_bytes, self.reserve.stack_bytes)?;
        if args.len() != f.params.len() {
            return Err(BackendError::BadArgCount {
                kernel: KERNEL,
                expected: f.params.len(),
                got: args.len(),
            });
        }
        let mut vals = [0u64; vgpu_proto::MAX_KERNEL_ARGS as usize];
        let mut ptrs = [std::ptr::null_mut::<c_void>(); vgpu_proto::MAX_KERNEL_ARGS as usize];
        for (index, ((arg, size), val)) in args
            .iter()
            .zip(f.params.iter())
            .zip(vals.iter_mut())
            .enumerate()
        {
            let want = match arg {
                ArgValue::U32(_) | ArgValue::F32(_) => 4,
                ArgValue::Bytes { len, .. } => u32::from(*len),
                ArgValue::Blob { len, .. } => *len,
                _ => 8,
            };
            if *size != want {
                return Err(BackendError::BadArgType {
                    kernel: KERNEL,
                    index,
                    param: "parameter",
                    reason: format!(
                        "{} takes {size} bytes here, the argument is a {:?} of {want} bytes",
                        f.name(),
                        arg.kind()
                    ),
                });
            }
            *val = match *arg {
                ArgValue::U32(v) => u64::from(v),
                ArgValue::F32(v) => u64::from(v.to_bits()),
                ArgValue::U64(v) => v,
                ArgValue::F64(v) => v.to_bits(),
                // Little end first: the parameter's bytes start at the value's address.
                ArgValue::Bytes { bits, .. } => bits,
                // Its bytes are in `blob`: pointed at below.
                ArgValue::Blob { .. } => 0,
                ArgValue::Ptr { addr, .. } => {
                    // The extent a PTX kernel touches is unknown: the pointer itself must lie
                    // inside a live allocation (or a module variable), and the GPU isolates
                    // the rest.
                    held.push(modules::resolve(&self.mem, &self.modules, addr, 0, false)?);
                    addr
                }
            };
        }
        for (p, v) in ptrs.iter_mut().zip(vals.iter_mut()) {
            *p = (v as *mut u64).cast();
        }
        modules::blob_pointers(args, blob, &mut ptrs)?;
        if config.shared_bytes > DEFAULT_SHARED
            && f.shared_limit.load(Ordering::Acquire) < config.shared_bytes
        {
            let _g = lock(&self.attr_lock);
            check(
                // SAFETY: sets an attribute of a live function of a loaded module.
                unsafe {
                    sys::cuFuncSetAttribute(
                        f.func.0,
                        sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                        config.shared_bytes as i32,
                    )
                },
                "cuFuncSetAttribute",
            )
            .map_err(|e| self.launch_err(e, f.name()))?;
            f.shared_limit.store(config.shared_bytes, Ordering::Release);
        }
        if let Some(start) = start {
            start.record(stream).map_err(|e| self.cuda_err(e))?;
        }
        let [gx, gy, gz] = config.grid;
        let [bx, by, bz] = config.block;
        check(
            // SAFETY: `f.func` is a live function of a module the caller keeps loaded (its
            // `Kernel` Arc); `ptrs` holds one pointer per kernel parameter (count and sizes
            // checked against cuFuncGetParamInfo above) to values that outlive the call (the
            // driver copies them before returning; blob arguments point into `blob`,
            // borrowed for the call); pointer arguments lie in live allocations that `held`
            // keeps until the kernel finished.
            unsafe {
                sys::cuLaunchKernel(
                    f.func.0,
                    gx,
                    gy,
                    gz,
                    bx,
                    by,
                    bz,
                    config.shared_bytes,
                    stream.raw(),
                    ptrs.as_mut_ptr(),
                    std::ptr::null_mut(),
                )
            },
            "cuLaunchKernel",
        )
        .map_err(|e| self.launch_err(e, f.name()))?;
        end.record(stream).map_err(|e| self.cuda_err(e))
    }

    /// [`crate::Backend::launch_batch`]: each run of kernels that can join a batch as one
    /// batch, every other kernel alone; one result per item, in order.
    pub(super) fn run_batch(&self, items: &[BatchLaunch<'_>]) -> Vec<Result<LaunchStats>> {
        let mut out = Vec::with_capacity(items.len());
        let mut rest = items;
        while !rest.is_empty() {
            let n = self.run_segment(rest, &mut out);
            let Some((alone, after)) = rest.get(n..).and_then(|r| r.split_first()) else {
                break;
            };
            // A kernel that cannot join a batch (or the batch could not start): on its own,
            // as always.
            out.push(crate::Backend::launch_with_params(
                self,
                alone.function,
                &alone.config,
                alone.args,
                alone.blob,
            ));
            rest = after;
        }
        out
    }

    /// Queues the leading kernels of `items` that can join a batch on one lane, waits for
    /// them and pushes their results on `out`; returns how many items it answered (it stops
    /// before the first kernel that cannot join, or answers none when the batch cannot
    /// start: the caller then runs that item alone).
    fn run_segment(&self, items: &[BatchLaunch<'_>], out: &mut Vec<Result<LaunchStats>>) -> usize {
        let _op = self.inflight.begin();
        if self.enter().and_then(|()| self.guest_ready()).is_err() {
            return 0;
        }
        let Ok(mut lane) = self.lanes.take() else {
            return 0;
        };
        let first = out.len();
        // (item index in `out`, its function, whether its start is the end event of the
        // item before it) of every kernel on the stream.
        let mut queued: Vec<(usize, Kernel, bool)> = Vec::with_capacity(items.len());
        let mut taken = 0;
        for item in items {
            let kernel = match self.modules.kernel(item.function) {
                Ok(k @ Kernel::Ptx(..)) => k,
                Ok(k @ Kernel::Builtin(sig, _)) if builtin::batchable(sig) => k,
                Ok(_) => break,
                Err(e) => {
                    out.push(Err(e));
                    taken += 1;
                    continue;
                }
            };
            taken += 1;
            let index = out.len() - first;
            // Right after the kernel of the item before: its end event is this one's start.
            let chained = index > 0 && queued.last().is_some_and(|q| q.0 + 1 == out.len());
            // `enter` fails once a kernel queued before this one lost the context.
            let queue = self
                .mem
                .check_kernel_writes(item.args)
                .and_then(|()| self.enter())
                .and_then(|()| lane.pair(index).map_err(|e| self.cuda_err(e)))
                .and_then(|()| self.queue_item(&mut lane, index, chained, &kernel, item));
            match queue {
                Ok(()) => {
                    queued.push((out.len(), kernel, chained));
                    out.push(Ok(LaunchStats { device_ns: 0 }));
                }
                Err(e) => out.push(Err(e)),
            }
        }
        self.wait_batch(&lane, first, &queued, out);
        lane.held.clear();
        taken
    }

    /// Checks `item` (a guest function, or a built-in that can join a batch) and queues it
    /// on `lane`'s stream before the end event of pair `index`, after its start event, or
    /// when `chained` after the end event of pair `index - 1` (the kernel before it).
    fn queue_item(
        &self,
        lane: &mut Lane,
        index: usize,
        chained: bool,
        kernel: &Kernel,
        item: &BatchLaunch<'_>,
    ) -> Result<()> {
        let prepared = match kernel {
            Kernel::Builtin(sig, i) => Some(self.prepare_builtin(lane, sig, *i, item.args)?),
            _ => None,
        };
        let Lane {
            stream,
            pairs,
            held,
            ..
        } = lane;
        let (own_start, end) = pairs.get(index).ok_or_else(missing_pair)?;
        let start = (!chained).then_some(own_start);
        match (kernel, prepared) {
            (Kernel::Ptx(_, f), _) => self.queue_ptx(
                stream,
                start,
                end,
                held,
                f,
                &item.config,
                item.args,
                item.blob,
            ),
            (Kernel::Builtin(sig, _), Some(p)) => {
                self.queue_builtin((stream, start, end), held, p, sig.name)
            }
            _ => Err(BackendError::Device(
                "this kernel cannot run in a batch; launch it alone".into(),
            )),
        }
    }

    /// Waits for the queued kernels in order, each under its own hard limit from the end of
    /// the one before, and writes each one's device time, or its error, into `out`.
    fn wait_batch(
        &self,
        lane: &Lane,
        first: usize,
        queued: &[(usize, Kernel, bool)],
        out: &mut [Result<LaunchStats>],
    ) {
        let mut t = Instant::now();
        for (slot, kernel, chained) in queued {
            // A guest function has its hard limit; a built-in, bounded by its arguments,
            // is waited for as long as it runs, as alone.
            let (name, limit) = match kernel {
                Kernel::Ptx(_, f) => (f.name(), self.kernel_limit),
                Kernel::Builtin(sig, _) | Kernel::Storage(sig) => (sig.name, Duration::MAX),
            };
            let result = self.enter().and_then(|()| {
                let index = slot - first;
                let (own_start, end) = lane.pairs.get(index).ok_or_else(missing_pair)?;
                let start = if *chained {
                    let before = index.checked_sub(1).and_then(|i| lane.pairs.get(i));
                    &before.ok_or_else(missing_pair)?.1
                } else {
                    own_start
                };
                self.wait_kernel_until(end, name, t, limit)?;
                end.since_ns(start).map_err(|e| self.cuda_err(e))
            });
            t = Instant::now();
            if let Some(o) = out.get_mut(*slot) {
                *o = result.map(|device_ns| LaunchStats { device_ns });
            }
        }
        tracing::trace!(kernels = queued.len(), "batch done");
    }
}

fn missing_pair() -> BackendError {
    BackendError::Device("a batch's timing events are missing; retry the launch".into())
}
