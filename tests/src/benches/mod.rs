//! The benchmarks behind `vgpu-bench <name>`.

pub mod band;
pub mod device;
pub mod host_migration;
pub mod memory;
pub mod migration;
pub mod rebalance;
mod shared;
pub mod sharing;
pub mod start;
pub mod timeline;
pub mod vmm;
