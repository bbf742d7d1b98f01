//! One process per VM: KVM, vCPUs, memfd guest RAM, serial, virtio-mmio and the vhost-user frontend.
