//! The `Backend` trait over one physical GPU as one worker sees it, and its
//! implementations: **sim** (simulated GPU: host memory in memfds, built-in kernels on CPU
//! threads) and **cuda** (NVIDIA GPUs through the driver API, libcuda loaded at run time).
//!
//! A worker process serves one vGPU, so one backend instance holds exactly one vGPU's
//! device address space and allocations: invariant 3 of docs/architecture.md (a guest reaches only
//! its own device memory) rests on every device range going through [`Backend`]'s checks.
//!
//! [`Backend`] is the data path only (memory, copies, launches), with the loaded code behind
//! [`Backend::modules`]. What other parts need beyond it are capabilities of their own,
//! each reached through an accessor that returns `None` when the backend lacks it (as
//! Cloud Hypervisor keeps `Pausable`, `Snapshottable` and `Migratable` apart from a
//! device): [`Paging`] (swapping), [`Relocatable`] (migration), [`SharedMemory`] (objects
//! other processes map), [`HostMemory`] (guest RAM prepared for direct copies) and
//! [`VirtualMemory`] (CUDA's virtual memory management: reserved ranges, physical
//! allocations, mappings). A
//! wrapper (the pager, fault injection, the migration's own wrapper) implements the data
//! path it changes, forwards the rest ([`forward_backend!`]), and names every capability:
//! forwarded with one method, or implemented itself where it changes it.
//!
//! All methods take `&self` and lock internally at fine grain, so a kernel running for one
//! queue does not block a copy for another.

mod args;
pub mod cuda;
mod drain;
mod error;
pub mod faults;
mod footprint;
mod forward;
mod image_names;
mod module_table;
pub mod pager;
pub mod sim;
mod space;
pub mod storage;
mod virt;

pub use cuda::{CudaConfig, CudaGpu};
pub use error::{BackendError, Result};
pub use footprint::{cubin_globals_bytes, module_footprint, ptx_globals_bytes, MODULE_PAGE};
pub use module_table::{MAX_MODULES, MAX_MODULE_MEMORY};
pub use sim::{SimConfig, SimGpu};
pub use vgpu_proto::{Access, ArgValue, FunctionAttributes, ParamLayout};
pub use vgpu_sync as sync;
pub use virt::{GRANULARITY as VMM_GRANULARITY, MAX_OBJECTS as MAX_VMM_OBJECTS};

/// What [`forward_backend!`] expands to needs; not part of the API.
#[doc(hidden)]
pub mod __private {
    pub use vm_memory::VolatileSlice;
}

use std::os::fd::OwnedFd;

use vm_memory::VolatileSlice;

/// First device address of a vGPU's address space by default (32 TiB: below where Linux
/// places mmaps and shared libraries, so the cuda backend can reserve the same range).
pub const DEFAULT_VA_BASE: u64 = 0x2000_0000_0000;
/// Size of a vGPU's device address space by default (256 GiB).
pub const DEFAULT_VA_SIZE: u64 = 256 << 30;

/// What a backend is and can do.
#[derive(Clone, Debug, PartialEq)]
pub struct BackendInfo {
    /// `vgpu_proto::backend_kind` value.
    pub kind: u32,
    /// Device name.
    pub name: String,
    /// Physical device memory in bytes.
    pub device_memory: u64,
    /// Host-device copy bandwidth in bytes/s (0 = not paced).
    pub copy_bandwidth: u64,
    /// Compute units (sim: kernel threads).
    pub compute_units: u32,
    /// Allocations are charged rounded up to this.
    pub alloc_granularity: u64,
    /// The device address space.
    pub va_base: u64,
    /// Its size.
    pub va_size: u64,
    /// `vgpu_proto::features` bits the backend provides (`BUILTIN_KERNELS`, `PTX`, ...).
    pub features: u64,
    /// The physical GPU's attributes (`GET_ATTRIBUTES`).
    pub attributes: vgpu_proto::DeviceAttributes,
}

/// A fresh allocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Allocated {
    /// Its device address (2 MiB aligned, stable for its life).
    pub addr: u64,
    /// Bytes charged against device memory.
    pub charged: u64,
}

/// A fresh physical allocation ([`VirtualMemory::create`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Created {
    /// Its handle (never 0, never reused).
    pub handle: u64,
    /// Bytes charged against device memory.
    pub charged: u64,
}

