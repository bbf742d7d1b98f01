//! What one vGPU is configured with, and its config space.

use vgpu_proto::{features, VgpuConfig, MAX_KERNEL_ARGS, PROTOCOL_VERSION, SHARE_SCALE};

use crate::error::ConfigError;

/// Most queues one vGPU may have (each gets its own worker thread).
pub const MAX_QUEUES: u16 = 64;
/// Default and largest virtqueue size offered to the guest.
pub const DEFAULT_QUEUE_SIZE: u16 = 1024;

/// One vGPU's configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceConfig {
    /// Host-wide vGPU id.
    pub vgpu_id: u32,
    /// Request queues (guest streams), 1..=`MAX_QUEUES`.
    pub num_queues: u16,
    /// Largest virtqueue size the guest may use (a power of two, <= 32768).
    pub queue_size: u16,
    /// Device memory the vGPU may allocate, in bytes.
    pub memory_share: u64,
    /// Compute share, per-mille.
    pub compute_share: u32,
    /// Copy share, per-mille.
    pub copy_share: u32,
}

impl DeviceConfig {
    /// Checks the ranges; the error says which value to fix.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.num_queues == 0 || self.num_queues > MAX_QUEUES {
            return Err(ConfigError::Queues(self.num_queues));
        }
        if !self.queue_size.is_power_of_two() {
            return Err(ConfigError::QueueSize(self.queue_size));
        }
        if self.memory_share == 0 {
            return Err(ConfigError::MemoryShare);
        }
        for (what, v) in [("compute", self.compute_share), ("copy", self.copy_share)] {
            if v > SHARE_SCALE {
                return Err(ConfigError::Share { what, value: v });
            }
        }
        Ok(())
    }

    /// The config space the guest reads, given the backend's capability bits and address
    /// space.
    pub fn config_space(&self, backend_features: u64, va_base: u64, va_size: u64) -> VgpuConfig {
        VgpuConfig {
            version: PROTOCOL_VERSION,
            vgpu_id: self.vgpu_id,
            num_queues: u32::from(self.num_queues),
            max_kernel_args: MAX_KERNEL_ARGS,
            features: backend_features | features::EVENTS,
            memory_share: self.memory_share,
            compute_share: self.compute_share,
            copy_share: self.copy_share,
            va_base,
            va_size,
        }
    }
}
