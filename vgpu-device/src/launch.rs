//! LAUNCH: the device's checks of a launch, a launch alone, and a batch of the launches a
//! queue posted together.
//!
//! A guest that posts many launches per doorbell (the CUDA library does for launches on a
//! stream) would pay a grant, a backend call, a wait and a wake-up per kernel if each were
//! served alone. The queue thread instead takes the launches that are already available
//! one after the other ([`LaunchBatch`], bounded by [`crate::BatchLimits`]), checks each as
//! a lone launch would be checked (one that fails gets its error and stays out), asks the
//! GPU's scheduler once for the whole batch, hands the kernels to the backend in one
//! [`Backend::launch`](vgpu_backend::Backend::launch) and then completes every
//! request in ring order. Any other request ends the batch: a queue's requests are never
//! reordered.

use std::cell::RefCell;
use std::time::Instant;

use vgpu_backend::{Launch, LaunchConfig, LaunchStats};
use vgpu_grant::Resource;
use vgpu_proto::{
    features, ArgError, ArgValue, LaunchRequest, Opcode, Request, MAX_KERNEL_ARGS,
    MAX_SHARED_BYTES, MAX_THREADS_PER_BLOCK,
};
use virtio_queue::desc::split::Descriptor;
use vm_memory::Bytes;

use crate::chain::{Chain, GuestMem, Layout};
use crate::device::{check_shape, elapsed_ns, parse_request, Outcome, Vgpu, HEADER_BUF};
use crate::error::RequestError;
use crate::timeline;

/// A launch that passed the device's checks, ready for the backend.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Checked {
    /// The function handle.
    pub function: u64,
    /// The geometry.
    pub config: LaunchConfig,
    /// Thread block cluster in blocks (`NO_CLUSTER` for none).
    pub cluster: [u32; 3],
    /// The typed arguments (the first `count`).
    pub args: [ArgValue; MAX_KERNEL_ARGS as usize],
    /// How many arguments there are.
    pub count: usize,
    /// Whether an argument is a by-value blob (the request's blob bytes go along).
    pub blobs: bool,
    /// The launch's priority rank (hardware slots).
    pub rank: u32,
}

impl Default for Checked {
    fn default() -> Self {
        Self {
            function: 0,
            config: LaunchConfig {
                grid: [1; 3],
                block: [1; 3],
                shared_bytes: 0,
            },
            cluster: vgpu_backend::NO_CLUSTER,
            args: [ArgValue::U32(0); MAX_KERNEL_ARGS as usize],
            count: 0,
            blobs: false,
            rank: 0,
        }
    }
}

impl Checked {
    /// The arguments.
    pub fn args(&self) -> &[ArgValue] {
        self.args.get(..self.count).unwrap_or(&[])
    }

    /// The backend's launch, with the request's parameter `blob` where an argument is one.
    pub fn launch<'a>(&'a self, blob: &'a [u8]) -> Launch<'a> {
        Launch {
            function: self.function,
            config: self.config,
            cluster: self.cluster,
            args: self.args(),
            blob: if self.blobs { blob } else { &[] },
        }
    }
}

