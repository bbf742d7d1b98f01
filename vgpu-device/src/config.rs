//! What one vGPU is configured with, and its config space.

use vgpu_proto::{features, VgpuConfig, MAX_KERNEL_ARGS, PROTOCOL_VERSION, SHARE_SCALE};

use crate::error::ConfigError;

/// Most queues one vGPU may have (each gets its own worker thread).
pub const MAX_QUEUES: u16 = 64;
/// Default and largest virtqueue size offered to the guest.
pub const DEFAULT_QUEUE_SIZE: u16 = 1024;

/// Launches one batch holds at most by default.
pub const DEFAULT_MAX_BATCH: u16 = 64;
/// Most expected kernel time one batch holds by default (2 ms).
pub const DEFAULT_BATCH_NS: u64 = 2_000_000;
/// Largest [`BatchLimits::max_launches`].
pub const MAX_BATCH: u16 = 1024;

/// How many launches a queue hands the GPU at once (docs/architecture.md, "Batched
/// launches"). A batch is one grant of the GPU's scheduler: its kernels run back to back
/// without the scheduler in between, so BAND cannot hand the GPU to another vGPU inside it.
/// The limits bound that window: at most `max_launches` kernels, and at most
/// `max_expected_ns` of their usual run times together (a kernel not timed yet counts as
/// the whole window, so it runs alone or first).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchLimits {
    /// Most launches in one batch, 1..=[`MAX_BATCH`] (1: every launch alone).
    pub max_launches: u16,
    /// Most expected kernel time in one batch, ns.
    pub max_expected_ns: u64,
}

impl Default for BatchLimits {
    fn default() -> Self {
        Self {
            max_launches: DEFAULT_MAX_BATCH,
            max_expected_ns: DEFAULT_BATCH_NS,
        }
    }
}

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
    /// How launches posted together are batched.
    pub batch: BatchLimits,
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
        if self.batch.max_launches == 0 || self.batch.max_launches > MAX_BATCH {
            return Err(ConfigError::Batch(self.batch.max_launches));
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
