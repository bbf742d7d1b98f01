//! The cuda backend: one NVIDIA GPU as one worker (one vGPU) sees it, through the CUDA
//! driver API (cudarc's bindings, libcuda loaded at run time, so everything builds and the
//! other backends run where CUDA is absent).
//!
//! - **One context per worker process**: the device's primary context. A worker serves one
//!   vGPU; contexts inside one process do not isolate (docs/architecture.md; `tests/isolation.rs`
//!   keeps that fact measured), so tenants never share a process.
//! - **Device memory** through the virtual memory management API at the vGPU's fixed
//!   address range (`memory.rs`): stable addresses for swap and migration.
//! - **Copies** go straight between guest RAM and the GPU: guest RAM is pinned once with
//!   `cuMemHostRegister` when the memory table arrives ([`HostMemory::register`](crate::HostMemory::register)),
//!   and each copy is `cuMemcpyHtoDAsync`/`DtoHAsync` from/to the guest buffer itself on the
//!   calling queue's stream; large copies are queued as `COPY_CHUNK` pieces (so copies of
//!   other queues interleave on the copy engines) and waited for once.
//! - **Kernels**: the built-ins from shipped PTX (`builtin.rs`), guest PTX through
//!   `MODULE_LOAD`; every pointer argument is checked against the allocation table before
//!   launch (invariant 3), the GPU's own fault isolation is the second line. Device time
//!   comes from events around the launch.
//! - **Faults**: a kernel that faults (illegal address and the like) loses the context: the
//!   launch answers `KERNEL_FAULT`, every later request `DEVICE_ERROR` saying so; other
//!   vGPUs (other processes) do not notice.

mod attributes;
mod batch;
mod builtin;
mod driver;
mod hard_limit;
#[cfg(test)]
mod hard_limit_tests;
mod lanes;
mod limits;
mod memory;
mod modules;
mod occupancy;
mod pinned;
mod relocation;
mod signal;
#[cfg(test)]
mod signal_tests;
mod storage;
mod tensor_map;
mod virtual_memory;
mod vmm;

use std::ffi::c_void;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cudarc::driver::sys::{self, CUresult};
use vgpu_proto::{backend_kind, features};
use vm_memory::VolatileSlice;

use crate::drain::InFlight;
use crate::error::{BackendError, Result};
use crate::{
    Allocated, Backend, BackendInfo, FunctionInfo, HostMemory, HostRegion, Launch, LaunchStats,
    MemoryUsage, ModuleImage, Paging, Relocatable, SharedMemory, DEFAULT_VA_BASE, DEFAULT_VA_SIZE,
};
use driver::{check, Context, CuError};
pub use hard_limit::{DEFAULT_KERNEL_LIMIT, EXIT_KERNEL_HARD_LIMIT};
use lanes::Lanes;
pub use limits::{ContextLimits, ContextReserve, DEFAULT_HEAP, DEFAULT_PRINTF_FIFO, DEFAULT_STACK};
use memory::DeviceMemory;
use modules::{Builtins, Kernel, Modules};
use pinned::Pinned;

use crate::space::Reserve;
use crate::sync::{lock, read, write};
pub use modules::BUILTIN_PTX;
pub use storage::STORAGE_PTX;

/// Host-device copies larger than this are queued as pieces of this size (Gdev's split
/// transaction): one wait for the whole copy, and other queues' copies interleave.
pub const COPY_CHUNK: usize = 8 << 20;

/// Dynamic shared memory a kernel gets without opting in (48 KiB).
const DEFAULT_SHARED: u32 = 48 << 10;

/// Which GPU and how much of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CudaConfig {
    /// CUDA device ordinal (as `nvidia-smi` numbers them unless CUDA_VISIBLE_DEVICES says
    /// otherwise).
    pub ordinal: i32,
    /// Most device memory this vGPU may have mapped, in bytes (capped at the GPU's).
    pub memory: u64,
    /// First device address.
    pub va_base: u64,
    /// Device address space size.
    pub va_size: u64,
    /// A live migration's target, created in the worker that serves the vGPU now: its
    /// memory is staged at other addresses until the switch
    /// ([`Relocatable::occupy_addresses`]), since the source holds the vGPU's range.
    pub migration_target: bool,
    /// Stack, heap and printf FIFO limits set on the context; what they reserve is charged
    /// to `memory` (docs/cuda.md, "Context reserve").
    pub limits: ContextLimits,
}

