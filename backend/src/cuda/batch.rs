//! Kernels on the GPU back to back: a guest function alone ([`CudaGpu::run_ptx`]), or a
//! batch of kernels under one wait ([`CudaGpu::run_batch`]).
//!
//! A batch takes one lane: for each item the checks of a lone launch (the function, the
//! arguments against its parameters, write pointers against read-only mappings, local
//! memory against the stack limit, a built-in's pointer extents) and `cuLaunchKernel`, all
//! on the lane's stream without waiting; then one polling wait that walks the batch in
//! order. Timing events go between runs of one function, not between every two kernels
//! (recording an event costs about as much as queuing a null kernel): consecutive launches
//! of the same function form a run with one end event, the next run starts at that event,
//! and each kernel of a run gets the run's device time shared evenly. The first run records
//! no start: it is timed on the host from the batch's first launch call to its end being
//! seen (a run that ended while later ones were still being queued is charged that
//! queuing too), and a batch of one run records no event at all: its end is read from the
//! lane's host word, written after it as after a lone kernel (`signal.rs`, [`host_ns`]). A
//! run keeps the hard
//! limit of its guest functions together (each one's limit, counted from when the run
//! before was seen finished; on one stream nothing of it can start earlier), so the whole
//! wait is bounded by the sum of the queued kernels' limits. The allocations the kernels
//! point into stay held until the whole batch has finished. Back to back on one stream, a
//! run's time includes any gap while the CPU was still queuing it: the vGPU held the GPU
//! then anyway.
//!
//! An item that fails its checks gets its error and is not queued; its neighbours run. A
//! kernel that faults loses the context: the first kernel of the first run not yet seen
//! finished is answered with the fault and every later one with the lost context (once the
//! context is lost, the driver cannot tell the faulting kernel from ones that finished
//! unobserved just before it). A small `fill` (a runtime library's memset before its next
//! kernel) queued after a run's kernels rides along with that run: no event around it, its
//! time counted in the run's, its result the run's (device time 0 of its own), and the run
//! goes on when the same function follows it. Built-in kernels join a batch like guest functions (waited for without a
//! hard limit, as alone), except reduce_sum and gather, which use the lane's scratch memory
//! and look at the device after they ran; those and the storage kernels end the batch so
//! far and run alone.

use std::ffi::c_void;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use cudarc::driver::sys;
use vgpu_proto::ArgValue;

use super::builtin;
use super::driver::{check, CuError, Event, Stream};
use super::lanes::{host_ns, Lane};
use super::modules::{self, Kernel, PtxFunc};
use super::signal::Signal;
use super::{CudaGpu, DEFAULT_SHARED};
use crate::error::{BackendError, Result};
use crate::sync::lock;
use crate::{Launch, LaunchConfig, LaunchStats};

const KERNEL: &str = "PTX function";

impl CudaGpu {
    /// Launches a guest PTX function with the guest's geometry on `lane` and waits for it;
    /// returns its time on the GPU as the host saw it, from the launch call to its end being
    /// noticed (docs/cuda.md: a lone kernel records no timing events).
    pub(super) fn run_ptx(
        &self,
        lane: &mut Lane,
        f: &PtxFunc,
        config: &LaunchConfig,
        cluster: [u32; 3],
        args: &[ArgValue],
        blob: &[u8],
    ) -> Result<u64> {
        let Lane {
            stream,
            held,
            signal,
            ..
        } = lane;
        let t = Instant::now();
        let run = self
            .queue_ptx(stream, None, None, held, f, config, cluster, args, blob)
            .and_then(|()| self.wait_all_queued(stream, signal, f.name(), t, self.kernel_limit))
            .map(|()| host_ns(t));
        // The kernel has finished (or can no longer touch them): the allocations may go.
        held.clear();
        run
    }

    /// Waits for everything just queued on `stream` (a lone kernel, or a batch's only run),
    /// past `limit` from `t` a hard-limit fault: by the lane's host word when it has one
    /// (`signal.rs`), else by asking the stream. A word the driver will not write is given
    /// up for the lane's life.
    fn wait_all_queued(
        &self,
        stream: &Stream,
        signal: &mut Option<Signal>,
        kernel: &str,
        t: Instant,
        limit: Duration,
    ) -> Result<()> {
        if let Some(s) = signal {
            match s.arm(stream) {
                Ok(armed) => return self.wait_kernel_until(&armed, kernel, t, limit),
                Err(e) => {
                    tracing::debug!(error = %e, "cannot queue a host word's write after a kernel; this lane's waits ask the stream");
                    *signal = None;
                }
            }
        }
        self.wait_kernel_until(stream, kernel, t, limit)
    }

