//! The library's one vGPU: the transport, its queues, and every object a program created
//! (contexts, allocations, host memory, modules, functions, streams, events), behind one
//! lock. Handles given to C are small integers cast to pointers, looked up here; a handle
//! that is not live is refused, never dereferenced.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use guest_driver::{DmaRegion, StreamOptions, Transport, VgpuDevice};
use vgpu_proto::DeviceInfo;

use crate::image::Signature;
use crate::queue::Queue;
use crate::transport::AnyTransport;
use crate::types::{res, CUresult};

/// Bounce buffer for copies from and to memory outside the DMA pool.
pub const STAGING_BYTES: usize = 4 << 20;
/// First handle value (0 is NULL; 1 and 2 are CU_STREAM_LEGACY / CU_STREAM_PER_THREAD).
const FIRST_HANDLE: u64 = 0x1000;
/// How long a request may take before the library gives up on the device (a kernel may
/// legitimately run long).
const TIMEOUT_NS: u64 = 600_000_000_000;

pub type Res<T> = Result<T, CUresult>;

/// A queue shared between the driver and threads waiting on it.
pub type SharedQueue = Arc<Mutex<Queue>>;

/// Locks a queue (a panic while it was held left it consistent: every step of a queue
/// completes or leaves the request pending).
pub fn lock(q: &SharedQueue) -> MutexGuard<'_, Queue> {
    q.lock().unwrap_or_else(|e| e.into_inner())
}

/// Waits for every queue of `queues`; returns the first asynchronous error.
pub fn sync_queues(t: &AnyTransport, queues: &[SharedQueue]) -> Res<()> {
    let mut first = Ok(());
    for q in queues {
        if let Err(e) = lock(q).sync(t) {
            if first.is_ok() {
                first = Err(e);
            }
        }
    }
    // Host functions the queues' work released run before the wait ends.
    crate::api::hostfn::gate_all();
    first
}

/// Looks up with the driver's lock held, then runs `wait` with only the queues' locks:
/// a thread blocked in a synchronising call lets other threads use the library.
pub fn wait_outside<L, R>(
    look: impl FnOnce(&mut Driver) -> Res<L>,
    wait: impl FnOnce(&AnyTransport, L) -> Res<R>,
) -> Res<R> {
    let (t, found) = with(|d| Ok((d.t.clone(), look(d)?)))?;
    wait(&t, found)
}

pub struct Context {
    pub primary: bool,
    pub flags: u32,
}

pub struct Alloc {
    pub size: u64,
    pub ctx: u64,
    pub id: u64,
    /// The module owning the range (a module variable from `cuModuleGetGlobal`), 0 for an
    /// allocation: `cuMemFree` refuses a module's range, unloading the module drops it.
    pub module: u64,
    /// A mapping of the virtual memory management API (`cuMemMap`): `cuMemFree` refuses
    /// it, `cuMemUnmap` drops it, and it outlives the context it was made in.
    pub vmm: bool,
}

pub struct HostAlloc {
    pub region: DmaRegion,
    pub size: usize,
    pub flags: u32,
    pub id: u64,
}

pub struct Module {
    pub device: u64,
    pub builtin: bool,
    pub entries: HashMap<String, Signature>,
    pub ptx: Option<String>,
}

pub struct Function {
    pub module: u64,
    pub device: u64,
    pub sig: Signature,
    /// The entry point's name (`cuFuncGetName`).
    pub name: String,
    /// `CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES`, as set.
    pub max_dynamic_shared: i32,
    /// `CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT`, as set (-1: none).
    pub carveout: i32,
    /// Registers, static shared, constant and local memory, as the device reported them
    /// (`features::FUNCTION_ATTRIBUTES`); None from a device that does not.
    pub attrs: Option<vgpu_proto::FunctionAttributes>,
    /// Thread block cluster settings the program made on the function.
    pub cluster: ClusterSettings,
}

/// A function's thread block cluster settings, as a program sets them
/// (`CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_*`, `..._NON_PORTABLE_CLUSTER_SIZE_ALLOWED`,
/// `..._CLUSTER_SCHEDULING_POLICY_PREFERENCE`, or the driver's cluster table).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClusterSettings {
    /// The cluster every launch of the function uses unless the launch names its own:
    /// all zero for none, else all positive.
    pub dims: [u32; 3],
    /// Clusters above the portable 8 blocks allowed.
    pub non_portable: bool,
    /// `CUclusterSchedulingPolicy` (0: default).
    pub policy: i32,
}

impl ClusterSettings {
    /// The cluster a launch without one of its own runs in (`[1, 1, 1]`: none).
    pub fn launch_dims(&self) -> [u32; 3] {
        if self.dims.contains(&0) {
            [1, 1, 1]
        } else {
            self.dims
        }
    }
}