impl Default for CudaConfig {
    fn default() -> Self {
        Self {
            ordinal: 0,
            memory: 1 << 30,
            va_base: DEFAULT_VA_BASE,
            va_size: DEFAULT_VA_SIZE,
            migration_target: false,
            limits: ContextLimits::default(),
        }
    }
}

/// One GPU as the driver describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceDesc {
    pub ordinal: i32,
    pub name: String,
    /// Physical memory in bytes.
    pub memory: u64,
}

/// What [`CudaGpu::probe`] found.
#[derive(Clone, Debug)]
pub struct Probe {
    /// Number of CUDA devices.
    pub devices: i32,
    /// Name of device 0.
    pub name: String,
}

/// A CUDA GPU as one worker sees it.
#[derive(Debug)]
pub struct CudaGpu {
    info: BackendInfo,
    mem: DeviceMemory,
    modules: Modules,
    builtins: Builtins,
    lanes: Lanes,
    pinned: Pinned,
    inflight: InFlight,
    lost: AtomicBool,
    lost_why: Mutex<String>,
    /// Hard limit on a guest PTX kernel's run time.
    kernel_limit: Duration,
    /// Serialises raising a function's dynamic shared memory limit.
    attr_lock: Mutex<()>,
    /// Storage namespaces and what the GPU's storage kernels use of them.
    storage: storage::GpuStorage,
    /// What the context's limits reserve (charged to the ledger at start); a launch needing
    /// more local memory per thread than its stack is refused.
    reserve: ContextReserve,
    ctx: Arc<Context>,
}

impl CudaGpu {
    /// Whether this machine can run the cuda backend: libcuda loads, the driver is new
    /// enough and sees at least one GPU. The error says what is missing.
    pub fn probe() -> std::result::Result<Probe, String> {
        driver::init()?;
        let devices = driver::device_count().map_err(|e| e.to_string())?;
        if devices < 1 {
            return Err("the NVIDIA driver sees no GPU; check nvidia-smi".into());
        }
        let (_, props) = driver::device(0).map_err(|e| e.to_string())?;
        Ok(Probe {
            devices,
            name: props.name,
        })
    }

    /// Every GPU the driver sees, without creating a context (vgpud lists its GPUs with
    /// this; each worker then opens its own). The error says what is missing.
    pub fn devices() -> std::result::Result<Vec<DeviceDesc>, String> {
        driver::init()?;
        let n = driver::device_count().map_err(|e| e.to_string())?;
        (0..n)
            .map(|ordinal| {
                let (_, props) = driver::device(ordinal).map_err(|e| e.to_string())?;
                Ok(DeviceDesc {
                    ordinal,
                    name: props.name,
                    memory: props.total_memory,
                })
            })
            .collect()
    }

