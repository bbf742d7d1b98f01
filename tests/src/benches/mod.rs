//! The benchmarks behind `vgpu-bench <name>`.

pub mod band;
pub mod device;
pub mod memory;
pub mod rebalance;
pub mod migration;
pub mod vmm;
