//! Request opcodes.

/// What a request asks the device to do. The numeric value is the header's `opcode`.
///
/// Groups are numbered by the high byte so a future minor version can add an opcode next
/// to its kin without renumbering.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Opcode {
    /// Device information ([`crate::DeviceInfo`] into one writable data descriptor).
    GetInfo = 0x0001,
    /// The physical GPU's attributes ([`crate::DeviceAttributes`] into one writable data
    /// descriptor). Since 1.1 (`features::ATTRIBUTES`).
    GetAttributes = 0x0002,
    /// Allocate device memory.
    Alloc = 0x0100,
    /// Free device memory.
    Free = 0x0101,
    /// Copy guest memory (readable data descriptors) to device memory.
    MemcpyHtoD = 0x0200,
    /// Copy device memory to guest memory (writable data descriptors).
    MemcpyDtoH = 0x0201,
    /// Copy device memory to device memory.
    MemcpyDtoD = 0x0202,
    /// Fill device memory with an 8, 16 or 32-bit value.
    Memset = 0x0203,
    /// Load a module: a built-in module by name or PTX text (readable data descriptors).
    ModuleLoad = 0x0300,
    /// Unload a module.
    ModuleUnload = 0x0301,
    /// Look up a function of a loaded module by name (readable data descriptors).
    GetFunction = 0x0302,
    /// `GET_FUNCTION` that also writes the function's parameter layout
    /// ([`crate::ParamLayout`]) into a writable descriptor after the name. Since 1.1
    /// (`features::PARAM_LAYOUT`).
    GetFunctionLayout = 0x0303,
    /// Look up a module-scope variable (`__device__`, `__constant__`) of a loaded module by
    /// name (readable data descriptors): its device address and size. Since 1.2
    /// (`features::GLOBALS`).
    GetGlobal = 0x0304,
    /// A function's thread block cluster occupancy as the GPU's driver answers it
    /// ([`crate::ClusterOccupancyArgs`]). Since 1.6 (`features::CLUSTER_OCCUPANCY`).
    ClusterOccupancy = 0x0305,
    /// Launch a kernel.
    Launch = 0x0400,
    /// Complete after every earlier request on this queue has completed.
    StreamSync = 0x0500,
    /// Complete after every request other queues of this vGPU are executing has completed.
    Fence = 0x0501,
    /// Record an event: a timestamp taken once all earlier requests on this queue completed.
    EventRecord = 0x0600,
    /// Ask whether an event has been recorded, and its timestamp.
    EventQuery = 0x0601,
    /// Nanoseconds between two recorded events.
    EventElapsed = 0x0602,
    /// Forget an event.
    EventDestroy = 0x0603,
    /// Create or look up a shared device memory object (like `shmget`).
    ShmGet = 0x0700,
    /// Map a shared object into this vGPU's address space (like `shmat`).
    ShmAt = 0x0701,
    /// Unmap a shared object (like `shmdt`).
    ShmDt = 0x0702,
    /// Control a shared object: remove or stat (like `shmctl`).
    ShmCtl = 0x0703,
    /// Attach an NVMe storage namespace for GPU-initiated access.
    StorageAttach = 0x0800,
    /// Encode a TMA tensor map descriptor (`CUtensorMap`) for a tensor in this vGPU's
    /// memory ([`crate::TensorMapArgs`]; the 128 bytes into one writable data
    /// descriptor). Since 1.4 (`features::TENSOR_MAPS`).
    EncodeTensorMap = 0x0900,
    /// Reserve a range of device addresses without memory ([`crate::VaReserveArgs`]).
    /// Since 1.5 (`features::VIRTUAL_MEMORY`), as are the six below.
    VaReserve = 0x0A00,
    /// Free a reserved range ([`crate::VaFreeArgs`]).
    VaFree = 0x0A01,
    /// Create a physical allocation, charged to the share ([`crate::MemCreateArgs`]).
    MemCreate = 0x0A02,
    /// Release a physical allocation's handle ([`crate::MemReleaseArgs`]).
    MemRelease = 0x0A03,
    /// Map a physical allocation into a reserved range ([`crate::MemMapArgs`]).
    MemMap = 0x0A04,
    /// Unmap a mapped range ([`crate::MemUnmapArgs`]).
    MemUnmap = 0x0A05,
    /// Retain the handle of the physical allocation mapped at an address
    /// ([`crate::MemRetainArgs`]).
    MemRetain = 0x0A06,
    /// Make a range of the frontend's DMA memory reachable by the GPU at the frontend's
    /// own virtual address ([`crate::HostMapArgs`]). Since 1.7 (`features::HOST_MAP`).
    HostMap = 0x0B00,
}

