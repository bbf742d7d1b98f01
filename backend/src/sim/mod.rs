//! The sim backend: a simulated GPU with a configured memory size, copy bandwidth and
//! speed. Device memory is host memory in memfds at stable device addresses; built-in
//! kernels run on CPU threads and take real time.

mod host_map;
mod kernels;
mod memory;
mod modules;
mod pacing;
mod storage_kernels;
#[cfg(test)]
mod tests;

use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU32, AtomicU8, Ordering::Relaxed};
use std::sync::Arc;

use vgpu_proto::{backend_kind, features, ArgValue};
use vm_memory::VolatileSlice;

use crate::drain::InFlight;
use crate::error::{BackendError, Result};
use crate::storage::StorageSet;
use crate::{
    Allocated, Backend, BackendInfo, FunctionInfo, HostMemory, Launch, LaunchStats, MemoryUsage,
    ModuleImage, Paging, Relocatable, SharedMemory, DEFAULT_VA_BASE, DEFAULT_VA_SIZE,
};
use memory::DeviceMemory;
use modules::Modules;
use pacing::CopyEngine;

pub use memory::{shared_object, SHARED_SEALS};
pub use modules::VARIABLES;
pub use pacing::{SPLIT_CHUNK, UNITS_PER_SEC};

/// How to simulate the GPU.
#[derive(Clone, Debug, PartialEq)]
pub struct SimConfig {
    /// Device name (at most 32 bytes are shown to guests).
    pub name: String,
    /// Device memory in bytes.
    pub memory: u64,
    /// Host-device copy bandwidth in bytes/s; 0 = as fast as the host copies.
    pub copy_bandwidth: u64,
    /// Compute-rate factor: a kernel's modeled time is its work (element operations) over
    /// `speed * 1e9` per second; `spin` lasts `duration / speed`.
    pub speed: f64,
    /// Threads one kernel may use; 0 = the host's available parallelism.
    pub threads: usize,
    /// First device address.
    pub va_base: u64,
    /// Device address space size.
    pub va_size: u64,
}

impl Default for SimConfig {
    fn default() -> Self {
        Self {
            name: "vgpu-sim".into(),
            memory: 1 << 30,
            copy_bandwidth: 0,
            speed: 1.0,
            threads: 0,
            va_base: DEFAULT_VA_BASE,
            va_size: DEFAULT_VA_SIZE,
        }
    }
}

/// A simulated GPU as one worker sees it.
#[derive(Debug)]
pub struct SimGpu {
    info: BackendInfo,
    speed: f64,
    threads: usize,
    mem: DeviceMemory,
    copy: CopyEngine,
    modules: Modules,
    inflight: InFlight,
    /// Storage namespaces the storage kernels read; `None`: they answer NOT_SUPPORTED.
    storage: Option<Arc<StorageSet>>,
    /// Namespaces whose cache is charged to the ledger (on first use by a storage kernel),
    /// and the bytes each is.
    storage_charged: std::sync::Mutex<std::collections::BTreeMap<u64, u64>>,
    /// Host memory reached at its host address (`HostMemory::map_for_device`).
    host: host_map::HostMapped,
}