pub struct StreamObj {
    pub queue: usize,
    pub flags: u32,
    pub ctx: u64,
}

pub struct EventObj {
    pub flags: u32,
    /// (queue, sequence number) of the latest record.
    pub recorded: Option<(usize, u64)>,
}

pub struct Driver {
    pub t: AnyTransport,
    _gpu: VgpuDevice<AnyTransport>,
    /// Each queue has its own lock (taken after the driver's), so a thread waiting for one
    /// queue does not hold the driver: see [`wait_outside`].
    queues: Vec<SharedQueue>,
    pub info: DeviceInfo,
    /// The physical GPU's attributes (`GET_ATTRIBUTES`), or the library's fixed values on a
    /// device that cannot report them.
    pub attributes: vgpu_proto::DeviceAttributes,
    pub primary: u64,
    pub primary_refs: u32,
    pub contexts: HashMap<u64, Context>,
    pub allocs: BTreeMap<u64, Alloc>,
    pub host: BTreeMap<usize, HostAlloc>,
    pub registered: BTreeMap<usize, usize>,
    /// Pool regions the GPU reaches at their host address (`host_map.rs`).
    pub host_mapped: crate::host_map::HostMapped,
    pub modules: HashMap<u64, Module>,
    pub functions: HashMap<u64, Function>,
    pub streams: HashMap<u64, StreamObj>,
    pub events: HashMap<u64, EventObj>,
    pub staging: Option<DmaRegion>,
    /// Libraries, memory pools, captures and graphs.
    pub extra: crate::extra::Extra,
    /// Reserved ranges, physical allocations and mappings (`api/vmm.rs`).
    pub vmm: crate::api::vmm::Vmm,
    /// Cluster occupancy the device answered, per function and shape
    /// (`api/cluster_occupancy.rs`).
    pub occupancy: crate::api::cluster_occupancy::Answers,
    next_handle: u64,
    next_queue: usize,
}

// SAFETY: the raw pointers inside (DMA regions, ring memory) point into mappings the
// transport owns for as long as the driver lives; every access goes through the one
// global mutex, so moving the driver between threads cannot race.
unsafe impl Send for Driver {}

static DRIVER: Mutex<Option<Driver>> = Mutex::new(None);
static INIT: OnceLock<CUresult> = OnceLock::new();
/// Why the first `init` found no vGPU.
static INIT_ERROR: OnceLock<String> = OnceLock::new();

/// Opens the vGPU once; later calls return the first call's result.
pub fn init() -> CUresult {
    *INIT.get_or_init(|| match Driver::open() {
        Ok(d) => {
            *lock_raw() = Some(d);
            res::SUCCESS
        }
        Err(e) => {
            tracing::error!("no vGPU: {e}");
            let _ = INIT_ERROR.set(e.to_string());
            res::NO_DEVICE
        }
    })
}

/// What `init` answered, and why it found no vGPU; `None` before the first `init`.
pub fn init_state() -> Option<(CUresult, Option<&'static str>)> {
    INIT.get()
        .map(|r| (*r, INIT_ERROR.get().map(String::as_str)))
}

fn lock_raw() -> MutexGuard<'static, Option<Driver>> {
    DRIVER.lock().unwrap_or_else(|e| e.into_inner())
}

/// Runs `f` on the driver; CUDA_ERROR_NOT_INITIALIZED before a successful `cuInit`,
/// CUDA_ERROR_DEVICE_UNAVAILABLE once the worker hung up.
pub fn with<R>(f: impl FnOnce(&mut Driver) -> Res<R>) -> Res<R> {
    if INIT.get() != Some(&res::SUCCESS) {
        return Err(res::NOT_INITIALIZED);
    }
    if crate::watch::gone() {
        return Err(res::DEVICE_UNAVAILABLE);
    }
    let mut guard = lock_raw();
    let d = guard.as_mut().ok_or(res::NOT_INITIALIZED)?;
    f(d)
}