/// A module's code.
#[derive(Clone, Copy, Debug)]
pub enum ModuleImage<'a> {
    /// A built-in module by name (`"builtin"`).
    Builtin(&'a [u8]),
    /// PTX text.
    Ptx(&'a [u8]),
    /// A cubin or fatbin image (ELF or fatbin container), loaded natively by the driver.
    Binary(&'a [u8]),
}

/// A looked-up function.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FunctionInfo {
    /// Handle for [`Launch::function`] (never 0).
    pub handle: u64,
    /// Number of parameters.
    pub param_count: u32,
}

/// One module-scope variable of a loaded module ([`Modules::module_globals`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModuleGlobal {
    /// Its name in the module (no NUL).
    pub name: Vec<u8>,
    /// Its device address.
    pub addr: u64,
    /// Its size in bytes.
    pub size: u64,
}

/// Launch geometry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaunchConfig {
    /// Grid size in blocks.
    pub grid: [u32; 3],
    /// Block size in threads.
    pub block: [u32; 3],
    /// Dynamic shared memory per block.
    pub shared_bytes: u32,
}

/// What a finished launch reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaunchStats {
    /// Device time of the kernel in nanoseconds.
    pub device_ns: u64,
}

/// [`Launch::cluster`] of a launch without thread block clusters.
pub const NO_CLUSTER: [u32; 3] = [1, 1, 1];

/// One kernel launch, as [`Backend::launch`] takes it.
#[derive(Clone, Copy, Debug)]
pub struct Launch<'a> {
    /// The function handle.
    pub function: u64,
    /// The geometry.
    pub config: LaunchConfig,
    /// Thread block cluster in blocks per dimension; `NO_CLUSTER` for none. Only a backend
    /// whose device advertises `features::CLUSTERS` is given another (the device checks
    /// it: at most `MAX_CLUSTER_BLOCKS` blocks, the grid a whole number of clusters).
    pub cluster: [u32; 3],
    /// The typed kernel arguments; every pointer's extent is checked against the
    /// allocations before the kernel starts.
    pub args: &'a [ArgValue],
    /// The bytes the [`ArgValue::Blob`] arguments name (empty when there are none): by-value
    /// parameters larger than a `KernelArg` holds. Offsets and lengths are checked by the
    /// caller against `blob`; the backend checks them against the function's parameter
    /// sizes. A backend without guest code refuses blob arguments (no function takes one).
    pub blob: &'a [u8],
}

/// Bytes of device memory in use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryUsage {
    /// Bytes charged by live allocations.
    pub used: u64,
    /// Device memory in bytes.
    pub capacity: u64,
    /// Live allocations.
    pub allocations: u64,
}

/// A range of host memory (a guest RAM region mapped into the worker) that copies may move
/// to and from directly. See [`HostMemory`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct HostRegion {
    /// First host address.
    pub addr: usize,
    /// Length in bytes.
    pub len: usize,
}

/// One physical GPU as one worker (one vGPU) sees it: the data path (memory, copies,
/// launches), the loaded code ([`Backend::modules`]) and the capabilities beyond the data
/// path, each behind an accessor that says `None` when the backend lacks it.
///
/// Device addresses are u64 in the vGPU's own address space and never change for an
/// allocation's life. Every method that takes a device range checks that it lies inside
/// one live allocation before touching a byte. Guest buffers arrive as
/// [`VolatileSlice`]s of the shared guest RAM (the guest may change them under us); copies
/// go straight between them and device memory.
///
/// The capability accessors have no default: every backend, and every wrapper, says for
/// each one what it offers (a wrapper forwards it, or implements it where it changes it),
/// so no layer hides a capability by leaving a method out.
pub trait Backend: Send + Sync {
    /// What the device is.
    fn info(&self) -> &BackendInfo;

    /// Current memory use.
    fn memory_usage(&self) -> MemoryUsage;

    /// Allocates `size` bytes (zero-filled) at a fresh 2 MiB-aligned device address.
    fn alloc(&self, size: u64) -> Result<Allocated>;

    /// Frees the allocation that starts at `addr`. Work already running on it finishes
    /// first; its address range is reused only after that.
    fn free(&self, addr: u64) -> Result<()>;

