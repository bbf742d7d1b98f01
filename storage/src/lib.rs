//! GPU-initiated NVMe access after BaM (Qureshi et al., ASPLOS 2023): NVMe queue pairs in
//! caller-provided ("GPU-visible") memory that thousands of threads submit to at once
//! (ticket/turn enqueue, one doorbell per batch), a software cache with clock replacement,
//! reference counts and warp coalescing, a `StorageArray<T>` for kernels, and two
//! controllers: an emulated NVMe controller over a file (io_uring) and a real one through
//! VFIO. See `docs/storage.md`.

pub mod array;
pub mod bar;
pub mod cache;
pub mod controller;
pub mod error;
pub mod kernels;
pub mod memory;
pub mod namespace;
pub mod nvme;
pub mod queue;
pub use vgpu_sync as sync;

pub use array::{Element, StorageArray};
pub use cache::{CacheStats, PageCache};
pub use error::{Error, Result};
pub use memory::{DmaRegion, DmaSlice};
pub use namespace::{DeviceQueue, Namespace, NamespaceOptions};
pub use queue::QueuePair;