impl Driver {
    fn open() -> Result<Self, crate::transport::OpenError> {
        use crate::transport::OpenError;
        let t = AnyTransport::open()?;
        crate::watch::watch(&t);
        let mut gpu = VgpuDevice::probe(t.clone()).map_err(OpenError::Device)?;
        let opts = StreamOptions {
            queue_size: crate::queue::STREAM_CAPACITY as u16,
            now_ns: crate::watch::now_ns,
            timeout_ns: TIMEOUT_NS,
            relax: crate::watch::relax,
            wake_after_ns: u64::MAX,
            learn: guest_driver::vgpu::no_learning,
        };
        let mut queues = Vec::new();
        for i in 0..gpu.num_queues() {
            let s = gpu.open_stream(i, opts).map_err(OpenError::Device)?;
            queues.push(Arc::new(Mutex::new(Queue::new(s))));
        }
        gpu.start().map_err(OpenError::Device)?;
        let first = queues
            .first()
            .ok_or(OpenError::Device(guest_driver::Error::NoSuchQueue(0)))?;
        let info = lock(first).stream().get_info().map_err(OpenError::Device)?;
        let attributes = if info.features & vgpu_proto::features::ATTRIBUTES != 0 {
            lock(first)
                .stream()
                .get_attributes()
                .map_err(OpenError::Device)?
        } else {
            crate::api::device::fixed_attributes(&info)
        };
        tracing::info!(
            name = info.name_str(),
            queues = queues.len(),
            memory = info.memory_share,
            "vGPU ready"
        );
        let mut d = Driver {
            t,
            _gpu: gpu,
            queues,
            info,
            attributes,
            primary: 0,
            primary_refs: 0,
            contexts: HashMap::new(),
            allocs: BTreeMap::new(),
            host: BTreeMap::new(),
            registered: BTreeMap::new(),
            host_mapped: Default::default(),
            modules: HashMap::new(),
            functions: HashMap::new(),
            streams: HashMap::new(),
            events: HashMap::new(),
            staging: None,
            extra: crate::extra::Extra::default(),
            vmm: Default::default(),
            occupancy: Default::default(),
            next_handle: FIRST_HANDLE,
            next_queue: 0,
        };
        d.primary = d.handle();
        d.contexts.insert(
            d.primary,
            Context {
                primary: true,
                flags: 0,
            },
        );
        d.map_pool();
        Ok(d)
    }

    /// A fresh handle value.
    pub fn handle(&mut self) -> u64 {
        let h = self.next_handle;
        self.next_handle += 0x10;
        h
    }

    /// The queue a new stream gets: round robin over the queues after queue 0 (which
    /// serves the default stream), or queue 0 when it is the only one.
    pub fn pick_queue(&mut self) -> usize {
        let n = self.num_queues();
        if n <= 1 {
            return 0;
        }
        let q = 1 + self.next_queue % (n - 1);
        self.next_queue += 1;
        q
    }

    /// The current context of this thread, checked live.
    pub fn current_ctx(&self) -> Res<u64> {
        let ctx = crate::context::current().ok_or(res::INVALID_CONTEXT)?;
        if self.contexts.contains_key(&ctx) {
            Ok(ctx)
        } else {
            Err(res::INVALID_CONTEXT)
        }
    }

    /// The context work on stream handle `h` runs in: a created stream's own (the driver
    /// needs no current context for it: a runtime's host callbacks and XLA's threads call
    /// with none), the current one for the default stream handles.
    pub fn stream_context(&self, h: usize) -> Res<u64> {
        match h {
            0 | crate::types::CU_STREAM_LEGACY | crate::types::CU_STREAM_PER_THREAD => {
                self.current_ctx()
            }
            _ => {
                let s = self.streams.get(&(h as u64)).ok_or(res::INVALID_HANDLE)?;
                if self.contexts.contains_key(&s.ctx) {
                    Ok(s.ctx)
                } else {
                    Err(res::INVALID_CONTEXT)
                }
            }
        }
    }

    /// The queue of stream handle `h` (0 and the two special handles: the default
    /// stream, queue 0) and whether it is the legacy default stream.
    pub fn stream_queue(&self, h: usize) -> Res<(usize, bool)> {
        match h {
            0 | crate::types::CU_STREAM_LEGACY => Ok((0, true)),
            crate::types::CU_STREAM_PER_THREAD => Ok((0, false)),
            _ => self
                .streams
                .get(&(h as u64))
                .map(|s| (s.queue, false))
                .ok_or(res::INVALID_HANDLE),
        }
    }

    /// The queue of stream handle `h`, with work about to go to it ordered as CUDA's
    /// legacy default stream demands ([`Driver::order_for`]; a stream created without
    /// `CU_STREAM_NON_BLOCKING` is blocking).
    pub fn ordered_queue(&mut self, h: usize) -> Res<usize> {
        let (q, legacy) = self.stream_queue(h)?;
        let blocking = self
            .streams
            .get(&(h as u64))
            .is_none_or(|s| s.flags & crate::types::CU_STREAM_NON_BLOCKING == 0);
        self.order_for(q, legacy, blocking);
        Ok(q)
    }

    /// Orders work about to go to `queue` as CUDA's legacy default stream demands: work on
    /// the default stream waits for every other queue, work on a blocking stream waits
    /// for the default stream's.
    pub fn order_for(&mut self, queue: usize, legacy: bool, blocking: bool) {
        let t = self.t.clone();
        // Host functions launched on the queue run before later work is sent.
        crate::api::hostfn::gate(queue);
        if legacy {
            crate::api::hostfn::gate_all();
            for (i, q) in self.queues.iter().enumerate() {
                if i != queue {
                    lock(q).wait_all_quiet(&t);
                }
            }
        } else if blocking && queue != 0 {
            crate::api::hostfn::gate(0);
            if let Some(q0) = self.queues.first() {
                lock(q0).wait_all_quiet(&t);
            }
        }
    }