impl Vgpu {
    /// The device's checks of a launch: flags, geometry, dependencies, every argument's
    /// kind and the blob arguments against the blob and the function's parameters (the
    /// backend checks the arguments against the function again, and every pointer).
    pub(crate) fn check_launch(&self, l: &LaunchRequest<'_>) -> Result<Checked, RequestError> {
        let op = Opcode::Launch;
        let la = &l.launch;
        let cluster = la
            .cluster()
            .map_err(|e| RequestError::invalid(op, e.to_string()))?;
        if cluster != vgpu_backend::NO_CLUSTER && self.space.features & features::CLUSTERS == 0 {
            return Err(RequestError::NotSupported {
                opcode: op.name(),
                why: "this device runs no thread block clusters (capability bit CLUSTERS is clear); use a cuda vGPU on a GPU of compute capability 9.0 or newer",
            });
        }
        if la.grid.contains(&0) || la.block.contains(&0) {
            return Err(RequestError::invalid(
                op,
                format!(
                    "grid {:?} and block {:?} must be >= 1 in every dimension",
                    la.grid, la.block
                ),
            ));
        }
        // Three u32 factors can overflow u64 (fuzzing found it: a plain product panics in
        // debug builds and wraps in release, where a wrapped count could pass the check).
        let threads = la
            .block
            .iter()
            .try_fold(1u64, |n, v| n.checked_mul(u64::from(*v)))
            .unwrap_or(u64::MAX);
        if threads > MAX_THREADS_PER_BLOCK {
            return Err(RequestError::invalid(
                op,
                format!("block of {threads} threads; at most {MAX_THREADS_PER_BLOCK}"),
            ));
        }
        if la.shared_bytes > MAX_SHARED_BYTES {
            return Err(RequestError::invalid(
                op,
                format!(
                    "{} bytes of shared memory; at most {MAX_SHARED_BYTES}",
                    la.shared_bytes
                ),
            ));
        }
        if l.deps.iter().any(|d| d == 0 || d == la.task_id) {
            return Err(RequestError::invalid(
                op,
                "dependency task ids must be non-zero and not the launch's own task id",
            ));
        }
        let mut c = Checked {
            function: la.function,
            config: LaunchConfig {
                grid: la.grid,
                block: la.block,
                shared_bytes: la.shared_bytes,
            },
            cluster,
            rank: la.rank,
            ..Checked::default()
        };
        // Bytes of the BLOB arguments together, and the last one's index.
        let (mut blob_total, mut last_blob) = (0u64, None);
        for (slot, (index, arg)) in c.args.iter_mut().zip(l.args.iter().enumerate()) {
            *slot = arg
                .typed()
                .map_err(|err| RequestError::KernelArg { index, err })?;
            if let ArgValue::Blob { offset, len } = *slot {
                if self.space.features & features::PARAM_BLOBS == 0 {
                    return Err(RequestError::NotSupported {
                        opcode: op.name(),
                        why: "this device runs no guest code, so no function takes a by-value parameter over 8 bytes (capability bit PARAM_BLOBS is clear); use a cuda vGPU",
                    });
                }
                l.blob_bytes(offset, len).ok_or(RequestError::KernelArg {
                    index,
                    err: ArgError::BlobOutside {
                        offset: u64::from(offset),
                        len,
                    },
                })?;
                blob_total += u64::from(len);
                last_blob = Some(index);
            }
            c.count += 1;
        }
        if let Some(index) = last_blob {
            if blob_total > u64::from(vgpu_proto::MAX_PARAM_BLOB_BYTES) {
                return Err(RequestError::KernelArg {
                    index,
                    err: ArgError::BlobsTooLarge(blob_total),
                });
            }
        }
        c.blobs = last_blob.is_some();
        if c.blobs {
            // Each blob must be exactly its parameter's bytes (where the backend reports the
            // layout; it checks again when it packs the parameters).
            if let Ok(params) = self.backend.modules().param_layout(la.function) {
                for (index, v) in c.args().iter().enumerate() {
                    if let ArgValue::Blob { len, .. } = *v {
                        let param = params.get(index).map_or(0, |(_, size)| size);
                        if param != len {
                            return Err(RequestError::KernelArg {
                                index,
                                err: ArgError::BlobSizeMismatch { len, param },
                            });
                        }
                    }
                }
            }
        }
        Ok(c)
    }

    /// The backend call of one checked launch (`blob`: the request's parameter blob).
    fn call_backend(&self, c: &Checked, blob: &[u8]) -> vgpu_backend::Result<LaunchStats> {
        vgpu_backend::one_result(self.backend.launch(&[c.launch(blob)]))
    }

    /// A launch alone: checks, a hardware slot, the scheduler's grant, the backend call.
    pub(crate) fn launch(&self, l: &LaunchRequest<'_>) -> Outcome {
        let c = self.check_launch(l)?;
        // A hardware queue first (ranked by the guest's HEFT rank), then the GPU's
        // scheduler.
        let _slot = self.slots.as_ref().map(|s| s.acquire(c.rank));
        let expect = self.kernel_times.expect(c.function);
        let _permit = timeline::acquire_for(&*self.gate, Resource::Compute, expect);
        let call = Instant::now();
        let stats = self.call_backend(&c, l.blob)?;
        self.kernel_times.record(c.function, elapsed_ns(call));
        self.stats.kernel(stats.device_ns);
        Ok([stats.device_ns, 0, 0, 0])
    }
}

/// Whether `chain` is a LAUNCH request, from its header's opcode alone (the full checks
/// come when it is served).
pub(crate) fn is_launch(mem: &GuestMem, chain: &Chain<'_>) -> bool {
    let Some(header) = chain.clone().next() else {
        return false;
    };
    if header.is_write_only() || header.len() < 4 {
        return false;
    }
    matches!(mem.read_obj::<u32>(header.addr()), Ok(op) if u32::from_le(op) == Opcode::Launch as u32)
}

