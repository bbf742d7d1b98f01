//! The built-in storage kernels on a CUDA GPU: GPU threads enqueue the NVMe reads
//! themselves (`backend/kernels/storage.cu`, BaM's queue and cache on the device).
//!
//! Per attached namespace, on first use, this backend sets up what the GPU threads touch:
//!
//! - a **device queue pair** on the namespace's controller ([`vgpu_storage::DeviceQueue`])
//!   whose SQ/CQ entries, and the **cache lines**, live in one page-aligned host region
//!   registered with CUDA (`cuMemHostRegister`, device-mapped): the emulated controller reads
//!   SQEs from it and DMAs data into it, the GPU writes SQEs and polls CQEs in it;
//! - the controller's **doorbell page**, registered the same way, so the tail-lock winner
//!   on the GPU rings the SQ doorbell itself; while a storage kernel runs, the controller
//!   thread is told to keep polling (a GPU store cannot wake it);
//! - one **device block** (`StorageBlock`, then the queue's turn counters and marks and the
//!   cache's state words) in device memory, where the GPU atomics work.
//!
//! The host checks every argument exactly as the sim backend does (same messages), then
//! launches; the kernel reports the first error in the block (index out of range, malformed
//! graph, NVMe error status, timeout) and the host turns it into the guest's status. A
//! timeout poisons the queue: later launches on that namespace fail at once, as on the sim.
//! The block, the region and the doorbell page are charged to the vGPU's ledger (entry
//! "storage") before they are set up, and returned when the setup goes (docs/memory.md,
//! "What is charged"); a namespace whose setup does not fit the share is refused with
//! `OUT_OF_MEMORY`.

use std::collections::BTreeMap;
use std::ffi::c_void;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use cudarc::driver::sys;
use vgpu_proto::builtin::{self, KernelSig};
use vgpu_proto::ArgValue;
use vgpu_storage::nvme::NvmeStatus;
use vgpu_storage::queue::queue_memory_bytes;
use vgpu_storage::{DeviceQueue, DmaRegion, DmaSlice};

use super::driver::{check, Context, CuError, DevBuf};
use super::lanes::Lane;
use super::modules::{Func, LoadedModule};
use super::CudaGpu;
use crate::args::{check_args, int, ptr};
use crate::error::{BackendError, Result};
use crate::space::Reserve;
use crate::storage::{array, check_bfs, check_elems, Opened, StorageSet, IO_TIMEOUT};
use crate::sync::lock;
use crate::HostRegion;

/// The storage kernels' PTX (`backend/kernels/storage.cu`, `build-ptx.sh`).
pub const STORAGE_PTX: &str = include_str!("../../kernels/storage.ptx");

/// Entries of the GPU's queue pair (at most 1023 commands in flight).
const DEPTH: u32 = 1024;
/// Bytes per cache line by default: one NVMe command, one page (PRP1 only).
const LINE: usize = 4096;

/// Bytes per cache line for a namespace with `block`-byte blocks: `VGPU_STORAGE_LINE_BYTES`
/// (a power of two from the block size to 4096, for 512-byte random-read workloads and
/// their benchmark), else [`LINE`]. A line never crosses a page, so one command with PRP1
/// alone always fills it.
fn line_bytes(block: u32) -> usize {
    let want = std::env::var("VGPU_STORAGE_LINE_BYTES")
        .ok()
        .and_then(|v| v.parse::<usize>().ok());
    match want {
        Some(l) if l.is_power_of_two() && l >= block as usize && l <= LINE => l,
        Some(l) => {
            tracing::warn!(
                line = l,
                block,
                "VGPU_STORAGE_LINE_BYTES must be a power of two from the block size to 4096; using 4096"
            );
            LINE
        }
        None => LINE,
    }
}
/// Cache lines per namespace on the GPU (64 MiB of pinned host memory).
const LINES: usize = 16384;
/// Threads per block of the storage kernels.
const BLOCK: u32 = 256;
/// Most blocks per launch: 8192 threads, 256 warps. A warp pins at most one line per
/// distinct line its lanes ask for (32), so at most half the lines are ever pinned at once
/// and a miss always finds a victim.
const MAX_BLOCKS: u64 = (LINES / 2 / BLOCK as usize) as u64;