impl SimGpu {
    /// A simulated GPU per `cfg`.
    pub fn new(cfg: SimConfig) -> Result<Self> {
        if !(cfg.speed.is_finite() && cfg.speed > 0.0) {
            return Err(BackendError::InvalidArgument(format!(
                "sim speed {} must be a positive number (1.0 = nominal)",
                cfg.speed
            )));
        }
        if cfg.memory == 0 {
            return Err(BackendError::InvalidArgument(
                "sim memory must be at least 1 byte".into(),
            ));
        }
        let threads = match cfg.threads {
            0 => std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1),
            n => n,
        };
        let mem = DeviceMemory::new(cfg.va_base, cfg.va_size, cfg.memory)?;
        let info = BackendInfo {
            kind: backend_kind::SIM,
            name: cfg.name.clone(),
            device_memory: cfg.memory,
            copy_bandwidth: cfg.copy_bandwidth,
            compute_units: u32::try_from(threads).unwrap_or(u32::MAX),
            alloc_granularity: memory::PAGE,
            va_base: cfg.va_base,
            va_size: cfg.va_size,
            features: features::BUILTIN_KERNELS
                | features::GLOBALS
                | features::ATTRIBUTES
                | features::PARAM_LAYOUT
                | features::FUNCTION_ATTRIBUTES
                | features::HOST_MAP,
            attributes: vgpu_proto::DeviceAttributes {
                sm_count: u32::try_from(threads).unwrap_or(u32::MAX),
                ..vgpu_proto::DeviceAttributes::SIM
            },
        };
        tracing::info!(name = %cfg.name, memory = cfg.memory, copy_bandwidth = cfg.copy_bandwidth,
            speed = cfg.speed, threads, va_base = format_args!("{:#x}", cfg.va_base), "sim GPU ready");
        Ok(Self {
            info,
            speed: cfg.speed,
            threads,
            mem,
            copy: CopyEngine::new(cfg.copy_bandwidth),
            modules: Modules::default(),
            inflight: InFlight::default(),
            storage: None,
            storage_charged: Default::default(),
            host: Default::default(),
        })
    }

    /// Lets the built-in storage kernels read the namespaces of `set` (the same set the
    /// device layer answers `STORAGE_ATTACH` from).
    pub fn with_storage(mut self, set: Arc<StorageSet>) -> Self {
        self.storage = Some(set);
        self
    }

    /// A duplicate of the memfd backing the allocation that starts at `addr`, and the
    /// allocation's size: another process can map the same bytes (shared device memory,
    /// migration).
    pub fn export(&self, addr: u64) -> Result<(OwnedFd, u64)> {
        let (a, off) = self.mem.resolve(addr, 0)?;
        if off != 0 {
            return Err(BackendError::NotAllocated { addr });
        }
        let fd = a
            .memfd()
            .try_clone_to_owned()
            .map_err(|e| BackendError::os("duplicating a memfd", e))?;
        Ok((fd, a.size()))
    }
}

fn as_len(len: usize) -> u64 {
    len as u64
}

impl Backend for SimGpu {
    fn info(&self) -> &BackendInfo {
        &self.info
    }

    fn memory_usage(&self) -> MemoryUsage {
        self.mem.usage()
    }

    fn alloc(&self, size: u64) -> Result<Allocated> {
        let (addr, charged) = self.mem.alloc(size)?;
        Ok(Allocated { addr, charged })
    }

    fn free(&self, addr: u64) -> Result<()> {
        self.mem.free(addr)
    }

    fn check_range(&self, addr: u64, len: u64) -> Result<()> {
        match self.mem.resolve(addr, len) {
            Ok(_) => Ok(()),
            Err(_) if self.host.slice(addr, len).is_some() => Ok(()),
            Err(e) => Err(e),
        }
    }

    fn copy_htod(&self, dst: u64, src: &VolatileSlice<'_>) -> Result<u64> {
        let _op = self.inflight.begin();
        let len = as_len(src.len());
        if let Some(host) = self.host.slice(dst, len) {
            src.copy_to_volatile_slice(host);
            return Ok(len);
        }
        let (alloc, off) = self.mem.resolve_write(dst, len)?;
        self.copy.run(len, |o, n| {
            let d = alloc.volatile(off + o, n)?;
            let s = src
                .subslice(o as usize, n as usize)
                .map_err(|e| BackendError::Device(format!("guest slice: {e}")))?;
            s.copy_to_volatile_slice(d);
            Ok::<_, BackendError>(())
        })?;
        Ok(len)
    }

    fn copy_dtoh(&self, src: u64, dst: &VolatileSlice<'_>) -> Result<u64> {
        let _op = self.inflight.begin();
        let len = as_len(dst.len());
        if let Some(host) = self.host.slice(src, len) {
            host.copy_to_volatile_slice(*dst);
            return Ok(len);
        }
        let (alloc, off) = self.mem.resolve(src, len)?;
        self.copy.run(len, |o, n| {
            let s = alloc.volatile(off + o, n)?;
            let d = dst
                .subslice(o as usize, n as usize)
                .map_err(|e| BackendError::Device(format!("guest slice: {e}")))?;
            s.copy_to_volatile_slice(d);
            Ok::<_, BackendError>(())
        })?;
        Ok(len)
    }

    fn copy_dtod(&self, dst: u64, src: u64, len: u64) -> Result<u64> {
        let _op = self.inflight.begin();
        // Device-internal bandwidth is far above the copy engine's: not paced.
        // `copy_to_volatile_slice` is a memmove, so overlapping ranges are fine. Either side
        // may be device-mapped host memory.
        match (self.host.slice(src, len), self.host.slice(dst, len)) {
            (Some(s), Some(d)) => s.copy_to_volatile_slice(d),
            (Some(s), None) => {
                let (da, doff) = self.mem.resolve_write(dst, len)?;
                s.copy_to_volatile_slice(da.volatile(doff, len)?);
            }
            (None, Some(d)) => {
                let (sa, so) = self.mem.resolve(src, len)?;
                sa.volatile(so, len)?.copy_to_volatile_slice(d);
            }
            (None, None) => {
                let (sa, so) = self.mem.resolve(src, len)?;
                let (da, doff) = self.mem.resolve_write(dst, len)?;
                sa.volatile(so, len)?
                    .copy_to_volatile_slice(da.volatile(doff, len)?);
            }
        }
        Ok(len)
    }

