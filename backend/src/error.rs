//! Backend errors, each mapped to the wire status the guest receives.

use vgpu_proto::Status;

/// Why a backend operation failed. Messages say what the caller can do about it.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// An allocation of size 0.
    #[error("allocation of 0 bytes; ask for at least 1 byte")]
    ZeroSize,
    /// Not enough device memory.
    #[error("out of device memory: {requested} bytes requested, {available} of {capacity} available; free memory or ask the operator for a larger share")]
    OutOfMemory {
        /// Bytes charged for the request.
        requested: u64,
        /// Bytes still free.
        available: u64,
        /// Total bytes.
        capacity: u64,
    },
    /// The memory broker (vgpud) could not make room on the physical GPU.
    #[error("device memory for {requested} bytes is not available now: {why}; free memory, retry later, or ask the operator for a larger or non-oversubscribed share")]
    MemoryPressure {
        /// Bytes that had to become resident.
        requested: u64,
        /// The broker's reason.
        why: String,
    },
    /// A module load would pass the vGPU's module limits (count or bytes).
    #[error(
        "loading this module needs {requested} bytes of module memory: {why}; unload modules first"
    )]
    ModuleLimit {
        /// Bytes the module would be charged (whole pages).
        requested: u64,
        /// Which limit, and where it stands.
        why: String,
    },
    /// The vGPU's memory share cannot hold its GPU context's reserve (cuda: per-thread
    /// stacks of every resident thread, device heap, printf FIFO).
    #[error("the vGPU's memory share of {share} bytes cannot hold its CUDA context reserve of {reserve} bytes ({detail}); give the vGPU a share of at least {reserve} bytes plus what it allocates, or lower the context limits (vgpu-worker --cuda-stack, --cuda-heap, --cuda-printf-fifo)")]
    ContextReserve {
        /// The vGPU's memory share in bytes.
        share: u64,
        /// The context's reserve in bytes.
        reserve: u64,
        /// How the reserve is made up.
        detail: String,
    },
    /// A kernel needs more local memory per thread than the context's stack limit, which
    /// the driver would otherwise grow (uncharged) at launch.
    #[error("{function} needs {need} bytes of local memory per thread, more than this vGPU's stack limit of {limit} bytes (charged to its memory share for every resident thread); use less local memory (smaller local arrays, shallower calls) or ask the operator for a larger stack (vgpu-worker --cuda-stack)")]
    LocalMemory {
        /// The function's name.
        function: String,
        /// Its local memory per thread (`CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES`).
        need: u64,
        /// The context's stack limit per thread.
        limit: u64,
    },
    /// The host has no memory left to back device memory.
    #[error("the host has no memory left to back {requested} bytes of device memory; free memory on the host or lower the vGPU's memory share")]
    HostOutOfMemory {
        /// Bytes requested.
        requested: u64,
    },
    /// The device address space has no hole large enough.
    #[error(
        "device address space exhausted ({requested} bytes requested); free allocations first"
    )]
    AddressSpaceFull {
        /// Bytes requested.
        requested: u64,
    },
    /// A device range not inside one live allocation.
    #[error("device range {addr:#x}+{len:#x} is not inside one live allocation; pass an address returned by ALLOC and stay within its size")]
    BadPointer {
        /// Start of the range.
        addr: u64,
        /// Length of the range.
        len: u64,
    },
    /// A write (HtoD, DtoD destination, memset, a kernel's WRITE or READ_WRITE pointer)
    /// into a read-only mapping.
    #[error("device range {addr:#x}+{len:#x} lies in a read-only mapping of a shared object; write only through a read-write attachment (SHM_AT without the read-only flag) or into an allocation")]
    ReadOnly {
        /// Start of the range.
        addr: u64,
        /// Length of the range.
        len: u64,
    },
    /// A device pointer not aligned to the element it addresses.
    #[error(
        "device pointer {addr:#x} is not aligned to {align} bytes; align it to the element size"
    )]
    Misaligned {
        /// The pointer.
        addr: u64,
        /// The alignment needed.
        align: u64,
    },
    /// FREE of an address that is not the start of a live allocation (double free too).
    #[error("{addr:#x} is not the start of a live allocation (already freed?); free only addresses ALLOC returned, once")]
    NotAllocated {
        /// The address.
        addr: u64,
    },
    /// An argument out of range.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// No such module.
    #[error(
        "unknown module {0}; load it with MODULE_LOAD first (built-in module name: \"builtin\")"
    )]
    UnknownModule(String),
    /// No such function.
    #[error("unknown function {0}; look it up with GET_FUNCTION in a loaded module")]
    UnknownFunction(String),
    /// Wrong number of kernel arguments.
    #[error("kernel {kernel} takes {expected} arguments, the launch carries {got}")]
    BadArgCount {
        /// Kernel name.
        kernel: &'static str,
        /// Parameters the kernel has.
        expected: usize,
        /// Arguments received.
        got: usize,
    },
    /// A kernel argument of the wrong kind or access mode.
    #[error("kernel {kernel} argument {index} ({param}): {reason}")]
    BadArgType {
        /// Kernel name.
        kernel: &'static str,
        /// Argument index.
        index: usize,
        /// Parameter name.
        param: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// A per-vGPU table is full.
    #[error("too many {what} (limit {limit}); unload or destroy some first")]
    TooMany {
        /// What ran out.
        what: &'static str,
        /// The limit.
        limit: usize,
    },
    /// The device cannot do this.
    #[error("not supported: {0}")]
    NotSupported(String),
    /// A kernel faulted while running.
    #[error("kernel fault: {0}")]
    KernelFault(String),
    /// The host or device failed underneath.
    #[error("device error: {0}")]
    Device(String),
}

impl BackendError {
    /// The wire status for this error.
    pub fn status(&self) -> Status {
        match self {
            BackendError::ZeroSize | BackendError::InvalidArgument(_) => Status::InvalidArgument,
            BackendError::OutOfMemory { .. }
            | BackendError::HostOutOfMemory { .. }
            | BackendError::MemoryPressure { .. }
            | BackendError::ModuleLimit { .. }
            | BackendError::ContextReserve { .. }
            | BackendError::LocalMemory { .. }
            | BackendError::AddressSpaceFull { .. } => Status::OutOfMemory,
            BackendError::BadPointer { .. }
            | BackendError::ReadOnly { .. }
            | BackendError::Misaligned { .. }
            | BackendError::NotAllocated { .. } => Status::BadDevicePointer,
            BackendError::UnknownModule(_) => Status::UnknownModule,
            BackendError::UnknownFunction(_) => Status::UnknownFunction,
            BackendError::BadArgCount { .. } => Status::BadArgCount,
            BackendError::BadArgType { .. } => Status::BadArgType,
            BackendError::TooMany { .. } => Status::OutOfResources,
            BackendError::NotSupported(_) => Status::NotSupported,
            BackendError::KernelFault(_) => Status::KernelFault,
            BackendError::Device(_) => Status::DeviceError,
        }
    }

    /// A `Device` error from an OS error, with what was being done.
    pub(crate) fn os(what: &str, err: std::io::Error) -> Self {
        BackendError::Device(format!("{what}: {err}"))
    }
}

/// Result alias.
pub type Result<T> = std::result::Result<T, BackendError>;