/// Blocks per launch by default: 4096 threads. On the H200, cold random reads peak at 8-16
/// blocks (more threads contend on the queue's locks), cache hits and scans keep scaling to
/// 32 (docs/PERFORMANCE.md); 16 is the compromise.
const DEFAULT_BLOCKS: u64 = 16;

/// Blocks per launch: `VGPU_STORAGE_BLOCKS` (1..=MAX_BLOCKS, for tuning and benchmark
/// sweeps), else DEFAULT_BLOCKS.
fn max_blocks() -> u64 {
    static BLOCKS: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *BLOCKS.get_or_init(|| {
        std::env::var("VGPU_STORAGE_BLOCKS")
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
            .map_or(DEFAULT_BLOCKS, |b| b.clamp(1, MAX_BLOCKS))
    })
}
/// Most namespace lines the device keeps a state word for (64 GiB at 4 KiB lines; 128 MiB
/// of device memory).
const MAX_PAGES: u64 = 1 << 24;

// Error words of storage.cu.
const E_TIMEOUT: u64 = 1;
const E_STATUS: u64 = 2;
const E_INDEX: u64 = 3;
const E_EXHAUSTED: u64 = 4;
const E_GRAPH: u64 = 5;
const E_POISONED: u64 = 6;
const E_REFS: u64 = 7;

/// `struct Storage` of storage.cu, field for field (all 8 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct StorageBlock {
    ticket: u64,
    tail: u64,
    sq_head: u64,
    cq_head: u64,
    tail_lock: u64,
    cq_lock: u64,
    poisoned: u64,
    error: u64,
    error_arg: u64,
    nvme_status: u64,
    changed: u64,
    hand: u64,
    hits: u64,
    misses: u64,
    evictions: u64,
    commands: u64,
    turns: u64,
    tail_mark: u64,
    sq_free_mark: u64,
    done: u64,
    sq: u64,
    cq: u64,
    sq_db: u64,
    cq_db: u64,
    pages: u64,
    owner: u64,
    referenced: u64,
    slot_lock: u64,
    lines: u64,
    lines_iova: u64,
    npages: u64,
    ns_bytes: u64,
    timeout_ns: u64,
    depth: u64,
    log2: u64,
    line_bytes: u64,
    nlines: u64,
    nsid: u64,
    block_bytes: u64,
    sq_lock: u64,
}

/// The leading words the kernels write (state and results), read back after each launch.
const RESULT_WORDS: usize = 16;
/// Byte offset of `error` (then `error_arg`, `nvme_status`, `changed`): cleared per launch.
const ERROR_OFFSET: u64 = 7 * 8;
/// Byte offset of `changed`.
const CHANGED_OFFSET: u64 = 10 * 8;

/// The storage module's entry points.
pub(super) struct StorageKernels {
    _module: LoadedModule,
    gather: Func,
    scan_sum: Func,
    bfs_level: Func,
}

impl std::fmt::Debug for StorageKernels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StorageKernels")
    }
}

impl StorageKernels {
    fn load(ctx: &Arc<Context>) -> Result<Self> {
        let module = LoadedModule::shipped(ctx, STORAGE_PTX, "storage")?;
        let get = |name: &str| module.entry(name, "storage");
        Ok(Self {
            gather: get("vgpu_storage_gather")?,
            scan_sum: get("vgpu_storage_scan_sum")?,
            bfs_level: get("vgpu_storage_bfs_level")?,
            _module: module,
        })
    }
}

/// What this backend set up for one namespace; see the module documentation.
struct GpuNamespace {
    opened: Arc<Opened>,
    /// Deleted from the controller first when dropped.
    queue: Option<DeviceQueue>,
    block: DevBuf,
    /// Queue entries, then the cache lines; registered with CUDA, mapped for the controller.
    region: Arc<DmaRegion>,
    doorbells: HostRegion,
    /// From the last launch: a timeout left commands in flight.
    poisoned: bool,
    ctx: Arc<Context>,
}

/// The memory one namespace's setup takes: host region (queue entries, then the cache
/// lines), device block, doorbell page.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Sizes {
    /// Bytes per cache line.
    line: usize,
    /// Namespace lines the device tracks.
    npages: u64,
    /// Queue entries at the start of the region.
    qbytes: usize,
    /// The host region, whole pages.
    region: usize,
    /// The device block.
    block: u64,
    /// The doorbell page.
    doorbells: usize,
}