/// One request of a batch.
#[derive(Debug, Default)]
struct Item {
    /// The chain's head index (for the used ring).
    head: u16,
    /// When it came off the available ring (timeline clock; 0: not recorded).
    kick: u64,
    /// When it came off the available ring.
    start: Option<Instant>,
    /// The guest's request id.
    id: u64,
    /// Where its response goes.
    resp: Option<Descriptor>,
    /// Bytes of its writable data descriptors.
    data_writable_len: u64,
    /// Its answer: an error from the checks, else the kernel's once the batch ran.
    outcome: Option<Outcome>,
    /// The launch, when it passed the checks.
    checked: Checked,
    /// Its parameter blob (when an argument is a blob); the capacity is kept.
    blob: Vec<u8>,
    /// Whether it went to the GPU under the batch's grant.
    ran: bool,
    /// The used length of its completion.
    used: u32,
}

/// The launches a queue thread is gathering, and then their completions. Kept by the queue
/// thread between batches, so that a warm queue allocates nothing for its requests.
#[derive(Debug, Default)]
pub(crate) struct LaunchBatch {
    items: Vec<Item>,
    len: usize,
    /// Launches that passed the checks.
    launches: usize,
    /// Their expected times together, as the batch limit counts them.
    window_ns: u64,
    /// Their expected times together, as known (the grant's estimate).
    expect_ns: u64,
    /// The batch's grant on the timeline: asked, granted, backend call ended, released.
    stages: [u64; 4],
}

impl LaunchBatch {
    /// Empties the batch (keeping its memory).
    pub fn clear(&mut self) {
        self.len = 0;
        self.launches = 0;
        self.window_ns = 0;
        self.expect_ns = 0;
        self.stages = [0; 4];
    }

    /// Requests in the batch.
    pub fn len(&self) -> usize {
        self.len
    }

    /// The completions, in ring order: (head index, used length).
    pub fn completions(&self) -> impl Iterator<Item = (u16, u32)> + '_ {
        self.items.iter().take(self.len).map(|i| (i.head, i.used))
    }

    /// Puts every request of the batch on the timeline, completed at `used`.
    pub fn record_timeline(&self, vgpu: u32, queue: u16, used: u64) {
        if !timeline::enabled() {
            return;
        }
        let [asked, granted, backend_end, released] = self.stages;
        for i in self.items.iter().take(self.len) {
            let stages = if i.ran {
                (1, asked, granted, backend_end, released)
            } else {
                (0, 0, 0, 0, 0)
            };
            timeline::push(timeline::Record {
                vgpu,
                queue,
                resource: stages.0,
                kick: i.kick,
                asked: stages.1,
                granted: stages.2,
                backend_end: stages.3,
                released: stages.4,
                used,
            });
        }
    }

    /// The next item, reusing one of an earlier batch when there is one.
    fn next_item(&mut self) -> &mut Item {
        if self.items.len() <= self.len {
            self.items.push(Item::default());
        }
        let len = self.len;
        self.len += 1;
        let i = self.items.get_mut(len).unwrap_or_else(|| unreachable!());
        i.outcome = None;
        i.ran = false;
        i.used = 0;
        i.blob.clear();
        i
    }
}

thread_local! {
    /// This queue thread's batch (each queue has a thread of its own).
    static BATCH: RefCell<LaunchBatch> = RefCell::new(LaunchBatch::default());
}

/// Runs `f` with this thread's batch, emptied.
pub(crate) fn with_batch<R>(f: impl FnOnce(&mut LaunchBatch) -> R) -> R {
    BATCH.with(|b| {
        let mut b = b.borrow_mut();
        b.clear();
        f(&mut b)
    })
}