    /// Opens GPU `cfg.ordinal`, reserves the vGPU's address space and loads the built-in
    /// kernels.
    pub fn new(cfg: CudaConfig) -> Result<Self> {
        driver::init().map_err(BackendError::Device)?;
        let count = driver::device_count().map_err(memory::dev_err)?;
        if cfg.ordinal < 0 || cfg.ordinal >= count {
            return Err(BackendError::InvalidArgument(format!(
                "GPU {} does not exist: this machine has {count} CUDA device(s), numbered from 0",
                cfg.ordinal
            )));
        }
        if cfg.memory == 0 {
            return Err(BackendError::InvalidArgument(
                "the vGPU's device memory must be at least 1 byte".into(),
            ));
        }
        let (dev, props) = driver::device(cfg.ordinal).map_err(memory::dev_err)?;
        if !props.vmm {
            return Err(BackendError::NotSupported(format!(
                "GPU {} ({}) does not support CUDA virtual memory management, which the cuda backend needs for stable device addresses",
                cfg.ordinal, props.name
            )));
        }
        let ctx = Context::primary(dev).map_err(memory::dev_err)?;
        let capacity = cfg.memory.min(props.total_memory);
        let reserve = limits::apply(dev, &cfg.limits).map_err(memory::dev_err)?;
        let reserve_bytes = reserve.total().filter(|r| *r <= capacity).ok_or_else(|| {
            BackendError::ContextReserve {
                share: capacity,
                reserve: reserve.total().unwrap_or(u64::MAX),
                detail: reserve.detail(),
            }
        })?;
        let mem = DeviceMemory::new(
            &ctx,
            cfg.ordinal,
            cfg.va_base,
            cfg.va_size,
            capacity,
            cfg.migration_target,
        )?;
        mem.ledger()
            .charge_reserve(Reserve::Context, reserve_bytes)
            .map_err(|_| BackendError::ContextReserve {
                share: capacity,
                reserve: reserve_bytes,
                detail: reserve.detail(),
            })?;
        let t = Instant::now();
        let builtins = Builtins::load(&ctx)?;
        let attrs = attributes::read(dev);
        // Thread block clusters: compute capability 9.0 and newer.
        let clusters = if attrs.cc_major >= 9 {
            features::CLUSTERS
        } else {
            0
        };
        let info = BackendInfo {
            kind: backend_kind::CUDA,
            name: props.name.clone(),
            device_memory: props.total_memory,
            copy_bandwidth: 0,
            compute_units: props.sm_count,
            alloc_granularity: mem.granularity(),
            va_base: cfg.va_base,
            va_size: cfg.va_size,
            features: features::BUILTIN_KERNELS
                | features::PTX
                | features::BINARY_MODULES
                | features::ATTRIBUTES
                | features::PARAM_LAYOUT
                | features::GLOBALS
                | features::PARAM_BLOBS
                | features::FUNCTION_ATTRIBUTES
                | features::HOST_MAP
                | clusters
                | if clusters != 0 {
                    features::CLUSTER_OCCUPANCY
                } else {
                    0
                }
                | if attributes::tensor_maps(dev) {
                    features::TENSOR_MAPS
                } else {
                    0
                },
            attributes: vgpu_proto::DeviceAttributes {
                // The limits as the driver took them and the ledger charged them.
                stack_bytes: u32::try_from(reserve.stack_bytes).unwrap_or(u32::MAX),
                heap_kib: u32::try_from(reserve.heap_bytes >> 10).unwrap_or(u32::MAX),
                printf_fifo_kib: u32::try_from(reserve.printf_fifo_bytes >> 10).unwrap_or(u32::MAX),
                ..attrs
            },
        };
        tracing::info!(gpu = cfg.ordinal, name = %props.name, capability = ?props.capability,
            sms = props.sm_count, device_memory = props.total_memory, capacity,
            va_base = format_args!("{:#x}", cfg.va_base), granularity = mem.granularity(),
            builtin_jit_ms = t.elapsed().as_millis() as u64, "CUDA GPU ready");
        tracing::info!(
            gpu = cfg.ordinal,
            context_reserve = reserve_bytes,
            stack = reserve.stack_bytes,
            heap = reserve.heap_bytes,
            printf_fifo = reserve.printf_fifo_bytes,
            sms = reserve.sms,
            threads_per_sm = reserve.threads_per_sm,
            share = capacity,
            "CUDA context reserve charged to the vGPU's memory share"
        );
        Ok(Self {
            info,
            mem,
            modules: Modules::default(),
            builtins,
            lanes: Lanes::new(ctx.clone()),
            pinned: Pinned::default(),
            inflight: InFlight::default(),
            lost: AtomicBool::new(false),
            lost_why: Mutex::new(String::new()),
            kernel_limit: DEFAULT_KERNEL_LIMIT,
            attr_lock: Mutex::new(()),
            storage: storage::GpuStorage::new(None),
            reserve,
            ctx,
        })
    }

    /// Lets the built-in storage kernels read the namespaces of `set` (the same set the
    /// device layer answers `STORAGE_ATTACH` from); GPU threads enqueue the reads.
    pub fn with_storage(mut self, set: Arc<crate::storage::StorageSet>) -> Self {
        self.storage = storage::GpuStorage::new(Some(set));
        self
    }

    /// Fails once the context was lost; else makes it current on this thread.
    fn enter(&self) -> Result<()> {
        self.alive()?;
        self.ctx.bind().map_err(|e| self.cuda_err(e))
    }

    /// Fails once the context is lost; the calling thread's binding is left as it is (a
    /// batch binds once, then checks this before each kernel it queues).
    fn alive(&self) -> Result<()> {
        if self.lost.load(Ordering::Acquire) {
            let why = lock(&self.lost_why).clone();
            return Err(BackendError::Device(format!(
                "this vGPU's GPU context was lost ({why}); its device memory is gone: restart the VM's vGPU"
            )));
        }
        Ok(())
    }