    /// Waits for every queue; returns the first asynchronous error.
    pub fn sync_all(&mut self) -> Res<()> {
        sync_queues(&self.t, &self.queues)
    }

    /// Waits for every queue, leaving asynchronous errors for the next synchronising call.
    pub fn drain_all(&mut self) {
        let t = self.t.clone();
        for q in &self.queues {
            lock(q).wait_all_quiet(&t);
        }
    }

    pub fn num_queues(&self) -> usize {
        self.queues.len()
    }

    /// The queue at `i`, locked.
    pub fn queue(&self, i: usize) -> Res<MutexGuard<'_, Queue>> {
        self.queues.get(i).map(lock).ok_or(res::INVALID_HANDLE)
    }

    /// The queue at `i`, to wait on outside the driver's lock.
    pub fn shared_queue(&self, i: usize) -> Res<SharedQueue> {
        self.queues.get(i).cloned().ok_or(res::INVALID_HANDLE)
    }

    /// Every queue, to wait on outside the driver's lock.
    pub fn shared_queues(&self) -> Vec<SharedQueue> {
        self.queues.clone()
    }

    /// The live allocation holding `ptr` (base, allocation).
    pub fn alloc_of(&self, ptr: u64) -> Option<(u64, &Alloc)> {
        let (&base, a) = self.allocs.range(..=ptr).next_back()?;
        (ptr - base < a.size).then_some((base, a))
    }

    /// Checks `ptr..ptr + len` lies in one live allocation (CUDA_ERROR_INVALID_VALUE
    /// otherwise, as the real driver answers a bad device pointer).
    /// Pinned host memory the GPU reaches at its address counts as device memory here
    /// (unified addressing), as with the driver.
    pub fn check_device(&self, ptr: u64, len: u64) -> Res<()> {
        if self.alloc_of(ptr).is_none() && self.device_mapped(ptr, len) {
            return Ok(());
        }
        let (base, a) = self.alloc_of(ptr).ok_or(res::INVALID_VALUE)?;
        let end = ptr.checked_add(len).ok_or(res::INVALID_VALUE)?;
        if end <= base + a.size {
            Ok(())
        } else {
            Err(res::INVALID_VALUE)
        }
    }

    /// Checks `ptr..ptr + len` as [`check_device`](Self::check_device) does, but also
    /// accepts a range across neighbouring mappings of the virtual memory API (each is an
    /// allocation of its own on the device, though the program sees one contiguous range):
    /// `None` when the range lies in one allocation, else the pieces, each inside one
    /// mapping, for the caller to send one by one.
    pub fn check_pieces(&self, ptr: u64, len: u64) -> Res<Option<Vec<(u64, u64)>>> {
        let whole = self.check_device(ptr, len);
        if whole.is_ok() {
            return Ok(None);
        }
        let end = ptr.checked_add(len).ok_or(res::INVALID_VALUE)?;
        let mut pieces = Vec::new();
        let mut at = ptr;
        while at < end {
            let (base, a) = self.alloc_of(at).ok_or(res::INVALID_VALUE)?;
            if !a.vmm {
                return Err(res::INVALID_VALUE);
            }
            let n = (base + a.size).min(end) - at;
            pieces.push((at, n));
            at += n;
        }
        Ok(Some(pieces))
    }

    /// The host allocation (from the DMA pool) holding `ptr`: (base, allocation).
    pub fn host_of(&self, ptr: usize) -> Option<(usize, &HostAlloc)> {
        let (&base, h) = self.host.range(..=ptr).next_back()?;
        (ptr - base < h.size).then_some((base, h))
    }

    /// The registered host range holding `ptr`: (base, size).
    pub fn registered_of(&self, ptr: usize) -> Option<(usize, usize)> {
        let (&base, &size) = self.registered.range(..=ptr).next_back()?;
        (ptr - base < size).then_some((base, size))
    }

    /// The staging buffer, allocated on first use.
    pub fn staging(&mut self) -> Res<(*mut u8, u64)> {
        if self.staging.is_none() {
            let r = self
                .t
                .dma_alloc(STAGING_BYTES, 4096)
                .map_err(|_| res::OUT_OF_MEMORY)?;
            self.staging = Some(r);
        }
        let r = self.staging.as_ref().ok_or(res::OUT_OF_MEMORY)?;
        Ok((r.virt().as_ptr(), r.phys()))
    }
}
