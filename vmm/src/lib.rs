//! One process per VM: KVM, vCPUs, memfd guest RAM shareable with vhost-user backends, the
//! serial console, and virtio-mmio devices served by external vhost-user backends.
//!
//! The vmm never touches a vGPU request: the vGPU's `vgpu-worker` reads the guest's queues
//! from the shared guest RAM. See docs/payload-abi.md for what a payload guest sees.

pub mod arch;
pub mod boot_info;
pub mod config;
pub mod devices;
pub mod layout;
pub mod loader;
pub mod memory;
pub mod signals;
pub mod vcpu;
pub mod virtio;
pub mod vm;

pub use config::{parse_size, VgpuSpec, VmConfig};
pub use vm::{Vm, VmError, VGPU_DEVICE_ID};