    /// Marks the context lost after a sticky error.
    fn mark_lost(&self, e: &CuError) {
        if !self.lost.swap(true, Ordering::AcqRel) {
            *lock(&self.lost_why) = e.to_string();
            tracing::error!(error = %e, "the vGPU's CUDA context is lost; every later request fails");
        }
    }

    /// A driver error outside a kernel.
    fn cuda_err(&self, e: CuError) -> BackendError {
        if e.is_sticky() {
            self.mark_lost(&e);
        }
        if e.is_oom() {
            return BackendError::HostOutOfMemory { requested: 0 };
        }
        BackendError::Device(e.to_string())
    }

    /// An error from `cuLaunchKernel` itself (the launch was refused, nothing ran).
    fn launch_err(&self, e: CuError, kernel: &str) -> BackendError {
        match e.code {
            CUresult::CUDA_ERROR_INVALID_VALUE => BackendError::InvalidArgument(format!(
                "the GPU refused to launch {kernel} with this geometry ({}); check grid, block and shared memory against the kernel's limits",
                e.name()
            )),
            CUresult::CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES => BackendError::InvalidArgument(format!(
                "{kernel} needs more registers or shared memory than a block of this size gets ({}); launch fewer threads per block",
                e.name()
            )),
            _ => self.cuda_err(e),
        }
    }

    /// An error while waiting for a kernel: a fault in this vGPU's own kernel.
    fn kernel_err(&self, e: CuError, kernel: &str) -> BackendError {
        if e.is_sticky() {
            self.mark_lost(&e);
            BackendError::KernelFault(format!(
                "{kernel} faulted on the GPU: {}; the fault stays in this vGPU, whose GPU context is now lost",
                e.name()
            ))
        } else {
            BackendError::Device(e.to_string())
        }
    }

    /// Clears a fresh allocation (physical memory may hold an earlier user's bytes) before
    /// its address is known to anyone, then publishes it.
    fn clear_and_publish(&self, a: memory::Allocation, size: u64) -> Result<Allocated> {
        let charged = self.mem.charge_of(size);
        let va = a.va().ok_or_else(|| {
            BackendError::Device("a fresh allocation is not mapped; retry".into())
        })?;
        let lane = self.lanes.take().map_err(|e| self.cuda_err(e))?;
        check(
            // SAFETY: clears exactly the mapping just made, on our stream, then waits.
            unsafe { sys::cuMemsetD8Async(va, 0, charged as usize, lane.stream.raw()) },
            "cuMemsetD8Async",
        )
        .and_then(|()| lane.stream.synchronize())
        .map_err(|e| self.cuda_err(e))?;
        let addr = self.mem.publish(a);
        Ok(Allocated { addr, charged })
    }

    /// Guest work runs only on memory at the vGPU's own addresses (never on a migration
    /// target still staging, nor on a source that gave its addresses up).
    fn guest_ready(&self) -> Result<()> {
        if self.mem.at_home() {
            Ok(())
        } else {
            Err(memory::moving())
        }
    }

    /// Queues a host<->device copy of `len` bytes in `COPY_CHUNK` pieces on `lane` and waits
    /// for it. `op(dev, host, n)` queues one piece.
    fn copy(
        &self,
        lane: &lanes::Lane,
        dev: u64,
        host: usize,
        len: usize,
        op: impl Fn(u64, usize, usize) -> CUresult,
        call: &'static str,
    ) -> Result<()> {
        let mut off = 0;
        while off < len {
            let n = (len - off).min(COPY_CHUNK);
            check(op(dev + off as u64, host + off, n), call).map_err(|e| self.cuda_err(e))?;
            off += n;
        }
        lane.stream.synchronize().map_err(|e| self.cuda_err(e))
    }
}

impl Drop for CudaGpu {
    fn drop(&mut self) {
        self.synchronize();
        if self.ctx.bind().is_ok() {
            let regions = std::mem::take(&mut *write(&self.pinned.regions));
            for r in regions {
                pinned::unpin(&r);
            }
            let device = std::mem::take(&mut *write(&self.pinned.device));
            for r in device {
                pinned::unpin(&r);
            }
        }
        self.modules.clear(&self.mem);
        self.mem.clear();
        tracing::debug!("CUDA GPU closed");
    }
}

