//! The virtio device ID, the device config space and the device capability bits.

use crate::wire::wire_struct;

/// The virtio device ID of the vGPU device.
///
/// Assigned virtio device IDs (virtio 1.3 §5) are small numbers (below 0x40 today);
/// 0x5647 ("VG") lies far outside that range, so no standard driver ever binds to it.
/// virtio-mmio carries it in the 32-bit `DeviceID` register.
pub const VIRTIO_ID_VGPU: u32 = 0x5647;

/// Device capability bits in [`VgpuConfig::features`] and `DeviceInfo::features`.
///
/// These are not virtio feature bits (nothing is negotiated): they say which optional
/// opcodes the device implements. An opcode whose bit is clear answers `NotSupported`.
pub mod features {
    /// The built-in kernel module ("builtin") can be loaded.
    pub const BUILTIN_KERNELS: u64 = 1 << 0;
    /// `MODULE_LOAD` accepts PTX text.
    pub const PTX: u64 = 1 << 1;
    /// `EVENT_*` opcodes work.
    pub const EVENTS: u64 = 1 << 2;
    /// `SHM_*` opcodes work (shared device memory).
    pub const SHM: u64 = 1 << 3;
    /// `STORAGE_ATTACH` works (GPU-initiated NVMe access).
    pub const STORAGE: u64 = 1 << 4;
    /// The device orders ready launches by the task-graph rank/dependencies they carry.
    pub const TASK_GRAPH: u64 = 1 << 5;
    /// The device may oversubscribe memory (swap); addresses never change.
    pub const OVERSUBSCRIBE: u64 = 1 << 6;
    /// `MODULE_LOAD` accepts cubin and fatbin images (`module_kind::BINARY`). Since 1.1.
    pub const BINARY_MODULES: u64 = 1 << 7;
    /// `GET_ATTRIBUTES` answers the physical GPU's attributes. Since 1.1.
    pub const ATTRIBUTES: u64 = 1 << 8;
    /// `GET_FUNCTION_LAYOUT` answers a function's parameter layout and `LAUNCH` takes
    /// `ArgKind::Bytes` arguments. Since 1.1.
    pub const PARAM_LAYOUT: u64 = 1 << 9;
    /// `GET_GLOBAL` answers a module variable's device address and size, and that range
    /// is a valid target of copies, memsets and kernel pointers until the module is
    /// unloaded. Since 1.2.
    pub const GLOBALS: u64 = 1 << 10;
    /// `LAUNCH` takes `ArgKind::Blob` arguments: by-value parameters of 9 bytes up to
    /// `MAX_PARAM_BLOB_BYTES`, carried after the dependency ids. Since 1.2.
    pub const PARAM_BLOBS: u64 = 1 << 11;
    /// `GET_FUNCTION_LAYOUT` also answers the function's [`crate::FunctionAttributes`]
    /// when its writable descriptor has room for them. Since 1.3.
    pub const FUNCTION_ATTRIBUTES: u64 = 1 << 12;
    /// `LAUNCH` runs thread block clusters (`LAUNCH_CLUSTER` in its flags). Since 1.4.
    pub const CLUSTERS: u64 = 1 << 13;
    /// `ENCODE_TENSOR_MAP` encodes TMA tensor map descriptors with the GPU's driver (a
    /// GPU of compute capability 9.0 or higher). Since 1.4.
    pub const TENSOR_MAPS: u64 = 1 << 14;
    /// `VA_RESERVE`, `VA_FREE`, `MEM_CREATE`, `MEM_RELEASE`, `MEM_MAP`, `MEM_UNMAP` and
    /// `MEM_RETAIN` work: CUDA's virtual memory management (address ranges reserved apart
    /// from physical memory, physical allocations mapped into them). Since 1.5.
    pub const VIRTUAL_MEMORY: u64 = 1 << 15;
    /// `CLUSTER_OCCUPANCY` answers a function's thread block cluster occupancy with the
    /// GPU's driver (a cuda vGPU that offers `CLUSTERS`). Since 1.6.
    pub const CLUSTER_OCCUPANCY: u64 = 1 << 16;
    /// `HOST_MAP` works: the frontend's DMA memory can be made reachable by the GPU at the
    /// frontend's own addresses (a process frontend's pinned host memory). Since 1.7.
    pub const HOST_MAP: u64 = 1 << 17;
}

/// Shares are given in per-mille: 1000 = the whole physical GPU's compute or copy engine.
pub const SHARE_SCALE: u32 = 1000;

wire_struct! {
    /// The device-specific config space (virtio-mmio offset 0x100), read-only for the guest.
    ///
    /// All fields little endian. The guest must check `version` (see
    /// [`crate::version_compatible`]) before sending any request.
    pub struct VgpuConfig, size 56 {
        /// Protocol version the device speaks ([`crate::PROTOCOL_VERSION`]).
        pub version: u32,
        /// The host-wide id of this vGPU.
        pub vgpu_id: u32,
        /// Number of request queues (one per guest stream).
        pub num_queues: u32,
        /// Largest number of kernel arguments a `LAUNCH` may carry.
        pub max_kernel_args: u32,
        /// Capability bits ([`features`]).
        pub features: u64,
        /// Device memory this vGPU may allocate, in bytes.
        pub memory_share: u64,
        /// Guaranteed compute bandwidth, per-mille of the physical GPU.
        pub compute_share: u32,
        /// Guaranteed memory-copy bandwidth, per-mille of the physical GPU's copy engine.
        pub copy_share: u32,
        /// First device address of the vGPU's address space.
        pub va_base: u64,
        /// Size of the vGPU's device address space in bytes.
        pub va_size: u64,
    }
}