    /// Checks a launch of `f` and queues it on `stream` between `start` and `end` (either
    /// `None`: the caller records it), without waiting. What its pointer arguments point into is pushed on `held`, which the caller
    /// keeps until the kernel has finished.
    #[allow(clippy::too_many_arguments)]
    fn queue_ptx(
        &self,
        stream: &Stream,
        start: Option<&Event>,
        end: Option<&Event>,
        held: &mut Vec<modules::Held>,
        f: &PtxFunc,
        config: &LaunchConfig,
        cluster: [u32; 3],
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
                    held.push(self.reach(addr, 0, false)?);
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
        if cluster == crate::NO_CLUSTER {
            let [gx, gy, gz] = config.grid;
            let [bx, by, bz] = config.block;
            check(
                // SAFETY: `f.func` is a live function of a module the caller keeps loaded
                // (its `Kernel` Arc); `ptrs` holds one pointer per kernel parameter (count
                // and sizes checked against cuFuncGetParamInfo above) to values that
                // outlive the call (the driver copies them before returning; blob
                // arguments point into `blob`, borrowed for the call); pointer arguments
                // lie in live allocations that `held` keeps until the kernel finished.
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
        } else {
            self.launch_cluster(stream, f, config, cluster, &mut ptrs)
        }
        .map_err(|e| self.launch_err(e, f.name()))?;
        match end {
            Some(end) => end.record(stream).map_err(|e| self.cuda_err(e)),
            None => Ok(()),
        }
    }

    /// `cuLaunchKernelEx` of `f` in thread block clusters of `cluster` blocks (the device
    /// checked the size and that the grid is a whole number of clusters); a cluster above
    /// the portable 8 blocks first allows the function non-portable sizes.
    fn launch_cluster(
        &self,
        stream: &Stream,
        f: &PtxFunc,
        config: &LaunchConfig,
        cluster: [u32; 3],
        ptrs: &mut [*mut c_void],
    ) -> std::result::Result<(), CuError> {
        if cluster.iter().product::<u32>() > 8 {
            let _g = lock(&self.attr_lock);
            check(
                // SAFETY: sets an attribute of a live function of a loaded module.
                unsafe {
                    sys::cuFuncSetAttribute(
                        f.func.0,
                        sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED,
                        1,
                    )
                },
                "cuFuncSetAttribute",
            )?;
        }
        // SAFETY: an all-zero attribute is a valid value of this plain C union.
        let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
        attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
        attr.value.clusterDim.x = cluster[0];
        attr.value.clusterDim.y = cluster[1];
        attr.value.clusterDim.z = cluster[2];
        let lc = sys::CUlaunchConfig {
            gridDimX: config.grid[0],
            gridDimY: config.grid[1],
            gridDimZ: config.grid[2],
            blockDimX: config.block[0],
            blockDimY: config.block[1],
            blockDimZ: config.block[2],
            sharedMemBytes: config.shared_bytes,
            hStream: stream.raw(),
            attrs: &mut attr,
            numAttrs: 1,
        };
        check(
            // SAFETY: as `cuLaunchKernel` in `queue_ptx` (the same function, parameters and
            // lifetimes); `lc` and its one attribute live on this frame for the call.
            unsafe {
                sys::cuLaunchKernelEx(&lc, f.func.0, ptrs.as_mut_ptr(), std::ptr::null_mut())
            },
            "cuLaunchKernelEx",
        )
    }

    /// One launch on a lane of its own, waited for; `ended` gets its result before the
    /// lane, the function's references and the operation let go
    /// ([`crate::Backend::launch_then`]).
    pub(super) fn launch_alone(
        &self,
        l: &Launch<'_>,
        ended: &mut dyn FnMut(&[Result<LaunchStats>]),
    ) -> Result<LaunchStats> {
        let _op = self.inflight.begin();
        let mut kernel = None;
        let mut lane = None;
        let r = self.run_alone(l, &mut kernel, &mut lane);
        ended(std::slice::from_ref(&r));
        r
    }

    /// [`CudaGpu::launch_alone`]'s checks and run; what it takes (the function's
    /// references, the lane) goes into `kernel` and `lane`, for the caller to let go.
    fn run_alone<'a>(
        &'a self,
        l: &Launch<'_>,
        kernel: &mut Option<Kernel>,
        lane: &mut Option<super::lanes::LaneGuard<'a>>,
    ) -> Result<LaunchStats> {
        let kernel = kernel.insert(self.modules.kernel(l.function)?);
        // A pointer the kernel may write through must not point into a read-only shared
        // mapping: the GPU would fault on the write and the context would be lost.
        self.mem.check_kernel_writes(l.args)?;
        self.enter()?;
        self.guest_ready()?;
        let lane = lane.insert(self.lanes.take().map_err(|e| self.cuda_err(e))?);
        let ns = match kernel {
            Kernel::Builtin(sig, index) => self.run_builtin(lane, sig, *index, l.args)?,
            Kernel::Ptx(_module, f) => {
                self.run_ptx(lane, f, &l.config, l.cluster, l.args, l.blob)?
            }
            Kernel::Storage(sig) => self.run_storage(lane, sig, l.args)?,
        };
        tracing::trace!(function = l.function, ns, "kernel done");
        Ok(LaunchStats { device_ns: ns })
    }