impl Backend for CudaGpu {
    fn info(&self) -> &BackendInfo {
        &self.info
    }

    fn memory_usage(&self) -> MemoryUsage {
        self.mem.usage()
    }

    fn alloc(&self, size: u64) -> Result<Allocated> {
        self.enter()?;
        let a = self.mem.create(size)?;
        self.clear_and_publish(a, size)
    }

    fn free(&self, addr: u64) -> Result<()> {
        self.enter()?;
        self.mem.free(addr)
    }

    fn check_range(&self, addr: u64, len: u64) -> Result<()> {
        self.reach(addr, len, false).map(|_| ())
    }

    fn copy_htod(&self, dst: u64, src: &VolatileSlice<'_>) -> Result<u64> {
        let _op = self.inflight.begin();
        self.enter()?;
        self.guest_ready()?;
        let len = src.len();
        let _alloc = self.reach(dst, len as u64, true)?;
        let host = src.ptr_guard().as_ptr() as usize;
        // Held for the copy: unregistering waits for it.
        let pinned = read(&self.pinned.regions);
        let direct = Pinned::covers(&pinned, host, len);
        let lane = self.lanes.take().map_err(|e| self.cuda_err(e))?;
        let stream = lane.stream.raw();
        self.copy(
            &lane,
            dst,
            host,
            len,
            // SAFETY: [h, h + n) lies inside the guest buffer `src` (mapped guest RAM that
            // stays mapped while the request is served) and [d, d + n) inside the live
            // allocation `_alloc`; we wait for the copy before returning. Pageable memory is
            // staged by the driver before the call returns.
            |d, h, n| unsafe { sys::cuMemcpyHtoDAsync_v2(d, h as *const c_void, n, stream) },
            "cuMemcpyHtoDAsync",
        )?;
        drop(pinned);
        tracing::trace!(dst, len, direct, "htod");
        Ok(len as u64)
    }

    fn copy_dtoh(&self, src: u64, dst: &VolatileSlice<'_>) -> Result<u64> {
        let _op = self.inflight.begin();
        self.enter()?;
        self.guest_ready()?;
        let len = dst.len();
        let _alloc = self.reach(src, len as u64, false)?;
        let host = dst.ptr_guard_mut().as_ptr() as usize;
        let pinned = read(&self.pinned.regions);
        let direct = Pinned::covers(&pinned, host, len);
        let lane = self.lanes.take().map_err(|e| self.cuda_err(e))?;
        let stream = lane.stream.raw();
        self.copy(
            &lane,
            src,
            host,
            len,
            // SAFETY: [h, h + n) lies inside the guest buffer `dst` (writable guest RAM that
            // stays mapped while the request is served; the guest may race its own bytes,
            // which only changes what it reads) and [d, d + n) inside the live allocation
            // `_alloc`; we wait for the copy before returning.
            |d, h, n| unsafe { sys::cuMemcpyDtoHAsync_v2(h as *mut c_void, d, n, stream) },
            "cuMemcpyDtoHAsync",
        )?;
        drop(pinned);
        tracing::trace!(src, len, direct, "dtoh");
        Ok(len as u64)
    }