impl Sizes {
    /// For a namespace of `bytes` bytes in `block_size`-byte blocks, with a `doorbells`-byte
    /// doorbell page.
    fn of(bytes: u64, block_size: u32, doorbells: usize) -> Result<Self> {
        let line = line_bytes(block_size);
        let npages = bytes.div_ceil(line as u64);
        if npages > MAX_PAGES {
            return Err(BackendError::NotSupported(format!(
                "a {bytes}-byte namespace is larger than the {} GiB the GPU cache tracks; attach a smaller namespace",
                (MAX_PAGES * line as u64) >> 30
            )));
        }
        let qbytes = queue_memory_bytes(DEPTH);
        let page = vgpu_storage::nvme::PAGE_SIZE;
        let (d, lines) = (u64::from(DEPTH), LINES as u64);
        let head = std::mem::size_of::<StorageBlock>() as u64;
        Ok(Self {
            line,
            npages,
            qbytes,
            region: (qbytes + line * LINES).div_ceil(page) * page,
            block: head + 4 * d * 8 + npages * 8 + 3 * lines * 8,
            doorbells,
        })
    }

    /// What the setup is charged: the block in whole pages, the region, the doorbells.
    fn charge(&self) -> u64 {
        let page = vgpu_storage::nvme::PAGE_SIZE as u64;
        self.block.div_ceil(page) * page + self.region as u64 + self.doorbells as u64
    }
}

/// The doorbell page of `ns`, which storage kernels on a CUDA GPU need.
fn doorbell_page(ns: &vgpu_storage::Namespace) -> Result<Arc<DmaRegion>> {
    ns.doorbell_page().ok_or_else(|| {
        BackendError::NotSupported("storage kernels on a CUDA GPU need the emulated controller (a VFIO controller's doorbells would have to be mapped to the GPU, which is not built); attach a file-backed namespace".into())
    })
}

