//! `GET_ATTRIBUTES`' answer: the physical GPU's attributes, as CUDA programs query them
//! with `cuDeviceGetAttribute`. Since 1.1 (`features::ATTRIBUTES`). And
//! `GET_FUNCTION_LAYOUT`'s: where each kernel parameter lies in the parameter buffer.

use crate::launch::{MAX_SHARED_BYTES, MAX_THREADS_PER_BLOCK};
use crate::wire::wire_struct;

wire_struct! {
    /// Written by `GET_ATTRIBUTES` into its one writable data descriptor. A cuda device
    /// reads them from the physical GPU (`cuDeviceGetAttribute`); the sim device answers
    /// [`DeviceAttributes::SIM`] with its compute units as the SM count.
    pub struct DeviceAttributes, size 128 {
        /// Compute capability, major.
        pub cc_major: u32,
        /// Compute capability, minor.
        pub cc_minor: u32,
        /// Streaming multiprocessors.
        pub sm_count: u32,
        /// Peak SM clock in kHz.
        pub clock_khz: u32,
        /// Peak memory clock in kHz.
        pub memory_clock_khz: u32,
        /// Global memory bus width in bits.
        pub memory_bus_width: u32,
        /// L2 cache in bytes.
        pub l2_cache_bytes: u32,
        /// Threads per block.
        pub max_threads_per_block: u32,
        /// Block dimensions (x, y, z).
        pub max_block_dim: [u32; 3],
        /// Grid dimensions (x, y, z).
        pub max_grid_dim: [u32; 3],
        /// Shared memory per block without opting in, bytes.
        pub max_shared_per_block: u32,
        /// Shared memory per block when a kernel opts in, bytes.
        pub max_shared_per_block_optin: u32,
        /// Shared memory per SM, bytes.
        pub max_shared_per_sm: u32,
        /// 32-bit registers per block.
        pub max_registers_per_block: u32,
        /// 32-bit registers per SM.
        pub max_registers_per_sm: u32,
        /// Threads per warp.
        pub warp_size: u32,
        /// Resident threads per SM.
        pub max_threads_per_sm: u32,
        /// Resident blocks per SM.
        pub max_blocks_per_sm: u32,
        /// Constant memory, bytes.
        pub total_const_memory: u32,
        /// Copy engines that run beside kernels.
        pub async_engine_count: u32,
        /// 1 if kernels of one context may run concurrently.
        pub concurrent_kernels: u32,
        /// 1 if ECC is on.
        pub ecc_enabled: u32,
        /// PCI domain of the physical GPU (0 on sim).
        pub pci_domain_id: u32,
        /// PCI bus.
        pub pci_bus_id: u32,
        /// PCI device.
        pub pci_device_id: u32,
        /// The context's per-thread stack limit in bytes, as the worker set it and charged
        /// it (`CU_LIMIT_STACK_SIZE`); 0 = no such limit (sim) or not reported. Since 1.3.
        pub stack_bytes: u32,
        /// The context's device `malloc` heap in KiB (`CU_LIMIT_MALLOC_HEAP_SIZE`); 0 = none.
        pub heap_kib: u32,
        /// The context's printf FIFO in KiB (`CU_LIMIT_PRINTF_FIFO_SIZE`); 0 = none.
        pub printf_fifo_kib: u32,
    }
}

impl DeviceAttributes {
    /// What the sim device reports (a Hopper-like GPU; `sm_count` is set to its compute
    /// units). Documented in docs/protocol.md.
    pub const SIM: DeviceAttributes = DeviceAttributes {
        cc_major: 9,
        cc_minor: 0,
        sm_count: 1,
        clock_khz: 1_000_000,
        memory_clock_khz: 1_000_000,
        memory_bus_width: 5120,
        l2_cache_bytes: 50 << 20,
        max_threads_per_block: MAX_THREADS_PER_BLOCK as u32,
        max_block_dim: [1024, 1024, 64],
        max_grid_dim: [i32::MAX as u32, 65535, 65535],
        max_shared_per_block: 48 << 10,
        max_shared_per_block_optin: MAX_SHARED_BYTES,
        max_shared_per_sm: 228 << 10,
        max_registers_per_block: 65536,
        max_registers_per_sm: 65536,
        warp_size: 32,
        max_threads_per_sm: 2048,
        max_blocks_per_sm: 32,
        total_const_memory: 64 << 10,
        async_engine_count: 2,
        concurrent_kernels: 1,
        ecc_enabled: 0,
        pci_domain_id: 0,
        pci_bus_id: 0,
        pci_device_id: 0,
        stack_bytes: 0,
        heap_kib: 0,
        printf_fifo_kib: 0,
    };
}