    fn copy_dtod(&self, dst: u64, src: u64, len: u64) -> Result<u64> {
        let _op = self.inflight.begin();
        self.enter()?;
        self.guest_ready()?;
        let _sa = self.reach(src, len, false)?;
        let _da = self.reach(dst, len, true)?;
        let mut lane = self.lanes.take().map_err(|e| self.cuda_err(e))?;
        let overlap = src < dst.saturating_add(len) && dst < src.saturating_add(len);
        let n = usize::try_from(len).map_err(|_| BackendError::BadPointer { addr: src, len })?;
        if !overlap || src == dst {
            if n > 0 && src != dst {
                check(
                    // SAFETY: both ranges lie in live allocations held above and do not overlap.
                    unsafe { sys::cuMemcpyDtoDAsync_v2(dst, src, n, lane.stream.raw()) },
                    "cuMemcpyDtoDAsync",
                )
                .map_err(|e| self.cuda_err(e))?;
            }
        } else {
            // memmove: stage pieces through this lane's scratch, walking away from the side
            // the destination overlaps, so no piece reads bytes an earlier piece wrote.
            let chunk = n.min(COPY_CHUNK);
            let tmp = lane.scratch(chunk).map_err(|e| self.cuda_err(e))?;
            let stream = lane.stream.raw();
            let pieces = n.div_ceil(chunk);
            for i in 0..pieces {
                let k = if dst > src { pieces - 1 - i } else { i };
                let off = k * chunk;
                let m = chunk.min(n - off);
                let o = off as u64;
                check(
                    // SAFETY: [src+o, +m) and [dst+o, +m) lie inside the checked ranges; `tmp`
                    // is our scratch of at least `chunk` bytes; all on one stream, in order.
                    unsafe { sys::cuMemcpyDtoDAsync_v2(tmp, src + o, m, stream) },
                    "cuMemcpyDtoDAsync",
                )
                .and_then(|()| {
                    check(
                        // SAFETY: as above.
                        unsafe { sys::cuMemcpyDtoDAsync_v2(dst + o, tmp, m, stream) },
                        "cuMemcpyDtoDAsync",
                    )
                })
                .map_err(|e| self.cuda_err(e))?;
            }
        }
        lane.stream.synchronize().map_err(|e| self.cuda_err(e))?;
        Ok(len)
    }

    fn memset(&self, dst: u64, value: u32, elem_size: u32, count: u64) -> Result<u64> {
        let _op = self.inflight.begin();
        let len = crate::space::memset_len(dst, elem_size, count)?;
        self.enter()?;
        self.guest_ready()?;
        let _a = self.reach(dst, len, true)?;
        let n = usize::try_from(count).map_err(|_| BackendError::BadPointer { addr: dst, len })?;
        let lane = self.lanes.take().map_err(|e| self.cuda_err(e))?;
        let s = lane.stream.raw();
        if n > 0 {
            // SAFETY: [dst, dst + len) lies inside the live allocation `_a`, aligned to the
            // element; queued on our stream and waited for below.
            let rc = unsafe {
                match elem_size {
                    1 => sys::cuMemsetD8Async(dst, value as u8, n, s),
                    2 => sys::cuMemsetD16Async(dst, value as u16, n, s),
                    _ => sys::cuMemsetD32Async(dst, value, n, s),
                }
            };
            check(rc, "cuMemsetAsync").map_err(|e| self.cuda_err(e))?;
        }
        lane.stream.synchronize().map_err(|e| self.cuda_err(e))?;
        Ok(len)
    }

