//! The fixed argument struct of each opcode (after the header, same descriptor).
//! `LAUNCH`'s variable part is in [`crate::launch`].

use crate::wire::wire_struct;

wire_struct! {
    /// `ALLOC`: result[0] = device address, result[1] = bytes charged to the share.
    pub struct AllocArgs, size 16 {
        /// Bytes, > 0.
        pub size: u64,
        /// Must be 0.
        pub flags: u64,
    }
}

wire_struct! {
    /// `FREE`.
    pub struct FreeArgs, size 8 {
        /// The address `ALLOC` returned.
        pub addr: u64,
    }
}

wire_struct! {
    /// `MEMCPY_HTOD`: readable data descriptors adding up to `size`.
    /// result[0] = bytes copied.
    pub struct MemcpyHtoDArgs, size 16 {
        /// Destination device address.
        pub dst: u64,
        /// Bytes.
        pub size: u64,
    }
}

wire_struct! {
    /// `MEMCPY_DTOH`: writable data descriptors adding up to `size`.
    /// result[0] = bytes copied.
    pub struct MemcpyDtoHArgs, size 16 {
        /// Source device address.
        pub src: u64,
        /// Bytes.
        pub size: u64,
    }
}

wire_struct! {
    /// `MEMCPY_DTOD` (ranges may overlap: it behaves like `memmove`).
    /// result[0] = bytes copied.
    pub struct MemcpyDtoDArgs, size 24 {
        /// Destination device address.
        pub dst: u64,
        /// Source device address.
        pub src: u64,
        /// Bytes.
        pub size: u64,
    }
}

wire_struct! {
    /// `MEMSET`: `count` elements of `elem_size` bytes (1, 2 or 4) set to the low bytes of
    /// `value`. `dst` must be aligned to `elem_size`. result[0] = bytes written.
    pub struct MemsetArgs, size 24 {
        /// Destination device address.
        pub dst: u64,
        /// Number of elements.
        pub count: u64,
        /// The value (little endian; only the low `elem_size` bytes are used).
        pub value: u32,
        /// 1, 2 or 4.
        pub elem_size: u32,
    }
}

/// `ModuleLoadArgs::kind` values.
pub mod module_kind {
    /// The data descriptors hold the name of a built-in module (e.g. `builtin`).
    pub const BUILTIN: u32 = 0;
    /// The data descriptors hold PTX text (NUL terminator optional).
    pub const PTX: u32 = 1;
    /// The data descriptors hold a cubin (ELF) or fatbin image, loaded natively by the
    /// GPU's driver. Needs `features::BINARY_MODULES` (since 1.1); elsewhere the device
    /// answers `NOT_SUPPORTED`.
    pub const BINARY: u32 = 2;
}

/// The length a cubin (64-bit ELF) or fatbin image (`module_kind::BINARY`) says it has,
/// if it is one and `bytes` holds all of it: the driver reads a binary image's length from
/// its own header, so a device checks it before handing the image over.
pub fn binary_image_len(bytes: &[u8]) -> Option<usize> {
    let len = binary_image_declared_len(bytes)?;
    (len > 0 && len <= bytes.len()).then_some(len)
}

/// The length the header at the start of `bytes` (64 bytes are enough) gives a cubin (64-bit
/// little-endian ELF: the end of its section or program header table, whichever is later)
/// or a fatbin (header size plus payload size); `None` if it is neither.
pub fn binary_image_declared_len(bytes: &[u8]) -> Option<usize> {
    let u16_at = |o: usize| {
        bytes
            .get(o..o + 2)
            .and_then(|b| b.try_into().ok())
            .map(u16::from_le_bytes)
    };
    let u32_at = |o: usize| {
        bytes
            .get(o..o + 4)
            .and_then(|b| b.try_into().ok())
            .map(u32::from_le_bytes)
    };
    let u64_at = |o: usize| {
        bytes
            .get(o..o + 8)
            .and_then(|b| b.try_into().ok())
            .map(u64::from_le_bytes)
    };
    let len = if bytes.starts_with(b"\x7fELF") {
        // The sections lie before the section header table in what nvcc writes.
        if bytes.get(4) != Some(&2) || bytes.get(5) != Some(&1) {
            return None;
        }
        let shoff = u64_at(0x28)?;
        let shentsize = u64::from(u16_at(0x3a)?);
        let shnum = u64::from(u16_at(0x3c)?);
        let phoff = u64_at(0x20)?;
        let phentsize = u64::from(u16_at(0x36)?);
        let phnum = u64::from(u16_at(0x38)?);
        let sh_end = shoff.checked_add(shentsize.checked_mul(shnum)?)?;
        let ph_end = phoff.checked_add(phentsize.checked_mul(phnum)?)?;
        sh_end.max(ph_end)
    } else if u32_at(0)? == 0xba55_ed50 {
        // Fatbin header: magic, version (u16), header size (u16), payload size (u64).
        let header = u64::from(u16_at(6)?);
        header.checked_add(u64_at(8)?)?
    } else {
        return None;
    };
    usize::try_from(len).ok()
}

