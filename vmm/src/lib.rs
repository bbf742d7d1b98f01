//! One process per VM: KVM, vCPUs, memfd guest RAM shareable with vhost-user backends, the
//! serial console, and virtio-mmio devices served by external vhost-user backends.
//!
//! The vmm never touches a vGPU request: the vGPU's `vgpu-worker` reads the guest's queues
//! from the shared guest RAM. See docs/payload-abi.md for what a payload guest sees and
//! docs/linux-guests.md for Linux guests.

pub mod api;
pub mod arch;
pub mod boot;
pub mod boot_info;
pub mod config;
pub mod cpuid_profile;
pub mod devices;
pub mod idle;
pub mod layout;
pub mod loader;
pub mod memory;
pub mod migration;
pub mod signals;
pub mod vcpu;
pub mod vcpu_control;
pub mod virtio;
pub mod vm;

pub use boot::linux::{LinuxConfig, DEFAULT_CMDLINE};
pub use config::{parse_size, Guest, VgpuSpec, VmConfig};
pub use cpuid_profile::CpuProfile;
pub use vm::{Boot, Vm, VmError, VmHandles, VGPU_DEVICE_ID};