impl GpuNamespace {
    fn new(ctx: &Arc<Context>, opened: Arc<Opened>) -> Result<Self> {
        let ns = &opened.ns;
        let page = doorbell_page(ns)?;
        let sizes = Sizes::of(ns.bytes(), ns.block_size(), page.len())?;
        let (line, npages, qbytes) = (sizes.line, sizes.npages, sizes.qbytes);
        let device_err = |what: &str, e: vgpu_storage::Error| {
            BackendError::Device(format!("setting up GPU storage access ({what}): {e}"))
        };
        let region = DmaRegion::host(qbytes + line * LINES)
            .map_err(|e| device_err("queue and cache memory", e))?;
        let host = HostRegion {
            addr: region.as_ptr() as usize,
            len: region.len(),
        };
        let doorbells = HostRegion {
            addr: page.as_ptr() as usize,
            len: page.len(),
        };
        // Registered (mapped) host memory, unregistered again if anything below fails.
        super::pinned::pin(&host, sys::CU_MEMHOSTREGISTER_DEVICEMAP).map_err(cuda)?;
        if let Err(e) = super::pinned::pin(&doorbells, sys::CU_MEMHOSTREGISTER_DEVICEMAP) {
            super::pinned::unpin(&host);
            return Err(cuda(e));
        }
        let undo = |e: BackendError| {
            super::pinned::unpin(&host);
            super::pinned::unpin(&doorbells);
            e
        };
        let host_dev = device_pointer(host.addr).map_err(|e| undo(cuda(e)))?;
        let db_dev = device_pointer(doorbells.addr).map_err(|e| undo(cuda(e)))?;
        if let Err(e) = ns.map_dma(&region) {
            return Err(undo(device_err("mapping for the controller", e)));
        }
        let queue = match ns.device_queue(
            DEPTH,
            DmaSlice::new(region.clone(), 0, qbytes).map_err(|e| undo(device_err("queue", e)))?,
        ) {
            Ok(q) => q,
            Err(e) => {
                let _ = ns.unmap_dma(&region);
                return Err(undo(device_err("creating the GPU's queue pair", e)));
            }
        };
        let d = u64::from(DEPTH);
        let lines = LINES as u64;
        let head = std::mem::size_of::<StorageBlock>() as u64;
        let bytes = sizes.block;
        let fail = |e: BackendError| {
            let _ = ns.unmap_dma(&region);
            undo(e)
        };
        let block = DevBuf::new(ctx, bytes as usize).map_err(|e| fail(cuda(e)))?;
        let b = block.ptr();
        let sq_db = db_dev + queue.sq_doorbell_offset();
        let cq_db = db_dev + queue.cq_doorbell_offset();
        let hdr = StorageBlock {
            turns: b + head,
            tail_mark: b + head + d * 8,
            sq_free_mark: b + head + 2 * d * 8,
            done: b + head + 3 * d * 8,
            sq: host_dev,
            cq: host_dev + queue.cq_offset(),
            sq_db,
            cq_db,
            pages: b + head + 4 * d * 8,
            owner: b + head + 4 * d * 8 + npages * 8,
            referenced: b + head + 4 * d * 8 + npages * 8 + lines * 8,
            slot_lock: b + head + 4 * d * 8 + npages * 8 + 2 * lines * 8,
            lines: host_dev + qbytes as u64,
            lines_iova: region.iova() + qbytes as u64,
            npages,
            ns_bytes: ns.bytes(),
            timeout_ns: IO_TIMEOUT.as_nanos() as u64,
            depth: d,
            log2: u64::from(DEPTH.trailing_zeros()),
            line_bytes: line as u64,
            nlines: lines,
            nsid: u64::from(ns.info().nsid),
            block_bytes: u64::from(ns.block_size()),
            ..StorageBlock::default()
        };
        let init = check(
            // SAFETY: `b` is our fresh allocation of `bytes` bytes; synchronous.
            unsafe { sys::cuMemsetD8_v2(b, 0, bytes as usize) },
            "cuMemsetD8",
        )
        .and_then(|()| {
            check(
                // SAFETY: copies the header (size_of::<StorageBlock>() <= bytes) from a live
                // local; synchronous.
                unsafe {
                    sys::cuMemcpyHtoD_v2(
                        b,
                        (&hdr as *const StorageBlock).cast(),
                        std::mem::size_of::<StorageBlock>(),
                    )
                },
                "cuMemcpyHtoD",
            )
        });
        if let Err(e) = init {
            drop(queue);
            return Err(fail(cuda(e)));
        }
        tracing::info!(
            qid = queue.qid(),
            depth = DEPTH,
            lines = LINES,
            line,
            npages,
            device_bytes = bytes,
            "GPU storage queue pair and cache ready"
        );
        Ok(Self {
            opened,
            queue: Some(queue),
            block,
            region,
            doorbells,
            poisoned: false,
            ctx: ctx.clone(),
        })
    }

    fn results(&self, lane: &Lane) -> std::result::Result<[u64; RESULT_WORDS], CuError> {
        let mut out = [0u64; RESULT_WORDS];
        check(
            // SAFETY: reads RESULT_WORDS words at the start of our block into `out`, which
            // outlives the synchronisation below.
            unsafe {
                sys::cuMemcpyDtoHAsync_v2(
                    out.as_mut_ptr().cast(),
                    self.block.ptr(),
                    RESULT_WORDS * 8,
                    lane.stream.raw(),
                )
            },
            "cuMemcpyDtoHAsync",
        )?;
        lane.stream.synchronize()?;
        Ok(out)
    }

    /// Queues the clearing of the error and `changed` words before a launch.
    fn clear_errors(&self, lane: &Lane) -> std::result::Result<(), CuError> {
        check(
            // SAFETY: 8 words (error, error_arg, nvme_status, changed) inside our block.
            unsafe {
                sys::cuMemsetD32Async(self.block.ptr() + ERROR_OFFSET, 0, 8, lane.stream.raw())
            },
            "cuMemsetD32Async",
        )
    }
}

