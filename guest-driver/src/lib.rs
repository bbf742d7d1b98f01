//! The crate a guest installs: no_std virtio-mmio modern driver, split virtqueues and the vGPU request API; a std Linux transport behind a feature.