    fn memset(&self, dst: u64, value: u32, elem_size: u32, count: u64) -> Result<u64> {
        let _op = self.inflight.begin();
        let len = crate::space::memset_len(dst, elem_size, count)?;
        if let Some(host) = self.host.slice(dst, len) {
            host_map::fill(&host, value, elem_size)?;
            return Ok(len);
        }
        let (a, off) = self.mem.resolve_write(dst, len)?;
        let bytes = value.to_le_bytes();
        let pattern = match elem_size {
            1 => u32::from_le_bytes([bytes[0]; 4]),
            2 => u32::from_le_bytes([bytes[0], bytes[1], bytes[0], bytes[1]]),
            _ => value,
        };
        // Fill whole aligned 32-bit words with the pattern; bytes at the edges one by one.
        let start = dst;
        let end = dst + len;
        let word_lo = start.div_ceil(4) * 4;
        let word_hi = (end / 4) * 4;
        let pb = pattern.to_le_bytes();
        let edge = |from: u64, to: u64| -> Result<()> {
            for p in from..to {
                if let (Some(b), Some(v)) = (
                    a.words::<AtomicU8>(off + (p - start), 1)?.first(),
                    pb.get((p % 4) as usize),
                ) {
                    b.store(*v, Relaxed);
                }
            }
            Ok(())
        };
        if word_lo >= word_hi {
            edge(start, end)?;
        } else {
            edge(start, word_lo)?;
            let words = a.words::<AtomicU32>(off + (word_lo - start), (word_hi - word_lo) / 4)?;
            words.iter().for_each(|w| w.store(pattern, Relaxed));
            edge(word_hi, end)?;
        }
        Ok(len)
    }