impl Drop for GpuNamespace {
    fn drop(&mut self) {
        // The controller forgets the queue first: nothing fetches SQEs from the region after.
        drop(self.queue.take());
        if self.ctx.bind().is_ok() {
            super::pinned::unpin(&HostRegion {
                addr: self.region.as_ptr() as usize,
                len: self.region.len(),
            });
            super::pinned::unpin(&self.doorbells);
        }
        if self.poisoned {
            // A timed-out read may still land in the lines: the controller keeps the region
            // (and so the memory) mapped until the namespace closes.
            tracing::warn!(
                "GPU storage queue was poisoned; its memory stays mapped until the namespace closes"
            );
        } else if let Err(e) = self.opened.ns.unmap_dma(&self.region) {
            tracing::warn!(error = %e, "unmapping GPU storage memory failed");
        }
    }
}

fn cuda(e: CuError) -> BackendError {
    BackendError::Device(format!("setting up GPU storage access: {e}"))
}

/// The GPU's address of registered host memory at `addr`.
fn device_pointer(addr: usize) -> std::result::Result<u64, CuError> {
    super::driver::host_device_pointer(addr as *mut c_void)
}

/// One launch of `f` with 8-byte parameters (pointers checked by the caller, who holds
/// their allocations until the stream is synchronised).
fn launch(lane: &Lane, f: Func, grid: u64, params: &mut [u64]) -> std::result::Result<(), CuError> {
    let grid = u32::try_from(grid.clamp(1, max_blocks())).unwrap_or(1);
    super::builtin::launch_u64(f, grid, BLOCK, lane, params)
}

/// Blocks for `work` items, one thread each.
fn blocks(work: u64) -> u64 {
    work.div_ceil(u64::from(BLOCK))
}

/// A namespace's setup: the opened namespace it is for, the setup, and the bytes it is
/// charged.
type NamespaceEntry = (Arc<Opened>, Arc<Mutex<GpuNamespace>>, u64);

/// The storage state of one CUDA backend: the module, loaded on first use, and one
/// [`GpuNamespace`] per namespace used (each behind its own lock: one storage kernel at a
/// time per namespace, since the result words are shared).
#[derive(Default)]
pub(super) struct GpuStorage {
    set: Option<Arc<StorageSet>>,
    kernels: Mutex<Option<Arc<StorageKernels>>>,
    /// Per namespace id: the opened namespace it was set up for, and the setup.
    namespaces: Mutex<BTreeMap<u64, NamespaceEntry>>,
}

impl std::fmt::Debug for GpuStorage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuStorage")
            .field("set", &self.set)
            .finish_non_exhaustive()
    }
}

impl GpuStorage {
    pub(super) fn new(set: Option<Arc<StorageSet>>) -> Self {
        Self {
            set,
            ..Self::default()
        }
    }

    pub(super) fn set(&self) -> Option<&Arc<StorageSet>> {
        self.set.as_ref()
    }
}

impl CudaGpu {
    fn storage_kernels(&self) -> Result<Arc<StorageKernels>> {
        let mut k = lock(&self.storage.kernels);
        if let Some(k) = &*k {
            return Ok(k.clone());
        }
        let t = Instant::now();
        let loaded = Arc::new(StorageKernels::load(&self.ctx)?);
        tracing::info!(
            jit_ms = t.elapsed().as_millis() as u64,
            "storage kernels loaded"
        );
        *k = Some(loaded.clone());
        Ok(loaded)
    }

    /// This backend's setup for namespace `ns` (opened by the guest's attach). The map's
    /// lock is never held while a namespace's own lock is (a long kernel on one namespace
    /// does not hold up another's first launch).
    fn gpu_namespace(&self, ns: u64, opened: &Arc<Opened>) -> Result<Arc<Mutex<GpuNamespace>>> {
        let mut map = lock(&self.storage.namespaces);
        if let Some((o, g, _)) = map.get(&ns) {
            if Arc::ptr_eq(o, opened) {
                return Ok(g.clone());
            }
        }
        let sizes = Sizes::of(
            opened.ns.bytes(),
            opened.ns.block_size(),
            doorbell_page(&opened.ns)?.len(),
        )?;
        let charge = sizes.charge();
        let ledger = self.mem.ledger();
        ledger
            .charge_reserve(Reserve::Storage, charge)
            .inspect_err(|e| {
                tracing::info!(namespace = ns, charge, error = %e,
                    "GPU storage setup refused: it does not fit the vGPU's memory share");
            })?;
        let g = match GpuNamespace::new(&self.ctx, opened.clone()) {
            Ok(g) => Arc::new(Mutex::new(g)),
            Err(e) => {
                ledger.uncharge_reserve(Reserve::Storage, charge);
                return Err(e);
            }
        };
        tracing::info!(
            namespace = ns,
            charge,
            "GPU storage setup charged to the vGPU"
        );
        if let Some((_, _, old)) = map.insert(ns, (opened.clone(), g.clone(), charge)) {
            ledger.uncharge_reserve(Reserve::Storage, old);
        }
        Ok(g)
    }