impl Vgpu {
    /// Adds the launch `chain` of `queue` to `batch`, checked as a lone launch would be (one
    /// that fails its checks joins with its error, to be answered in order). Gives the chain
    /// back, untouched, when it does not join: the batch is full (launches, or expected
    /// time: see [`crate::BatchLimits`]), the chain has no usable response descriptor, or
    /// it is not a launch after all; the caller serves it after the batch.
    pub(crate) fn stage<'m>(
        &self,
        mem: &'m GuestMem,
        chain: Chain<'m>,
        kick: u64,
        batch: &mut LaunchBatch,
    ) -> Result<(), Chain<'m>> {
        let limits = self.config.batch;
        if batch.len >= usize::from(limits.max_launches) {
            return Err(chain);
        }
        let start = Instant::now();
        let layout = Layout::of(mem, &chain);
        let Some(resp) = layout.response else {
            return Err(chain);
        };
        let mut buf = [0u8; HEADER_BUF];
        let (id, checked, blob) = match parse_request(mem, &layout, &mut buf) {
            Err((id, _, e)) => (id, Err(e), &[][..]),
            Ok((id, req @ Request::Launch(_))) => {
                let Request::Launch(l) = &req else {
                    return Err(chain);
                };
                let c = check_shape(&req, &layout).and_then(|()| self.check_launch(l));
                (id, c, l.blob)
            }
            Ok(_) => return Err(chain),
        };
        let mut cost = (0, 0);
        if let Ok(c) = &checked {
            let expect = self.kernel_times.expect(c.function);
            // A kernel not timed yet counts as the whole window.
            let window = if expect == 0 {
                limits.max_expected_ns
            } else {
                expect
            };
            if batch.launches > 0 && batch.window_ns.saturating_add(window) > limits.max_expected_ns
            {
                return Err(chain);
            }
            cost = (window, expect);
        }
        let head = chain.head_index();
        let item = batch.next_item();
        item.head = head;
        item.kick = kick;
        item.start = Some(start);
        item.id = id;
        item.resp = Some(resp);
        item.data_writable_len = layout.data_writable_len;
        match checked {
            Ok(c) => {
                item.checked = c;
                if c.blobs {
                    item.blob.extend_from_slice(blob);
                }
                batch.launches += 1;
                batch.window_ns = batch.window_ns.saturating_add(cost.0);
                batch.expect_ns = batch.expect_ns.saturating_add(cost.1);
            }
            Err(e) => item.outcome = Some(Err(e)),
        }
        Ok(())
    }

    /// Runs the batch's launches under one grant, then writes every response (in order);
    /// the caller puts the completions in the used ring.
    pub(crate) fn run_batch(&self, queue: u16, mem: &GuestMem, batch: &mut LaunchBatch) {
        let first = batch.items.first().and_then(|i| i.start);
        if batch.launches > 0 {
            self.run_launches(batch);
        }
        // The batch's time counts once in the busy time: each request gets an even share.
        let share = first.map_or(0, elapsed_ns) / (batch.len.max(1) as u64);
        for i in batch.items.iter_mut().take(batch.len) {
            let outcome = i.outcome.take().unwrap_or_else(|| {
                Err(RequestError::Backend(vgpu_backend::BackendError::Device(
                    "the launch was not run; retry it".into(),
                )))
            });
            i.used = match &i.resp {
                Some(resp) => self.respond(
                    queue,
                    mem,
                    (resp, i.data_writable_len),
                    (i.id, Opcode::Launch.name()),
                    outcome,
                    || share,
                ),
                None => 0,
            };
        }
    }

    /// The backend call of the batch's checked launches under one hardware slot and one
    /// grant (its hold, the whole call, is charged to the vGPU).
    fn run_launches(&self, batch: &mut LaunchBatch) {
        let items = batch.items.get_mut(..batch.len).unwrap_or_default();
        let rank = items
            .iter()
            .find(|i| i.outcome.is_none())
            .map_or(0, |i| i.checked.rank);
        let _slot = self.slots.as_ref().map(|s| s.acquire(rank));
        let asked = timeline::stamp();
        let permit = self.gate.acquire_for(Resource::Compute, batch.expect_ns);
        let granted = timeline::stamp();
        let call = Instant::now();
        let results = if batch.launches == 1 {
            // One launch: the backend's own path for it, exactly as alone.
            items
                .iter()
                .filter(|i| i.outcome.is_none())
                .map(|i| self.call_backend(&i.checked, &i.blob))
                .collect()
        } else {
            let launches: Vec<Launch<'_>> = items
                .iter()
                .filter(|i| i.outcome.is_none())
                .map(|i| i.checked.launch(&i.blob))
                .collect();
            self.backend.launch(&launches)
        };
        let wall = elapsed_ns(call);
        let backend_end = timeline::stamp();
        drop(permit);
        batch.stages = [asked, granted, backend_end, timeline::stamp()];
        // Each kernel's usual time: its device time and an even part of what the call cost
        // beyond the kernels (launch, wait, wake-up), so that a batch's estimate is the sum.
        let (ran, device_ns) = results
            .iter()
            .filter_map(|r| r.as_ref().ok())
            .fold((0u64, 0u64), |(n, t), s| {
                (n + 1, t.saturating_add(s.device_ns))
            });
        let overhead = wall.saturating_sub(device_ns) / ran.max(1);
        let mut results = results.into_iter();
        for i in items.iter_mut().filter(|i| i.outcome.is_none()) {
            i.ran = true;
            let r = results.next().unwrap_or_else(|| {
                Err(vgpu_backend::BackendError::Device(
                    "the backend answered fewer launches than it was given".into(),
                ))
            });
            i.outcome = Some(match r {
                Ok(stats) => {
                    self.kernel_times
                        .record(i.checked.function, stats.device_ns.saturating_add(overhead));
                    self.stats.kernel(stats.device_ns);
                    Ok([stats.device_ns, 0, 0, 0])
                }
                Err(e) => Err(e.into()),
            });
        }
    }
}