    fn launch(&self, launches: &[Launch<'_>]) -> Vec<Result<LaunchStats>> {
        self.launch_then(launches, &mut |_| {})
    }

    fn launch_then(
        &self,
        launches: &[Launch<'_>],
        ended: &mut dyn FnMut(&[Result<LaunchStats>]),
    ) -> Vec<Result<LaunchStats>> {
        match launches {
            // One launch: the lone path (no batch events), answered before its cleanup.
            [one] => vec![self.launch_alone(one, ended)],
            _ => {
                // Answered inside the operation, as a lone launch is.
                let _op = self.inflight.begin();
                let results = self.run_batch(launches);
                ended(&results);
                results
            }
        }
    }

    fn synchronize(&self) {
        self.inflight.drain();
    }

    fn modules(&self) -> &dyn crate::Modules {
        self
    }

    fn paging(&self) -> Option<&dyn Paging> {
        Some(self)
    }

    fn relocation(&self) -> Option<&dyn Relocatable> {
        Some(self)
    }

    fn shared_memory(&self) -> Option<&dyn SharedMemory> {
        Some(self)
    }

    fn host_memory(&self) -> Option<&dyn HostMemory> {
        Some(self)
    }

    fn virtual_memory(&self) -> Option<&dyn crate::VirtualMemory> {
        self.mem
            .vmm_usable()
            .then_some(self as &dyn crate::VirtualMemory)
    }
}

impl crate::Modules for CudaGpu {
    fn module_load(&self, image: ModuleImage<'_>) -> Result<u64> {
        self.enter()?;
        self.modules.load(&self.ctx, &self.mem, image)
    }

    fn module_unload(&self, module: u64) -> Result<()> {
        self.enter()?;
        self.modules.unload(&self.mem, module)
    }

    fn get_function(&self, module: u64, name: &[u8]) -> Result<FunctionInfo> {
        self.enter()?;
        self.modules.function(module, name)
    }

    fn function_attributes(&self, function: u64) -> Result<vgpu_proto::FunctionAttributes> {
        self.enter()?;
        let func = match self.modules.kernel(function)? {
            Kernel::Builtin(_, index) => self
                .builtins
                .kernels
                .get(index)
                .copied()
                .ok_or_else(|| BackendError::UnknownFunction(format!("handle {function:#x}")))?,
            Kernel::Ptx(_, f) => f.func,
            Kernel::Storage(_) => {
                return Err(BackendError::NotSupported(
                    "storage kernels do not report function attributes".into(),
                ))
            }
        };
        modules::attributes(func).map_err(|e| self.cuda_err(e))
    }

    fn cluster_occupancy(&self, q: &vgpu_proto::ClusterOccupancyArgs) -> Result<u64> {
        self.occupancy(q)
    }

    fn param_layout(&self, function: u64) -> Result<crate::ParamLayout> {
        Ok(match self.modules.kernel(function)? {
            Kernel::Builtin(sig, _) | Kernel::Storage(sig) => vgpu_proto::builtin::layout(sig),
            Kernel::Ptx(_, f) => {
                let mut out = crate::ParamLayout::default();
                for (i, (off, size)) in f.layout.iter().enumerate() {
                    out.set(i, *off, *size);
                }
                out
            }
        })
    }

    fn module_global(&self, module: u64, name: &[u8]) -> Result<(u64, u64)> {
        self.enter()?;
        self.modules.global(module, name)
    }

    fn module_globals(&self, module: u64) -> Result<Vec<crate::ModuleGlobal>> {
        self.enter()?;
        self.modules.globals(module)
    }

    fn encode_tensor_map(
        &self,
        map: &vgpu_proto::TensorMapArgs,
    ) -> Result<[u8; vgpu_proto::TENSOR_MAP_BYTES]> {
        if self.info.features & features::TENSOR_MAPS == 0 {
            return Err(BackendError::NotSupported(format!(
                "{} has no tensor memory accelerator (TMA needs compute capability 9.0 or higher)",
                self.info.name
            )));
        }
        map.check()
            .map_err(|e| BackendError::InvalidArgument(e.to_string()))?;
        let len = map.extent().ok_or(BackendError::BadPointer {
            addr: map.global_address,
            len: u64::MAX,
        })?;
        // The tensor lies inside one allocation (or module variable) of this vGPU, held
        // while the driver encodes its address.
        let _held = self.reach(map.global_address, len, false)?;
        self.enter()?;
        tensor_map::encode(map).map_err(|e| match e {
            tensor_map::EncodeError::Value(field) => BackendError::InvalidArgument(format!(
                "tensor map {field} is not a CUDA value"
            )),
            tensor_map::EncodeError::Driver(e) if e.code == CUresult::CUDA_ERROR_INVALID_VALUE => {
                BackendError::InvalidArgument(format!(
                    "the GPU's driver refused the tensor map parameters ({}): check the strides against the dimensions and the box against the tensor",
                    e.name()
                ))
            }
            tensor_map::EncodeError::Driver(e) => self.cuda_err(e),
        })
    }
}

/// Guest RAM pinned with `cuMemHostRegister`, so copies run at DMA speed.
impl HostMemory for CudaGpu {
    fn register(&self, regions: &[HostRegion]) -> Result<()> {
        self.enter()?;
        self.pinned.register(regions)
    }

    fn unregister(&self, regions: &[HostRegion]) {
        if self.ctx.bind().is_err() {
            return;
        }
        self.pinned.unregister(regions);
    }

    fn map_for_device(&self, region: HostRegion) -> Result<()> {
        self.map_device(region)
    }

    fn unmap_for_device(&self, region: HostRegion) {
        self.unmap_device(region);
    }
}

/// Shared objects are exportable physical allocations (POSIX file descriptors).
impl SharedMemory for CudaGpu {
    fn export(&self, size: u64) -> Result<OwnedFd> {
        self.enter()?;
        self.mem.export(size)
    }

    fn import(&self, handle: OwnedFd, size: u64, read_only: bool) -> Result<u64> {
        self.enter()?;
        self.mem.import(handle, size, read_only)
    }
}