    /// Runs storage kernel `sig`; returns its time in ns.
    pub(super) fn run_storage(
        &self,
        lane: &mut Lane,
        sig: &'static KernelSig,
        args: &[ArgValue],
    ) -> Result<u64> {
        check_args(sig, args)?;
        let Some(set) = self.storage.set() else {
            return Err(BackendError::NotSupported(format!(
                "{}: this vGPU has no storage namespaces; the operator attaches them with `storage` in the vGPU's spec",
                sig.name
            )));
        };
        let start = Instant::now();
        let ns_id = int(args, 0);
        let opened = set.get(ns_id)?;
        let kernels = self.storage_kernels()?;
        let g = self.gpu_namespace(ns_id, &opened)?;
        let mut g = lock(&g);
        if g.poisoned {
            return Err(BackendError::Device(format!(
                "{}: storage I/O failed: an earlier command on namespace {ns_id} timed out and poisoned the GPU's queue pair; recreate the vGPU to reopen it",
                sig.name
            )));
        }
        let _poll = opened.ns.keep_polling();
        let block = g.block.ptr();
        let name = sig.name;
        // Counters for the debug log only: no extra device round trip otherwise.
        let debug = tracing::enabled!(tracing::Level::DEBUG);
        let before = if debug { g.results(lane).ok() } else { None };
        match name {
            n if n == builtin::STORAGE_GATHER.name => {
                let (base, idx, dst) = (int(args, 1), ptr(args, 2), ptr(args, 3));
                let (n, eb) = (int(args, 4), int(args, 5));
                check_elems(name, &opened, base, None, eb)?;
                let _i = self.extent(idx, n, 8)?;
                let _d = self.extent(dst, n, eb)?;
                if n > 0 {
                    g.clear_errors(lane).map_err(|e| self.cuda_err(e))?;
                    let mut p = [block, base, idx, dst, n, eb];
                    launch(lane, kernels.gather, blocks(n), &mut p)
                        .map_err(|e| self.launch_err(e, name))?;
                    self.finish(&mut g, lane, name, base, eb)?;
                }
            }
            n if n == builtin::STORAGE_SCAN_SUM.name => {
                let (base, n, eb, out) = (int(args, 1), int(args, 2), int(args, 3), ptr(args, 4));
                check_elems(name, &opened, base, Some(n), eb)?;
                let _o = self.extent(out, 1, 8)?;
                check(
                    // SAFETY: 8 bytes at `out`, inside a live allocation (`_o`, held).
                    unsafe { sys::cuMemsetD32Async(out, 0, 2, lane.stream.raw()) },
                    "cuMemsetD32Async",
                )
                .map_err(|e| self.cuda_err(e))?;
                g.clear_errors(lane).map_err(|e| self.cuda_err(e))?;
                let mut p = [block, base, n, eb, out];
                launch(lane, kernels.scan_sum, blocks(n), &mut p)
                    .map_err(|e| self.launch_err(e, name))?;
                self.finish(&mut g, lane, name, base, eb)?;
            }
            n if n == builtin::STORAGE_BFS.name => {
                self.bfs(&mut g, lane, &kernels, &opened, args)?;
            }
            other => return Err(BackendError::UnknownFunction(other.to_string())),
        }
        if let Some((before, Ok(after))) = before.map(|b| (b, g.results(lane))) {
            tracing::debug!(
                kernel = name,
                hits = after[12] - before[12],
                misses = after[13] - before[13],
                commands = after[15] - before[15],
                evictions = after[14] - before[14],
                "storage kernel done"
            );
        }
        Ok(start.elapsed().as_nanos() as u64)
    }