wire_struct! {
    /// Written by `GET_FUNCTION_LAYOUT` after the [`ParamLayout`] when its writable
    /// descriptor has room for both (`ParamLayout::SIZE + FunctionAttributes::SIZE`) and
    /// the device reports them (result[3] = the bytes written, 32; 0 when not written).
    /// A function's resources as `cuFuncGetAttribute` answers them on the physical GPU;
    /// on sim, whose kernels run on CPU threads, all zero but `max_threads_per_block`.
    /// Since 1.3 (`features::FUNCTION_ATTRIBUTES`).
    pub struct FunctionAttributes, size 32 {
        /// Registers per thread (`CU_FUNC_ATTRIBUTE_NUM_REGS`).
        pub num_regs: u32,
        /// Statically allocated shared memory per block in bytes.
        pub static_shared_bytes: u32,
        /// Constant memory in bytes.
        pub const_bytes: u32,
        /// Local memory per thread in bytes.
        pub local_bytes: u32,
        /// The most threads per block a launch may have.
        pub max_threads_per_block: u32,
        /// Reserved, 0.
        pub reserved: [u32; 3],
    }
}

/// Written by `GET_FUNCTION_LAYOUT` into its writable data descriptor (256 bytes): 32
/// little-endian u32 byte offsets, then 32 u32 sizes. Parameter *i* lies at byte
/// `offset(i)` of the kernel's parameter buffer and is `size(i)` bytes, for *i* below the
/// count in result[1]; the rest is 0. Since 1.1 (`features::PARAM_LAYOUT`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct ParamLayout {
    offsets: [u32; 32],
    sizes: [u32; 32],
}

impl ParamLayout {
    /// Encoded size in bytes.
    pub const SIZE: usize = 256;

    /// Parameter `i`'s (offset, size), if `i` < 32.
    pub fn get(&self, i: usize) -> Option<(u32, u32)> {
        Some((*self.offsets.get(i)?, *self.sizes.get(i)?))
    }

    /// Sets parameter `i` (ignored past 32).
    pub fn set(&mut self, i: usize, offset: u32, size: u32) {
        if let (Some(o), Some(s)) = (self.offsets.get_mut(i), self.sizes.get_mut(i)) {
            *o = offset;
            *s = size;
        }
    }

    /// The wire bytes.
    pub fn to_bytes(&self) -> [u8; Self::SIZE] {
        let mut out = [0u8; Self::SIZE];
        let words = self.offsets.iter().chain(self.sizes.iter());
        for (chunk, w) in out.chunks_exact_mut(4).zip(words) {
            chunk.copy_from_slice(&w.to_le_bytes());
        }
        out
    }

    /// Reads a layout from the first `SIZE` bytes of `buf`.
    pub fn decode(buf: &[u8]) -> Result<Self, crate::WireError> {
        let bytes = buf.get(..Self::SIZE).ok_or(crate::WireError::Short {
            needed: Self::SIZE,
            available: buf.len(),
        })?;
        let mut out = Self::default();
        let words = out.offsets.iter_mut().chain(out.sizes.iter_mut());
        for (w, chunk) in words.zip(bytes.chunks_exact(4)) {
            let mut b = [0u8; 4];
            b.copy_from_slice(chunk);
            *w = u32::from_le_bytes(b);
        }
        Ok(out)
    }
}