/// The name of the built-in module every device offers.
pub const BUILTIN_MODULE: &str = "builtin";

wire_struct! {
    /// `MODULE_LOAD`: readable data descriptors adding up to `size` bytes hold the module
    /// name, PTX text or binary image. result[0] = module handle (never 0), result[1] =
    /// bytes of device memory the module is charged against the share (since 1.1): its
    /// image and declared `.global`/`.const` variables in whole pages, until it is unloaded.
    pub struct ModuleLoadArgs, size 16 {
        /// A [`module_kind`] value.
        pub kind: u32,
        /// Must be 0.
        pub flags: u32,
        /// Bytes in the data descriptors.
        pub size: u64,
    }
}

wire_struct! {
    /// `MODULE_UNLOAD`. Functions of the module become unknown.
    pub struct ModuleUnloadArgs, size 8 {
        /// The handle `MODULE_LOAD` returned.
        pub module: u64,
    }
}

wire_struct! {
    /// `GET_FUNCTION`: readable data descriptors adding up to `name_len` bytes hold the
    /// function name. result[0] = function handle (never 0), result[1] = parameter count.
    pub struct GetFunctionArgs, size 16 {
        /// Module handle.
        pub module: u64,
        /// Bytes of the name, 1..=`MAX_NAME_LEN`.
        pub name_len: u64,
    }
}

wire_struct! {
    /// `GET_GLOBAL` (since 1.2): readable data descriptors adding up to `name_len` bytes
    /// hold the variable's name. result[0] = its device address, result[1] = its size in
    /// bytes. The range belongs to the module: it is freed when the module is unloaded and
    /// `FREE` refuses it.
    pub struct GetGlobalArgs, size 16 {
        /// Module handle.
        pub module: u64,
        /// Bytes of the name, 1..=`MAX_NAME_LEN`.
        pub name_len: u64,
    }
}

wire_struct! {
    /// `EVENT_RECORD`, `EVENT_QUERY`, `EVENT_DESTROY`. Event ids are chosen by the guest
    /// (any u64); `EVENT_RECORD` creates the event or re-records it.
    /// `EVENT_QUERY`: result[0] = 1 once recorded, result[1] = timestamp (ns, device clock).
    pub struct EventArgs, size 8 {
        /// Guest-chosen event id.
        pub event: u64,
    }
}

wire_struct! {
    /// `EVENT_ELAPSED`: result[0] = nanoseconds from `start` to `end` (0 if `end` was
    /// recorded before `start`), result[1] = the same in microseconds.
    pub struct EventElapsedArgs, size 16 {
        /// Event recorded first.
        pub start: u64,
        /// Event recorded second.
        pub end: u64,
    }
}

wire_struct! {
    /// `SHM_GET`: result[0] = shm id.
    pub struct ShmGetArgs, size 24 {
        /// Key shared between the cooperating vGPUs.
        pub key: u64,
        /// Bytes.
        pub size: u64,
        /// [`shm_flags`] bits.
        pub flags: u64,
    }
}

/// `ShmGetArgs::flags` bits (like `IPC_CREAT`/`IPC_EXCL`).
pub mod shm_flags {
    /// Create the object if the key is new.
    pub const CREATE: u64 = 1 << 0;
    /// With CREATE: fail if the key exists.
    pub const EXCLUSIVE: u64 = 1 << 1;
}

wire_struct! {
    /// `SHM_AT`: result[0] = device address of the mapping.
    pub struct ShmAtArgs, size 16 {
        /// The id `SHM_GET` returned.
        pub shmid: u64,
        /// Bit 0: read-only mapping.
        pub flags: u64,
    }
}

wire_struct! {
    /// `SHM_DT`.
    pub struct ShmDtArgs, size 8 {
        /// The address `SHM_AT` returned.
        pub addr: u64,
    }
}

/// `ShmCtlArgs::cmd` values.
pub mod shm_cmd {
    /// Remove the object once the last mapper detaches.
    pub const RMID: u32 = 0;
    /// result[0] = size, result[1] = number of attachments, result[2] = key.
    pub const STAT: u32 = 1;
}

wire_struct! {
    /// `SHM_CTL`.
    pub struct ShmCtlArgs, size 16 {
        /// The id `SHM_GET` returned.
        pub shmid: u64,
        /// A [`shm_cmd`] value.
        pub cmd: u32,
        /// Must be 0.
        pub flags: u32,
    }
}