    /// [`crate::Backend::launch`] of more than one: each run of kernels that can join a batch as one
    /// batch, every other kernel alone; one result per item, in order.
    pub(super) fn run_batch(&self, items: &[Launch<'_>]) -> Vec<Result<LaunchStats>> {
        let mut out = Vec::with_capacity(items.len());
        let mut rest = items;
        while !rest.is_empty() {
            let n = self.run_segment(rest, &mut out);
            let Some((alone, after)) = rest.get(n..).and_then(|r| r.split_first()) else {
                break;
            };
            // A kernel that cannot join a batch (or the batch could not start): on its own,
            // as always.
            out.push(self.launch_alone(alone, &mut |_| {}));
            rest = after;
        }
        out
    }

    /// Queues the leading kernels of `items` that can join a batch on one lane, waits for
    /// them and pushes their results on `out`; returns how many items it answered (it stops
    /// before the first kernel that cannot join, or answers none when the batch cannot
    /// start: the caller then runs that item alone).
    fn run_segment(&self, items: &[Launch<'_>], out: &mut Vec<Result<LaunchStats>>) -> usize {
        let _op = self.inflight.begin();
        if self.enter().and_then(|()| self.guest_ready()).is_err() {
            return 0;
        }
        let Ok(mut lane) = self.lanes.take() else {
            return 0;
        };
        let mut q = Queue::new();
        let mut taken = 0;
        for item in items {
            // A run's kernels are one function: looked up once, at the run's first launch
            // (the lookup takes the module table's lock and the function's references).
            let same = q.open.as_ref().is_some_and(|r| r.function == item.function);
            let fresh = if same {
                None
            } else {
                match self.modules.kernel(item.function) {
                    Ok(k @ Kernel::Ptx(..)) => Some(k),
                    Ok(k @ Kernel::Builtin(sig, _)) if builtin::batchable(sig) => Some(k),
                    Ok(_) => break,
                    Err(e) => {
                        out.push(Err(e));
                        taken += 1;
                        continue;
                    }
                }
            };
            taken += 1;
            // A small fill after queued kernels rides along with their run: no timing
            // events of its own, and the run's kernels keep their run.
            let rider = match fresh {
                Some(k @ Kernel::Builtin(sig, _))
                    if builtin::rides_along(sig, item.args)
                        && q.open.as_ref().is_some_and(|r| !r.slots.is_empty()) =>
                {
                    Some(k)
                }
                Some(kernel) => {
                    self.close_run(&mut lane, &mut q, out, true);
                    if let Err(e) = self.open_run(&mut lane, &mut q, item.function, kernel) {
                        out.push(Err(e));
                        continue;
                    }
                    None
                }
                None => None,
            };
            // `alive` fails once a kernel queued before this one lost the context.
            let queued = self
                .mem
                .check_kernel_writes(item.args)
                .and_then(|()| self.alive())
                .and_then(|()| match (&rider, q.open.as_ref()) {
                    (Some(k), _) => self.queue_item(&mut lane, k, item),
                    (None, Some(run)) => self.queue_item(&mut lane, &run.kernel, item),
                    (None, None) => Err(missing_mark()),
                });
            match queued {
                Ok(()) => {
                    if let Some(run) = q.open.as_mut() {
                        if rider.is_some() {
                            run.riders.push(out.len());
                        } else {
                            run.slots.push(out.len());
                        }
                    }
                    q.queued = true;
                    out.push(Ok(LaunchStats { device_ns: 0 }));
                }
                Err(e) => out.push(Err(e)),
            }
        }
        self.close_run(&mut lane, &mut q, out, false);
        self.wait_batch(&mut lane, &q, out);
        lane.held.clear();
        taken
    }

    /// Opens a run of `function` (`kernel`): its start is the event recorded last on the
    /// stream when no kernel was queued after it, none when no kernel was queued yet (the
    /// host times it from the batch's start), else a new one. The caller closed the run
    /// before.
    fn open_run(
        &self,
        lane: &mut Lane,
        q: &mut Queue,
        function: u64,
        kernel: Kernel,
    ) -> Result<()> {
        let start = match q.last {
            Some(m) => Some(m),
            None if !q.queued => None,
            None => {
                let m = q.next_mark(lane).map_err(|e| self.cuda_err(e))?;
                let ev = lane.marks.get(m).ok_or_else(missing_mark)?;
                ev.record(&lane.stream).map_err(|e| self.cuda_err(e))?;
                Some(m)
            }
        };
        q.last = start;
        q.open = Some(Run {
            function,
            kernel,
            start,
            end: None,
            slots: Vec::new(),
            riders: Vec::new(),
        });
        Ok(())
    }

    /// Records the open run's end event and files it for the wait; a run whose end cannot
    /// be recorded answers its kernels with that error. The batch's only run (`more`:
    /// whether another follows) records nothing: the wait queues the lane's host word
    /// after it and reads its end from that, as after a lone kernel (the lane's stream
    /// holds nothing else).
    fn close_run(
        &self,
        lane: &mut Lane,
        q: &mut Queue,
        out: &mut [Result<LaunchStats>],
        more: bool,
    ) {
        let Some(mut run) = q.open.take() else {
            return;
        };
        if run.slots.is_empty() {
            // Nothing was queued after its start: that event still ends the stream.
            return;
        }
        let only = run.start.is_none() && !more;
        let recorded = if only {
            Ok(None)
        } else {
            q.next_mark(lane)
                .map_err(|e| self.cuda_err(e))
                .and_then(|m| {
                    let ev = lane.marks.get(m).ok_or_else(missing_mark)?;
                    ev.record(&lane.stream).map_err(|e| self.cuda_err(e))?;
                    Ok(Some(m))
                })
        };
        match recorded {
            Ok(m) => {
                run.end = m;
                q.last = m;
                q.closed.push(run);
            }
            Err(e) => {
                // Nothing can time this run or tell when it ended: its kernels fail, and
                // the next run records its own start.
                q.last = None;
                let why = e.to_string();
                for slot in run.slots.iter().chain(&run.riders) {
                    if let Some(o) = out.get_mut(*slot) {
                        *o = Err(BackendError::Device(why.clone()));
                    }
                }
                // The kernels may still be running: wait for the stream before their
                // allocations go.
                let _ = lane.stream.synchronize();
            }
        }
    }

    /// Checks `item` (a guest function, or a built-in that can join a batch) and queues it
    /// on `lane`'s stream (its timing events are the run's).
    fn queue_item(&self, lane: &mut Lane, kernel: &Kernel, item: &Launch<'_>) -> Result<()> {
        let prepared = match kernel {
            Kernel::Builtin(sig, i) => Some(self.prepare_builtin(lane, sig, *i, item.args)?),
            _ => None,
        };
        let Lane { stream, held, .. } = lane;
        match (kernel, prepared) {
            (Kernel::Ptx(_, f), _) => self.queue_ptx(
                stream,
                None,
                None,
                held,
                f,
                &item.config,
                item.cluster,
                item.args,
                item.blob,
            ),
            (Kernel::Builtin(sig, _), Some(p)) => {
                self.queue_builtin((stream, None, None), held, p, sig.name)
            }
            _ => Err(BackendError::Device(
                "this kernel cannot run in a batch; launch it alone".into(),
            )),
        }
    }

    /// Waits for the runs in order, each under its kernels' hard limits together from the
    /// end of the run before (the first from the batch's start), and writes each kernel's
    /// share of its run's device time, or its error, into `out`.
    fn wait_batch(&self, lane: &mut Lane, q: &Queue, out: &mut [Result<LaunchStats>]) {
        let Lane {
            stream,
            marks,
            signal,
            ..
        } = lane;
        let mut t = q.began;
        for run in &q.closed {
            // A guest function has its hard limit; a built-in, bounded by its arguments,
            // is waited for as long as it runs, as alone.
            let (name, one) = match &run.kernel {
                Kernel::Ptx(_, f) => (f.name(), self.kernel_limit),
                Kernel::Builtin(sig, _) | Kernel::Storage(sig) => (sig.name, Duration::MAX),
            };
            let n = u32::try_from(run.slots.len()).unwrap_or(u32::MAX);
            let limit = one.checked_mul(n).unwrap_or(Duration::MAX);
            let mark = |m: usize| marks.get(m).ok_or_else(missing_mark);
            let result = self.enter().and_then(|()| match (run.start, run.end) {
                (None, None) => {
                    self.wait_all_queued(stream, signal, name, t, limit)?;
                    Ok(host_ns(q.began))
                }
                (None, Some(end)) => {
                    self.wait_kernel_until(mark(end)?, name, t, limit)?;
                    Ok(host_ns(q.began))
                }
                (Some(start), Some(end)) => {
                    let end = mark(end)?;
                    self.wait_kernel_until(end, name, t, limit)?;
                    end.since_ns(mark(start)?).map_err(|e| self.cuda_err(e))
                }
                (Some(_), None) => Err(missing_mark()),
            });
            t = Instant::now();
            match result {
                Ok(ns) => {
                    let n = run.slots.len().max(1) as u64;
                    for (k, slot) in run.slots.iter().enumerate() {
                        // The remainder to the first, so the run's time adds up.
                        let share = ns / n + if k == 0 { ns % n } else { 0 };
                        if let Some(o) = out.get_mut(*slot) {
                            *o = Ok(LaunchStats { device_ns: share });
                        }
                    }
                }
                Err(e) => {
                    // The first kernel of the run gets the fault; the others what a call
                    // gets now (the lost context), as a later run's would.
                    let mut first = Some(e);
                    for slot in run.slots.iter().chain(&run.riders) {
                        let err = first.take().unwrap_or_else(|| {
                            self.enter().err().unwrap_or_else(|| {
                                BackendError::Device(format!(
                                    "{name} did not finish: a kernel queued before it in the same batch failed"
                                ))
                            })
                        });
                        if let Some(o) = out.get_mut(*slot) {
                            *o = Err(err);
                        }
                    }
                }
            }
        }
        tracing::trace!(runs = q.closed.len(), "batch done");
    }
}

/// Consecutive launches of one function in a batch, timed together.
struct Run {
    function: u64,
    /// The function (held until its kernels finished: it keeps its module loaded).
    kernel: Kernel,
    /// Its start and end events (indexes into the lane's marks). No start: the batch's
    /// first run, timed on the host from the batch's start; no end as well: the batch's
    /// only run, its end read from the lane's host word.
    start: Option<usize>,
    end: Option<usize>,
    /// Its kernels' places in the results.
    slots: Vec<usize>,
    /// The places of the small fills that ride along with it ([`builtin::rides_along`]):
    /// queued among its kernels, timed as part of them (device time 0 of their own), and
    /// failed with them.
    riders: Vec<usize>,
}

/// A batch being queued: the runs closed so far, the open one, the timing event recorded
/// last on the stream with no kernel after it, and when it started.
struct Queue {
    closed: Vec<Run>,
    open: Option<Run>,
    last: Option<usize>,
    used: usize,
    /// Whether a kernel was queued: the batch's first run starts at `began`, a later one at
    /// an event.
    queued: bool,
    /// Right before the batch's first launch call.
    began: Instant,
}

impl Queue {
    fn new() -> Self {
        Self {
            closed: Vec::new(),
            open: None,
            last: None,
            used: 0,
            queued: false,
            began: Instant::now(),
        }
    }

    /// The index of a fresh timing event of `lane`.
    fn next_mark(&mut self, lane: &mut Lane) -> std::result::Result<usize, super::driver::CuError> {
        let m = self.used;
        lane.mark(m)?;
        self.used += 1;
        Ok(m)
    }
}

fn missing_mark() -> BackendError {
    BackendError::Device("a batch's timing events are missing; retry the launch".into())
}
