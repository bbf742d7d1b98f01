//! Devices on the vmm's port and MMIO buses.

pub mod bus;
pub mod legacy;
pub mod serial;
pub mod vhost_user;