wire_struct! {
    /// `STORAGE_ATTACH`: result[0] = the handle the storage kernels take as their `ns`
    /// argument (on this protocol version the namespace id itself), result[1] = the
    /// namespace's size in bytes, result[2] = its logical block size, result[3] = 1 if it
    /// is read-only. Attaching again returns the same. Unknown namespace:
    /// `INVALID_ARGUMENT`; a namespace whose backing store is gone: `DEVICE_ERROR`.
    pub struct StorageAttachArgs, size 16 {
        /// Host-assigned storage namespace id (the operator attaches it to the vGPU).
        pub namespace: u64,
        /// Must be 0.
        pub flags: u64,
    }
}

wire_struct! {
    /// `VA_RESERVE` (since 1.5): result[0] = the first address of the reserved range.
    /// Nothing is charged: a reservation holds addresses, not memory. `size` and `align`
    /// are multiples of [`crate::VMM_GRANULARITY`]; `hint` is taken when that range is
    /// free and aligned, else the range goes wherever it fits.
    pub struct VaReserveArgs, size 32 {
        /// Bytes, > 0.
        pub size: u64,
        /// Alignment of the range's start; 0 = the granularity; else a power of two.
        pub align: u64,
        /// Preferred first address; 0 = none.
        pub hint: u64,
        /// Must be 0.
        pub flags: u64,
    }
}

wire_struct! {
    /// `VA_FREE` (since 1.5): frees a whole reserved range that no mapping uses any more.
    pub struct VaFreeArgs, size 16 {
        /// The address `VA_RESERVE` returned.
        pub addr: u64,
        /// The size it was reserved with.
        pub size: u64,
    }
}

wire_struct! {
    /// `MEM_CREATE` (since 1.5): result[0] = the allocation's handle (never 0), result[1] =
    /// bytes charged to the share (as `ALLOC` charges them). The memory is zero-filled.
    pub struct MemCreateArgs, size 16 {
        /// Bytes, > 0, a multiple of [`crate::VMM_GRANULARITY`].
        pub size: u64,
        /// Must be 0.
        pub flags: u64,
    }
}

wire_struct! {
    /// `MEM_RELEASE` (since 1.5): drops one reference to a handle (`MEM_CREATE` made one,
    /// each `MEM_RETAIN` one more). The memory and its charge go once no reference and no
    /// mapping is left.
    pub struct MemReleaseArgs, size 8 {
        /// The handle.
        pub handle: u64,
    }
}

wire_struct! {
    /// `MEM_MAP` (since 1.5): maps `size` bytes of the allocation `handle` from `offset`
    /// at `addr`. The range lies inside one reserved range, overlaps no mapping, and
    /// `addr`, `size` are multiples of [`crate::VMM_GRANULARITY`]; `offset` is 0 (as the
    /// CUDA driver requires) and `size` at most the allocation's. The mapping is then an
    /// allocation like `ALLOC`'s for copies, memsets and kernel pointers (a range inside
    /// one mapping); `FREE` refuses it.
    pub struct MemMapArgs, size 32 {
        /// First device address.
        pub addr: u64,
        /// Bytes.
        pub size: u64,
        /// Offset into the allocation: 0.
        pub offset: u64,
        /// The handle `MEM_CREATE` or `MEM_RETAIN` returned.
        pub handle: u64,
    }
}

wire_struct! {
    /// `MEM_UNMAP` (since 1.5): unmaps every mapping inside `[addr, addr + size)`; the
    /// range must hold at least one and cut none.
    pub struct MemUnmapArgs, size 16 {
        /// First device address.
        pub addr: u64,
        /// Bytes.
        pub size: u64,
    }
}

wire_struct! {
    /// `MEM_RETAIN` (since 1.5): result[0] = the handle of the allocation mapped at `addr`
    /// (one more reference: release it with `MEM_RELEASE`), result[1] = the allocation's
    /// size, result[2] = the mapping's first address, result[3] = the mapping's size.
    pub struct MemRetainArgs, size 8 {
        /// Any address inside a mapping.
        pub addr: u64,
    }
}

wire_struct! {
    /// `HOST_MAP` (since 1.7, capability `HOST_MAP`): maps the `len` bytes of the
    /// frontend's DMA memory at guest-physical `gpa` a second time into the worker, at
    /// virtual address `addr` (where the frontend, a process, has the same bytes), and
    /// registers that mapping with the GPU, so kernels, memsets and device-to-device copies
    /// reach the memory at `addr`, as CUDA reaches pinned host memory under unified
    /// addressing. `[gpa, gpa + len)` lies inside one region of the memory table; `gpa`,
    /// `len` and `addr` are multiples of 4096, `len` is not 0, no two mapped ranges
    /// overlap, and `addr` must be free in the worker. result[0] = `addr`.
    pub struct HostMapArgs, size 24 {
        /// First guest-physical address of the range.
        pub gpa: u64,
        /// Bytes.
        pub len: u64,
        /// The frontend's virtual address of the range's first byte.
        pub addr: u64,
    }
}
