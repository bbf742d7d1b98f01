//! `GET_INFO`'s answer.

use crate::wire::wire_struct;

/// `DeviceInfo::backend` values.
pub mod backend_kind {
    /// Simulated GPU (CPU threads, host memory).
    pub const SIM: u32 = 0;
    /// NVIDIA GPU through CUDA.
    pub const CUDA: u32 = 1;
}

wire_struct! {
    /// Written by `GET_INFO` into its one writable data descriptor.
    pub struct DeviceInfo, size 128 {
        /// Protocol version ([`crate::PROTOCOL_VERSION`]).
        pub version: u32,
        /// The vGPU's id.
        pub vgpu_id: u32,
        /// Request queues.
        pub num_queues: u32,
        /// A [`backend_kind`] value.
        pub backend: u32,
        /// Capability bits ([`crate::features`]).
        pub features: u64,
        /// Bytes this vGPU may allocate.
        pub memory_share: u64,
        /// Bytes this vGPU has allocated now.
        pub memory_used: u64,
        /// First device address of the vGPU's address space.
        pub va_base: u64,
        /// Size of the address space.
        pub va_size: u64,
        /// Compute share, per-mille.
        pub compute_share: u32,
        /// Copy share, per-mille.
        pub copy_share: u32,
        /// Host-device copy bandwidth of the physical GPU in bytes/s (0 = not paced).
        pub copy_bandwidth: u64,
        /// Allocation sizes are charged rounded up to this many bytes.
        pub alloc_granularity: u64,
        /// Compute units (sim: CPU threads running kernels; cuda: SMs).
        pub compute_units: u32,
        /// Largest number of kernel arguments per launch.
        pub max_kernel_args: u32,
        /// Physical GPU memory in bytes.
        pub device_memory: u64,
        /// NUL-padded UTF-8 device name.
        pub name: [u8; 32],
    }
}

impl DeviceInfo {
    /// The name without its NUL padding (empty if not UTF-8).
    pub fn name_str(&self) -> &str {
        let end = self
            .name
            .iter()
            .position(|b| *b == 0)
            .unwrap_or(self.name.len());
        self.name
            .get(..end)
            .and_then(|n| core::str::from_utf8(n).ok())
            .unwrap_or("")
    }

    /// `name` padded with NULs (truncated to 32 bytes at a char boundary).
    pub fn pad_name(name: &str) -> [u8; 32] {
        let mut out = [0u8; 32];
        let mut end = name.len().min(32);
        while !name.is_char_boundary(end) {
            end -= 1;
        }
        if let (Some(dst), Some(src)) = (out.get_mut(..end), name.as_bytes().get(..end)) {
            dst.copy_from_slice(src);
        }
        out
    }
}