    /// Waits for the launch and turns the kernel's error word into the guest's status.
    fn finish(
        &self,
        g: &mut GpuNamespace,
        lane: &Lane,
        name: &str,
        base: u64,
        eb: u64,
    ) -> Result<[u64; RESULT_WORDS]> {
        let r = g.results(lane).map_err(|e| self.kernel_err(e, name))?;
        let (code, arg, status) = (r[7], r[8], r[9]);
        if r[6] != 0 {
            g.poisoned = true;
        }
        let count = g.opened.ns.bytes().saturating_sub(base) / eb.max(1);
        let io = |what: String| BackendError::Device(format!("{name}: storage I/O failed: {what}"));
        match code {
            0 => Ok(r),
            E_INDEX => Err(BackendError::KernelFault(format!(
                "{name}: idx[{arg}] is past the {count} elements from byte {base} of the namespace"
            ))),
            E_GRAPH => Err(BackendError::InvalidArgument(format!(
                "{name}: the graph is malformed at vertex {arg} (offsets must not decrease and stay within the edges, edge targets must be below vertices)"
            ))),
            E_STATUS => Err(io(format!(
                "controller returned an error status: {}",
                NvmeStatus::from_field(status as u16)
            ))),
            E_TIMEOUT | E_POISONED => Err(io(format!(
                "no completion within {IO_TIMEOUT:?}; the queue pair is poisoned, recreate the vGPU to reopen the namespace"
            ))),
            E_EXHAUSTED => Err(io(format!(
                "all {LINES} cache lines stayed referenced; this is a bug in the cache's sizing"
            ))),
            E_REFS => Err(io("cache line reference count overflow".into())),
            other => Err(io(format!("unknown error word {other}"))),
        }
    }

    fn bfs(
        &self,
        g: &mut GpuNamespace,
        lane: &Lane,
        kernels: &StorageKernels,
        opened: &Arc<Opened>,
        args: &[ArgValue],
    ) -> Result<()> {
        let name = builtin::STORAGE_BFS.name;
        let (offsets_base, edges_base) = (int(args, 1), int(args, 2));
        let (vertices, edges, source) = (int(args, 3), int(args, 4), int(args, 5));
        check_bfs(name, vertices, source)?;
        let levels = ptr(args, 6);
        let _l = self.extent(levels, vertices, 4)?;
        array::<u64>(name, opened, offsets_base, Some(vertices + 1))?;
        array::<u32>(name, opened, edges_base, Some(edges))?;
        let s = lane.stream.raw();
        check(
            // SAFETY: `vertices` u32 words at `levels` lie in a live allocation (`_l`, held),
            // and `source < vertices`; queued on our stream.
            unsafe {
                let n = usize::try_from(vertices).unwrap_or(0);
                let rc = sys::cuMemsetD32Async(levels, u32::MAX, n, s);
                if rc == sys::CUresult::CUDA_SUCCESS {
                    sys::cuMemsetD32Async(levels + 4 * source, 0, 1, s)
                } else {
                    rc
                }
            },
            "cuMemsetD32Async",
        )
        .map_err(|e| self.cuda_err(e))?;
        let block = g.block.ptr();
        for cur in 0..vertices {
            g.clear_errors(lane).map_err(|e| self.cuda_err(e))?;
            let mut p = [
                block,
                offsets_base,
                edges_base,
                vertices,
                edges,
                cur,
                levels,
            ];
            launch(lane, kernels.bfs_level, blocks(vertices), &mut p)
                .map_err(|e| self.launch_err(e, name))?;
            let r = self.finish(g, lane, name, offsets_base, 8)?;
            if r[(CHANGED_OFFSET / 8) as usize] == 0 {
                break;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_namespace_setup_is_charged_its_region_block_and_doorbells() {
        let s = Sizes::of(1 << 30, 512, 4096).expect("sizes");
        assert_eq!(s.line, LINE);
        assert_eq!(s.npages, (1 << 30) / LINE as u64);
        // 64 MiB of cache lines after the queue entries, whole pages.
        assert_eq!(s.region, queue_memory_bytes(DEPTH) + LINES * LINE);
        let block_pages = s.block.div_ceil(4096) * 4096;
        assert_eq!(s.charge(), block_pages + s.region as u64 + 4096);
        assert!(s.charge() > 64 << 20, "{}", s.charge());
        assert!(
            Sizes::of(u64::MAX, 512, 4096).is_err(),
            "too large to track"
        );
    }
}
