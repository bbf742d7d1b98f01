//! The vGPU device as a guest sees it, served as a vhost-user backend inside `vgpu-worker`:
//! descriptor chains to backend calls.
//!
//! - [`Vgpu`] checks each descriptor chain (every descriptor against the guest memory
//!   table, directions, lengths), parses the header with `vgpu-proto`, calls the
//!   [`vgpu_backend::Backend`] and writes the response. Copies go straight between the
//!   guest's buffers and device memory.
//! - [`VgpuVhostBackend`] serves a `Vgpu` over vhost-user: N queues, one thread each,
//!   in-order completion per queue, EVENT_IDX, config space via GET_CONFIG. It maps only
//!   guest memory in memfds sealed against shrinking ([`check_memory_table`]).

mod chain;
mod config;
mod device;
mod error;
mod events;
pub mod front;
mod host_map;
mod kernel_times;
mod launch;
mod lines;
mod memtable;
mod occupancy;
mod request;
mod shm;
mod slots;
mod stats;
mod storage;
mod tensor_map;
pub mod timeline;
mod vhost;
mod vmm;

#[cfg(test)]
mod batch_tests;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod vhost_tests;

pub use chain::{Chain, GuestMem};
pub use config::{
    BatchLimits, DeviceConfig, DEFAULT_BATCH_NS, DEFAULT_MAX_BATCH, DEFAULT_QUEUE_SIZE, MAX_BATCH,
    MAX_QUEUES,
};
pub use device::Vgpu;
pub use error::{ConfigError, RequestError};
pub use events::MAX_EVENTS;
pub use memtable::{check_memory_table, MemTableError};
pub use shm::{ShmError, ShmHost};
pub use slots::{HwSlots, SlotPolicy};
pub use stats::StatsSnapshot;
pub use storage::{StorageError, StorageHost};
pub use vhost::{Memory, VgpuVhostBackend, Vring};