    /// Checks that `[addr, addr + len)` lies inside one live allocation.
    fn check_range(&self, addr: u64, len: u64) -> Result<()>;

    /// Copies guest memory `src` to device memory at `dst` (paced to the copy bandwidth).
    /// Returns the bytes copied.
    fn copy_htod(&self, dst: u64, src: &VolatileSlice<'_>) -> Result<u64>;

    /// Copies device memory at `src` to guest memory `dst` (paced to the copy bandwidth).
    /// Returns the bytes copied.
    fn copy_dtoh(&self, src: u64, dst: &VolatileSlice<'_>) -> Result<u64>;

    /// Copies `len` bytes within device memory; the ranges may overlap (memmove).
    fn copy_dtod(&self, dst: u64, src: u64, len: u64) -> Result<u64>;

    /// Sets `count` elements of `elem_size` bytes (1, 2 or 4) at `dst` to the low bytes of
    /// `value`. Returns the bytes written.
    fn memset(&self, dst: u64, value: u32, elem_size: u32, count: u64) -> Result<u64>;

    /// Runs `launches` in order, as one unit of GPU time: the kernels go to the GPU back to
    /// back and the call returns when the last has finished, with one result per launch
    /// (in order). A launch that fails its checks gets its error and the others still run;
    /// a kernel that faults fails itself and every later launch of the call (its context is
    /// lost). Each launch's device time is its own. A single launch is a slice of one
    /// ([`LaunchOne::launch_one`]).
    fn launch(&self, launches: &[Launch<'_>]) -> Vec<Result<LaunchStats>>;

    /// [`Backend::launch`], calling `ended` once with the results (the ones it returns) as
    /// soon as the last kernel was seen finished, before the backend's own cleanup (its
    /// stream going back, what the kernels held let go): a caller answers its guest there,
    /// and a lone launch's round trip does not wait for that cleanup. Every allocation the
    /// kernels pointed into is no longer held when `ended` runs. The sim and cuda backends
    /// run `ended` inside the call's operation, so a [`Backend::synchronize`] that waits for
    /// these launches (a guest's FENCE on another queue) returns only after `ended` did.
    /// By default `ended` runs after [`Backend::launch`] returned; a wrapper that passes
    /// results through unchanged passes `ended` down too.
    fn launch_then(
        &self,
        launches: &[Launch<'_>],
        ended: &mut dyn FnMut(&[Result<LaunchStats>]),
    ) -> Vec<Result<LaunchStats>> {
        let results = self.launch(launches);
        ended(&results);
        results
    }

    /// Waits until every operation that started before this call has finished.
    fn synchronize(&self);

    /// The code loaded on this vGPU and the names in it (every backend has them: sim's
    /// built-in module at least).
    fn modules(&self) -> &dyn Modules;

    /// The swapping capability: giving device memory back while keeping its addresses.
    /// `None`: it cannot.
    fn paging(&self) -> Option<&dyn Paging>;

    /// The relocation capability: keeping every device address across a move to another
    /// GPU of this process. `None`: it cannot be a migration target, and a migration copies
    /// out of it through host memory.
    fn relocation(&self) -> Option<&dyn Relocatable>;

    /// The shared device memory capability: objects other processes map. `None`: it
    /// cannot create or map them.
    fn shared_memory(&self) -> Option<&dyn SharedMemory>;

    /// The host memory registration capability: preparing guest RAM once for direct
    /// copies. `None`: nothing to prepare (sim copies with the CPU); copies work anyway.
    fn host_memory(&self) -> Option<&dyn HostMemory>;

    /// The virtual memory management capability (CUDA's `cuMemAddressReserve`,
    /// `cuMemCreate`, `cuMemMap`): address ranges reserved apart from memory, physical
    /// allocations mapped into them. `None`: it cannot.
    fn virtual_memory(&self) -> Option<&dyn VirtualMemory>;
}

/// One launch alone, for every [`Backend`]: [`Backend::launch`] with a slice of one.
pub trait LaunchOne {
    /// Runs one kernel (no blob arguments) to completion.
    fn launch_one(
        &self,
        function: u64,
        config: &LaunchConfig,
        args: &[ArgValue],
    ) -> Result<LaunchStats>;
}

impl<B: Backend + ?Sized> LaunchOne for B {
    fn launch_one(
        &self,
        function: u64,
        config: &LaunchConfig,
        args: &[ArgValue],
    ) -> Result<LaunchStats> {
        let launch = Launch {
            function,
            config: *config,
            cluster: NO_CLUSTER,
            args,
            blob: &[],
        };
        one_result(self.launch(std::slice::from_ref(&launch)))
    }
}

/// The one result of a [`Backend::launch`] of one launch.
pub fn one_result(results: Vec<Result<LaunchStats>>) -> Result<LaunchStats> {
    results.into_iter().next().unwrap_or_else(|| {
        Err(BackendError::Device(
            "the GPU answered no result for the launch; retry it".into(),
        ))
    })
}

/// The code of a vGPU: modules, their functions and their variables. Reached through
/// [`Backend::modules`].
pub trait Modules: Send + Sync {
    /// Loads a module; returns its handle (never 0). The module's memory
    /// ([`module_footprint`]) is charged to the device memory before it is compiled and
    /// counts in [`Backend::memory_usage`] until it is unloaded.
    fn module_load(&self, image: ModuleImage<'_>) -> Result<u64>;

    /// Unloads a module; its functions become unknown.
    fn module_unload(&self, module: u64) -> Result<()>;

    /// Looks up a function of a loaded module.
    fn get_function(&self, module: u64, name: &[u8]) -> Result<FunctionInfo>;

    /// Where each parameter of a looked-up function lies in its parameter buffer (offsets
    /// and sizes).
    fn param_layout(&self, function: u64) -> Result<vgpu_proto::ParamLayout>;

    /// A looked-up function's resources (registers, static shared, constant and local
    /// memory, the most threads per block), as `cuFuncGetAttribute` answers them. Default:
    /// not supported (the library then answers `CUDA_ERROR_NOT_SUPPORTED` for them).
    fn function_attributes(&self, function: u64) -> Result<vgpu_proto::FunctionAttributes> {
        let _ = function;
        Err(BackendError::NotSupported(
            "this backend does not report function attributes".into(),
        ))
    }

    /// A looked-up function's thread block cluster occupancy as the GPU's driver answers
    /// it (`cuOccupancyMaxActiveClusters` or `cuOccupancyMaxPotentialClusterSize`, as
    /// `q.query` asks). The arguments passed [`vgpu_proto::ClusterOccupancyArgs::check`];
    /// the function handle is the backend's to check. Default: not supported (a backend
    /// without thread block clusters; the library then estimates).
    fn cluster_occupancy(&self, q: &vgpu_proto::ClusterOccupancyArgs) -> Result<u64> {
        let _ = q;
        Err(BackendError::NotSupported(
            "this backend does not answer cluster occupancy (a cuda vGPU on a GPU with thread block clusters does)".into(),
        ))
    }

    /// The device address and size of module-scope variable `name` (`__device__`,
    /// `__constant__`) of a loaded module. From then on the range is a valid target of
    /// copies, memsets and kernel pointers until the module is unloaded; it is the
    /// module's memory (charged with its footprint), so [`Backend::free`] refuses it.
    /// Default: not supported (modules without variables).
    fn module_global(&self, module: u64, name: &[u8]) -> Result<(u64, u64)> {
        let _ = (module, name);
        Err(BackendError::NotSupported(
            "this backend's modules declare no variables (built-in kernels only)".into(),
        ))
    }

    /// Every variable of a loaded module this backend can name, with its address and
    /// size: what a migration carries so the module's state survives the move
    /// (docs/migration.md, "Module variables"). Each one listed becomes a valid range as
    /// after [`Modules::module_global`]. Default: none.
    fn module_globals(&self, module: u64) -> Result<Vec<ModuleGlobal>> {
        let _ = module;
        Ok(Vec::new())
    }

    /// Encodes a TMA tensor map descriptor (`CUtensorMap`, as `cuTensorMapEncodeTiled` or
    /// `cuTensorMapEncodeIm2col` does) for the tensor `map` describes. The tensor
    /// (`map.extent()` bytes from its global address) must lie inside one live allocation
    /// or module variable, checked before the driver sees anything; the parameters passed
    /// [`vgpu_proto::TensorMapArgs::check`]. The descriptor holds the tensor's device
    /// address, which stays valid for the allocation's life (migration included). Default:
    /// not supported (a backend whose kernels cannot use tensor maps).
    fn encode_tensor_map(
        &self,
        map: &vgpu_proto::TensorMapArgs,
    ) -> Result<[u8; vgpu_proto::TENSOR_MAP_BYTES]> {
        let _ = map;
        Err(BackendError::NotSupported(
            "this backend's kernels cannot use TMA tensor maps (a cuda vGPU on a GPU of compute capability 9.0 or higher can)".into(),
        ))
    }
}

/// Device memory objects shared between processes. Reached through
/// [`Backend::shared_memory`].
pub trait SharedMemory: Send + Sync {
    /// Creates a zeroed shared device memory object of `size` bytes on this vGPU's GPU and
    /// exports it as a file descriptor (sim: a sealed memfd; cuda: an exportable physical
    /// allocation, `cuMemCreate` + `cuMemExportToShareableHandle`). The descriptor is the
    /// object: nothing is charged to this vGPU, and any process maps it with
    /// [`SharedMemory::import`].
    fn export(&self, size: u64) -> Result<OwnedFd>;

    /// Maps a shared device memory object (`size` bytes) that another process created at a
    /// fresh device address of this vGPU; [`Backend::free`] of that address unmaps it.
    /// `handle` is the object's file descriptor (sim: a memfd; cuda: an exportable
    /// allocation handle).
    fn import(&self, handle: OwnedFd, size: u64, read_only: bool) -> Result<u64>;
}

/// CUDA's virtual memory management on a vGPU. Reached through
/// [`Backend::virtual_memory`].
///
/// A reserved range takes addresses out of the vGPU's address space (nothing is charged);
/// a physical allocation is charged to the vGPU's memory like [`Backend::alloc`] and lives
/// while a handle reference or a mapping holds it; a mapping is then an allocation like
/// any other at its address for copies, memsets, kernel pointers and pointer checks (a
/// range inside one mapping), which [`Backend::free`] refuses. Sizes, addresses and
/// alignments are multiples of [`VMM_GRANULARITY`]; everything is checked before anything
/// changes, and what is wrong answers `InvalidArgument`.
pub trait VirtualMemory: Send + Sync {
    /// Reserves `size` bytes of device addresses aligned to `align` (0: the granularity;
    /// else a power of two), at `hint` when that range is free and aligned (0: anywhere).
    fn reserve(&self, size: u64, align: u64, hint: u64) -> Result<u64>;

    /// Frees a reserved range, whole, once no mapping is left in it.
    fn free_range(&self, addr: u64, size: u64) -> Result<()>;

    /// Creates `size` bytes of zeroed physical memory charged to the vGPU; its handle
    /// (never 0, never reused) and the bytes charged. Past the vGPU's memory:
    /// `OutOfMemory`.
    fn create(&self, size: u64) -> Result<Created>;

    /// Drops one reference to a handle; the memory and its charge go when no reference
    /// and no mapping is left.
    fn release(&self, handle: u64) -> Result<()>;

    /// Maps `size` bytes of `handle`'s memory from `offset` (0) at `addr`, inside one
    /// reserved range, over no other mapping.
    fn map(&self, addr: u64, size: u64, offset: u64, handle: u64) -> Result<()>;

    /// Unmaps every mapping inside `[addr, addr + size)` (at least one, none cut).
    fn unmap(&self, addr: u64, size: u64) -> Result<()>;

    /// The handle of the allocation mapped at `addr` (any address inside a mapping), with
    /// one more reference: (handle, allocation size, mapping start, mapping size).
    fn retain(&self, addr: u64) -> Result<[u64; 4]>;

    /// Reserved ranges, live handles and mappings, together (what a migration would have
    /// to carry).
    fn objects(&self) -> usize;

    /// Bytes the live physical allocations charge now.
    fn charged(&self) -> u64;

    /// Everything this vGPU's virtual memory holds, for a migration to rebuild it on
    /// another backend at the same addresses under the same handles. Refused
    /// (`NotSupported`) when a physical allocation holds bytes but is mapped nowhere (a
    /// migration copies bytes through the mappings).
    fn snapshot(&self) -> Result<VmmSnapshot>;

    /// Rebuilds `snapshot` on this backend (a migration target with no virtual memory
    /// objects yet): the same reserved ranges, handles with their references, and
    /// mappings (zeroed: the migration copies the bytes through them).
    fn restore(&self, snapshot: &VmmSnapshot) -> Result<()>;
}

/// What a vGPU's virtual memory holds ([`VirtualMemory::snapshot`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VmmSnapshot {
    /// Reserved ranges: (first address, size).
    pub ranges: Vec<(u64, u64)>,
    /// Physical allocations: (handle, size, references; 0 when only mappings hold it).
    pub allocations: Vec<(u64, u64, u64)>,
    /// Mappings: (first address, size, handle).
    pub maps: Vec<(u64, u64, u64)>,
    /// The next handle the backend hands out (handles are never reused).
    pub next_handle: u64,
}

impl VmmSnapshot {
    /// Whether there is nothing to carry.
    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty() && self.allocations.is_empty() && self.maps.is_empty()
    }
}

/// Guest RAM prepared once as the source or destination of copies. Reached through
/// [`Backend::host_memory`].
pub trait HostMemory: Send + Sync {
    /// Tells the backend that `regions` (guest RAM mapped into this process) will be the
    /// source or destination of copies, so it can prepare them once (cuda: pin them with
    /// `cuMemHostRegister`, so copies run at DMA speed straight from guest memory) instead
    /// of per copy. The caller keeps every region mapped until it unregisters it. Copies
    /// from memory that was never registered still work, only slower.
    fn register(&self, regions: &[HostRegion]) -> Result<()>;

    /// Undoes [`HostMemory::register`] for `regions` (each exactly as registered); waits
    /// for copies still using them. Unknown regions are ignored.
    fn unregister(&self, regions: &[HostRegion]);

    /// Makes `region` (mapped in this process at the virtual address the tenant has the
    /// same bytes at) reachable by the GPU at that same address (cuda: registered with
    /// `DEVICEMAP | PORTABLE`, and only when the driver's device pointer equals the host
    /// address). From then on memsets, device-to-device copies and kernel pointers may name
    /// ranges inside it. The caller keeps it mapped until [`HostMemory::unmap_for_device`]
    /// and checks that regions do not overlap. Default: not supported.
    fn map_for_device(&self, region: HostRegion) -> Result<()> {
        let _ = region;
        Err(BackendError::NotSupported(
            "this backend cannot map host memory for the device".into(),
        ))
    }

    /// Undoes [`HostMemory::map_for_device`]; the caller has synchronised the backend
    /// first (nothing uses the region). Unknown regions are ignored.
    fn unmap_for_device(&self, region: HostRegion) {
        let _ = region;
    }
}

/// Device memory given back and taken again at the same device addresses: the
/// [`pager`](crate::pager) swaps through it. Reached through [`Backend::paging`].
///
/// Like the data path, every method checks its range against the live allocations.
pub trait Paging: Send + Sync {
    /// Size of the pieces [`Paging::decommit`] works in, in bytes; 0 = whole allocations
    /// only. Default: 0.
    fn commit_granule(&self) -> u64 {
        0
    }

    /// Gives the device memory behind `[addr + off, addr + off + len)` back, keeping the
    /// addresses taken (swap-out): until [`Paging::recommit`] the range must not be
    /// touched. `addr` is an allocation's start; `off` and `len` are multiples of
    /// [`Paging::commit_granule`] (or cover the whole allocation), the last piece may end
    /// at the allocation's charged size.
    fn decommit(&self, addr: u64, off: u64, len: u64) -> Result<()>;

    /// Backs a decommitted range with device memory again, at the same addresses; its
    /// content is undefined until written.
    fn recommit(&self, addr: u64, off: u64, len: u64) -> Result<()>;
}

/// What a live migration needs of a backend beyond the data path (reached through
/// [`Backend::relocation`]): a target places every allocation at the address it has on the
/// source, the source copies its bytes to the target, and at the switch the device
/// addresses change hands between the two backends of this process.
pub trait Relocatable: Send + Sync {
    /// Allocates `size` bytes at exactly `addr` (a migrated vGPU keeps every device
    /// address).
    fn alloc_at(&self, addr: u64, size: u64) -> Result<Allocated>;

    /// Copies `[addr, addr + len)` of this device's memory to the same addresses on
    /// `peer` (a migration target): directly where the peer offers a
    /// [`Relocatable::device_window`] this backend can use, else through host memory
    /// ([`copy_through_host`]).
    fn copy_to_peer(&self, peer: &dyn Backend, addr: u64, len: u64) -> Result<u64>;

    /// Where a backend of the same kind in this process can reach `[addr, addr + len)` of
    /// this device's memory directly, so a migration copies device to device without the
    /// host. The window stays valid while the allocation lives and is not decommitted; the
    /// caller (the migration, which owns this backend as its target) guarantees that.
    /// Default: none (copies go through the host).
    fn device_window(&self, addr: u64, len: u64) -> Option<DeviceWindow> {
        let _ = (addr, len);
        None
    }

    /// At the switch (dispatch stopped, nothing running): gives up this backend's hold on
    /// the vGPU's device addresses so that the successor in this process can map its
    /// memory there (cuda: unmaps every allocation, keeping its memory). The backend serves
    /// nothing afterwards unless [`Relocatable::reoccupy_addresses`] undoes it. Default:
    /// nothing to give up (sim addresses are per backend).
    fn vacate_addresses(&self) -> Result<()> {
        Ok(())
    }

    /// Undoes [`Relocatable::vacate_addresses`] when the successor could not take over.
    fn reoccupy_addresses(&self) -> Result<()> {
        Ok(())
    }

    /// At the switch: moves this backend's memory (a migration target, staged elsewhere
    /// until now) to the vGPU's device addresses, which the predecessor has just vacated.
    /// Default: nothing to move.
    fn occupy_addresses(&self) -> Result<()> {
        Ok(())
    }
}

/// `b`'s [`Paging`], or [`BackendError::NotSupported`] saying that it cannot swap.
pub fn require_paging(b: &dyn Backend) -> Result<&dyn Paging> {
    b.paging()
        .ok_or_else(|| BackendError::NotSupported("this backend cannot swap device memory".into()))
}

/// `b`'s [`SharedMemory`], or [`BackendError::NotSupported`] saying that it cannot share
/// device memory.
pub fn require_shared_memory(b: &dyn Backend) -> Result<&dyn SharedMemory> {
    b.shared_memory().ok_or_else(|| {
        BackendError::NotSupported("this backend cannot create or map shared device memory".into())
    })
}

/// `b`'s [`Relocatable`], or [`BackendError::NotSupported`] saying that it cannot keep
/// device addresses across GPUs.
pub fn require_relocation(b: &dyn Backend) -> Result<&dyn Relocatable> {
    b.relocation().ok_or_else(|| {
        BackendError::NotSupported(
            "this backend cannot place allocations at given addresses".into(),
        )
    })
}

/// Copies `[addr, addr + len)` of `src` to the same addresses on `peer`: directly when
/// `src` is [`Relocatable`], else through host memory.
pub fn copy_to_peer(src: &dyn Backend, peer: &dyn Backend, addr: u64, len: u64) -> Result<u64> {
    match src.relocation() {
        Some(r) => r.copy_to_peer(peer, addr, len),
        None => copy_through_host(src, peer, addr, len),
    }
}

/// [`Relocatable::copy_to_peer`] through host memory in 64 MiB pieces (what backends
/// without a direct path do).
pub fn copy_through_host<B: Backend + ?Sized>(
    src: &B,
    peer: &dyn Backend,
    addr: u64,
    len: u64,
) -> Result<u64> {
    const PIECE: u64 = 64 << 20;
    let mut buf = vec![0u8; PIECE.min(len) as usize];
    let mut off = 0;
    while off < len {
        let n = PIECE.min(len - off) as usize;
        let slice = VolatileSlice::from(&mut buf[..n]);
        src.copy_dtoh(addr + off, &slice)?;
        peer.copy_htod(addr + off, &slice)?;
        off += n as u64;
    }
    Ok(len)
}

/// See [`Relocatable::device_window`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceWindow {
    /// `vgpu_proto::backend_kind` of the memory.
    pub kind: u32,
    /// The range's first address in the process's unified address space.
    pub ptr: u64,
    /// The driver context that owns the memory (cuda: a `CUcontext`), as an integer.
    pub context: usize,
}