    fn launch(&self, launches: &[Launch<'_>]) -> Vec<Result<LaunchStats>> {
        launches.iter().map(|l| self.launch_alone(l)).collect()
    }

    fn launch_then(
        &self,
        launches: &[Launch<'_>],
        ended: &mut dyn FnMut(&[Result<LaunchStats>]),
    ) -> Vec<Result<LaunchStats>> {
        // Answered inside the operation: a `synchronize` waiting for these launches
        // returns after their answers are out.
        let _op = self.inflight.begin();
        let results = self.launch(launches);
        ended(&results);
        results
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

    /// Sim copies with the CPU: nothing to prepare; device-mapped host memory is recorded
    /// (`host_map.rs`).
    fn host_memory(&self) -> Option<&dyn HostMemory> {
        Some(self)
    }

    fn virtual_memory(&self) -> Option<&dyn crate::VirtualMemory> {
        Some(self)
    }
}

/// Virtual memory management: a physical allocation is a memfd, a mapping maps it at its
/// place in the address space's host reservation (so two mappings of one allocation see
/// the same bytes, and the bytes survive an unmap while a handle holds them).
impl crate::VirtualMemory for SimGpu {
    fn reserve(&self, size: u64, align: u64, hint: u64) -> Result<u64> {
        self.mem.vmm().reserve(&self.mem, size, align, hint)
    }

    fn free_range(&self, addr: u64, size: u64) -> Result<()> {
        self.mem.vmm().free_range(addr, size)
    }

    fn create(&self, size: u64) -> Result<crate::Created> {
        let (handle, charged) = self.mem.vmm().create(&self.mem, size)?;
        Ok(crate::Created { handle, charged })
    }

    fn release(&self, handle: u64) -> Result<()> {
        self.mem.vmm().release(handle)
    }

    fn map(&self, addr: u64, size: u64, offset: u64, handle: u64) -> Result<()> {
        self.mem.vmm().map(&self.mem, addr, size, offset, handle)
    }

    fn unmap(&self, addr: u64, size: u64) -> Result<()> {
        self.mem.vmm().unmap(&self.mem, addr, size)
    }

    fn retain(&self, addr: u64) -> Result<[u64; 4]> {
        self.mem.vmm().retain(addr)
    }

    fn objects(&self) -> usize {
        self.mem.vmm().objects()
    }

    fn charged(&self) -> u64 {
        self.mem.vmm().charged()
    }

    fn snapshot(&self) -> Result<crate::VmmSnapshot> {
        self.mem.vmm().snapshot()
    }

    fn restore(&self, snapshot: &crate::VmmSnapshot) -> Result<()> {
        self.mem.vmm().restore(&self.mem, snapshot)
    }
}

impl SimGpu {
    /// One launch of [`Backend::launch`]. Built-in kernels choose their own decomposition
    /// over the host threads; the geometry (validated by the device layer) matters to PTX
    /// kernels only.
    fn launch_alone(&self, l: &Launch<'_>) -> Result<LaunchStats> {
        if l.args.iter().any(|a| matches!(a, ArgValue::Blob { .. })) {
            return Err(BackendError::NotSupported(
                "this backend runs no guest code, so no function takes a by-value parameter over 8 bytes; use a cuda vGPU".into(),
            ));
        }
        let _op = self.inflight.begin();
        let sig = self.modules.kernel(l.function)?;
        self.mem.check_kernel_writes(l.args)?;
        let ctx = kernels::Ctx {
            mem: &self.mem,
            threads: self.threads,
            speed: self.speed,
            storage: self.storage.as_deref(),
            storage_charged: &self.storage_charged,
        };
        let t = kernels::run(&ctx, sig, l.args)?;
        tracing::trace!(kernel = sig.name, ns = t.as_nanos() as u64, "kernel done");
        Ok(LaunchStats {
            device_ns: u64::try_from(t.as_nanos()).unwrap_or(u64::MAX),
        })
    }
}

/// The built-in module, with its variables (`modules::VARIABLES`).
impl crate::Modules for SimGpu {
    fn module_load(&self, image: ModuleImage<'_>) -> Result<u64> {
        self.modules.load(&self.mem, image)
    }

    fn module_unload(&self, module: u64) -> Result<()> {
        self.modules.unload(&self.mem, module)
    }

    fn get_function(&self, module: u64, name: &[u8]) -> Result<FunctionInfo> {
        self.modules.function(module, name)
    }

    fn param_layout(&self, function: u64) -> Result<crate::ParamLayout> {
        self.modules
            .kernel(function)
            .map(vgpu_proto::builtin::layout)
    }

    fn module_global(&self, module: u64, name: &[u8]) -> Result<(u64, u64)> {
        self.modules.global(&self.mem, module, name)
    }

    fn module_globals(&self, module: u64) -> Result<Vec<crate::ModuleGlobal>> {
        self.modules.globals(module)
    }

    fn function_attributes(&self, function: u64) -> Result<vgpu_proto::FunctionAttributes> {
        // Built-in kernels run on host threads: no GPU registers, shared, constant or
        // local memory.
        self.modules.kernel(function)?;
        Ok(vgpu_proto::FunctionAttributes {
            max_threads_per_block: vgpu_proto::MAX_THREADS_PER_BLOCK as u32,
            ..vgpu_proto::FunctionAttributes::default()
        })
    }
}

/// Shared objects are sealed memfds, mapped like any allocation.
impl SharedMemory for SimGpu {
    fn export(&self, size: u64) -> Result<OwnedFd> {
        if size == 0 {
            return Err(BackendError::ZeroSize);
        }
        if size > self.info.device_memory {
            return Err(BackendError::InvalidArgument(format!(
                "a shared object of {size} bytes is larger than the GPU's {} bytes",
                self.info.device_memory
            )));
        }
        memory::shared_object(size)
    }

    fn import(&self, handle: OwnedFd, size: u64, read_only: bool) -> Result<u64> {
        self.mem.import(handle, size, read_only)
    }
}

impl Paging for SimGpu {
    fn commit_granule(&self) -> u64 {
        crate::pager::GRANULE
    }

    fn decommit(&self, addr: u64, off: u64, len: u64) -> Result<()> {
        self.mem.decommit(addr, off, len)
    }

    fn recommit(&self, addr: u64, off: u64, len: u64) -> Result<()> {
        self.mem.recommit(addr, off, len)
    }
}

/// Sim addresses are per backend: nothing to vacate or occupy at a switch, and no device
/// window (the target's copy engine paces the copy).
impl Relocatable for SimGpu {
    fn alloc_at(&self, addr: u64, size: u64) -> Result<Allocated> {
        let (addr, charged) = self.mem.alloc_at(addr, size)?;
        Ok(Allocated { addr, charged })
    }

    fn copy_to_peer(&self, peer: &dyn Backend, addr: u64, len: u64) -> Result<u64> {
        // One copy straight out of our mapping, paced by the peer's copy engine (a
        // device-to-device transfer between two GPUs).
        let (a, off) = self.mem.view(addr, len)?;
        let _op = self.inflight.begin();
        peer.copy_htod(addr, &a.volatile(off, len)?)
    }
}