impl Opcode {
    /// Every opcode, for tables and tests.
    pub const ALL: [Opcode; 35] = [
        Opcode::GetInfo,
        Opcode::GetAttributes,
        Opcode::Alloc,
        Opcode::Free,
        Opcode::MemcpyHtoD,
        Opcode::MemcpyDtoH,
        Opcode::MemcpyDtoD,
        Opcode::Memset,
        Opcode::ModuleLoad,
        Opcode::ModuleUnload,
        Opcode::GetFunction,
        Opcode::GetFunctionLayout,
        Opcode::GetGlobal,
        Opcode::ClusterOccupancy,
        Opcode::Launch,
        Opcode::StreamSync,
        Opcode::Fence,
        Opcode::EventRecord,
        Opcode::EventQuery,
        Opcode::EventElapsed,
        Opcode::EventDestroy,
        Opcode::ShmGet,
        Opcode::ShmAt,
        Opcode::ShmDt,
        Opcode::ShmCtl,
        Opcode::StorageAttach,
        Opcode::EncodeTensorMap,
        Opcode::VaReserve,
        Opcode::VaFree,
        Opcode::MemCreate,
        Opcode::MemRelease,
        Opcode::MemMap,
        Opcode::MemUnmap,
        Opcode::MemRetain,
        Opcode::HostMap,
    ];

    /// The opcode with this wire value, if any.
    pub fn from_u32(v: u32) -> Option<Opcode> {
        Self::ALL.iter().copied().find(|o| *o as u32 == v)
    }

    /// A short name for logs.
    pub fn name(self) -> &'static str {
        match self {
            Opcode::GetInfo => "GET_INFO",
            Opcode::GetAttributes => "GET_ATTRIBUTES",
            Opcode::Alloc => "ALLOC",
            Opcode::Free => "FREE",
            Opcode::MemcpyHtoD => "MEMCPY_HTOD",
            Opcode::MemcpyDtoH => "MEMCPY_DTOH",
            Opcode::MemcpyDtoD => "MEMCPY_DTOD",
            Opcode::Memset => "MEMSET",
            Opcode::ModuleLoad => "MODULE_LOAD",
            Opcode::ModuleUnload => "MODULE_UNLOAD",
            Opcode::GetFunction => "GET_FUNCTION",
            Opcode::GetFunctionLayout => "GET_FUNCTION_LAYOUT",
            Opcode::GetGlobal => "GET_GLOBAL",
            Opcode::ClusterOccupancy => "CLUSTER_OCCUPANCY",
            Opcode::Launch => "LAUNCH",
            Opcode::StreamSync => "STREAM_SYNC",
            Opcode::Fence => "FENCE",
            Opcode::EventRecord => "EVENT_RECORD",
            Opcode::EventQuery => "EVENT_QUERY",
            Opcode::EventElapsed => "EVENT_ELAPSED",
            Opcode::EventDestroy => "EVENT_DESTROY",
            Opcode::ShmGet => "SHM_GET",
            Opcode::ShmAt => "SHM_AT",
            Opcode::ShmDt => "SHM_DT",
            Opcode::ShmCtl => "SHM_CTL",
            Opcode::StorageAttach => "STORAGE_ATTACH",
            Opcode::EncodeTensorMap => "ENCODE_TENSOR_MAP",
            Opcode::VaReserve => "VA_RESERVE",
            Opcode::VaFree => "VA_FREE",
            Opcode::MemCreate => "MEM_CREATE",
            Opcode::MemRelease => "MEM_RELEASE",
            Opcode::MemMap => "MEM_MAP",
            Opcode::MemUnmap => "MEM_UNMAP",
            Opcode::MemRetain => "MEM_RETAIN",
            Opcode::HostMap => "HOST_MAP",
        }
    }

    /// Which data descriptors (between the header and the response) this opcode takes.
    pub fn data_shape(self) -> DataShape {
        match self {
            Opcode::GetInfo | Opcode::GetAttributes | Opcode::EncodeTensorMap => {
                DataShape::WritableInfo
            }
            Opcode::MemcpyHtoD | Opcode::ModuleLoad | Opcode::GetFunction | Opcode::GetGlobal => {
                DataShape::Readable
            }
            Opcode::MemcpyDtoH => DataShape::Writable,
            Opcode::GetFunctionLayout => DataShape::ReadableThenAnswer,
            _ => DataShape::None,
        }
    }
}

/// The data descriptors an opcode expects between its header and its response.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DataShape {
    /// No data descriptors.
    None,
    /// Device-readable descriptors whose lengths add up to the size the args name.
    Readable,
    /// Device-writable descriptors whose lengths add up to the size the args name.
    Writable,
    /// Exactly one device-writable descriptor of at least the answer's size
    /// (`DeviceInfo::SIZE`, `DeviceAttributes::SIZE`, `TENSOR_MAP_BYTES`).
    WritableInfo,
    /// Device-readable descriptors whose lengths add up to the size the args name, then
    /// exactly one device-writable descriptor of at least the answer's size
    /// (`ParamLayout::SIZE`).
    ReadableThenAnswer,
}
