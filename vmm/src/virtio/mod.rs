//! Device-independent virtio pieces: the device trait, the guest's queue configuration and
//! the interrupt, and the virtio-mmio (version 2) transport.

pub mod mmio;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, OnceLock};

use vm_memory::GuestMemoryMmap;
use vmm_sys_util::eventfd::EventFd;

use crate::idle::IdleWake;
use crate::migration::snapshot::VringSnapshot;

/// Feature bit the transport requires of every modern driver.
pub const VIRTIO_F_VERSION_1: u64 = 1 << virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;

/// Device status bits (virtio 1.x, 2.1).
pub mod status {
    pub const ACKNOWLEDGE: u32 = 1;
    pub const DRIVER: u32 = 2;
    pub const DRIVER_OK: u32 = 4;
    pub const FEATURES_OK: u32 = 8;
    pub const DEVICE_NEEDS_RESET: u32 = 0x40;
    pub const FAILED: u32 = 0x80;
}

/// One virtqueue as the driver configured it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QueueConfig {
    pub index: u16,
    pub size: u16,
    pub desc: u64,
    pub driver: u64,
    pub device: u64,
}

/// The device's interrupt: the status bits the driver reads, and the irqfd that raises it.
pub struct Interrupt {
    status: AtomicU32,
    irq: EventFd,
    /// Wakes the VM's idling vCPUs on every interrupt (set once the VM's devices exist).
    wake: OnceLock<Arc<IdleWake>>,
}

pub const INT_USED_RING: u32 = 1;
pub const INT_CONFIG: u32 = 2;

impl Interrupt {
    pub fn new(irq: EventFd) -> Self {
        Self {
            status: AtomicU32::new(0),
            irq,
            wake: OnceLock::new(),
        }
    }

    /// From now on every interrupt also wakes the VM's idling vCPUs (docs/payload-abi.md,
    /// the idle port).
    pub fn wake_idle_vcpus(&self, wake: Arc<IdleWake>) {
        let _ = self.wake.set(wake);
    }

    /// The irqfd (registered with KVM for this device's GSI).
    pub fn irqfd(&self) -> &EventFd {
        &self.irq
    }

    /// Signals that a used ring advanced.
    pub fn signal_used(&self) {
        self.raise(INT_USED_RING);
    }

    /// Signals a configuration (or device status) change.
    pub fn signal_config(&self) {
        self.raise(INT_CONFIG);
    }

    /// Sets the configuration-change bit of the interrupt status without raising the
    /// interrupt yet: a driver that polls the device status sees the bit with the change
    /// it reports (the caller raises the interrupt with [`Self::signal_config`] after it).
    pub fn mark_config(&self) {
        self.status.fetch_or(INT_CONFIG, Ordering::SeqCst);
    }

    fn raise(&self, bit: u32) {
        self.status.fetch_or(bit, Ordering::SeqCst);
        if let Err(e) = self.irq.write(1) {
            tracing::warn!("cannot raise a virtio interrupt: {e}");
        }
        if let Some(w) = self.wake.get() {
            w.notify();
        }
    }

    pub fn status(&self) -> u32 {
        self.status.load(Ordering::SeqCst)
    }

    pub fn ack(&self, bits: u32) {
        self.status.fetch_and(!bits, Ordering::SeqCst);
    }

    /// Sets the status bits as a migrated VM had them, without raising the interrupt
    /// again (the interrupt controller's state travels separately).
    pub fn restore_status(&self, bits: u32) {
        self.status
            .store(bits & (INT_USED_RING | INT_CONFIG), Ordering::SeqCst);
    }
}

/// Why a device could not start with the driver's configuration.
#[derive(Debug, thiserror::Error)]
pub enum ActivateError {
    /// A queue's rings do not lie in guest memory.
    #[error("queue {0}'s rings lie outside guest memory")]
    BadQueue(u16),
    /// The backend refused or is gone.
    #[error("the device backend failed to start: {0}")]
    Backend(String),
}

/// A virtio device behind a transport. Small on purpose: a capability a device lacks is a
/// default method, visible in its type.
pub trait VirtioDevice: Send {
    /// The virtio device ID.
    fn device_type(&self) -> u32;
    /// Maximum size of each queue; its length is the queue count.
    fn queue_max_sizes(&self) -> &[u16];
    /// Features the device offers.
    fn features(&self) -> u64;
    /// Reads device config space at `offset`.
    fn read_config(&self, offset: u64, data: &mut [u8]);
    /// Writes device config space at `offset`.
    fn write_config(&mut self, offset: u64, data: &[u8]);
    /// Starts the device with the features the driver accepted and its ready queues.
    fn activate(
        &mut self,
        mem: &GuestMemoryMmap,
        acked_features: u64,
        queues: &[QueueConfig],
    ) -> Result<(), ActivateError>;
    /// Stops the device after a driver reset; it may be activated again.
    fn reset(&mut self);
    /// True once the device cannot go on (its backend disappeared): the transport reports
    /// DEVICE_NEEDS_RESET.
    fn needs_reset(&self) -> bool {
        false
    }
    /// Bumped whenever config space changes under the driver.
    fn config_generation(&self) -> u32 {
        0
    }
    /// Stops the active queues for a migration and returns where each stood. A device whose
    /// queues live in the vmm has nothing to stop.
    fn pause_rings(&mut self) -> Result<Vec<VringSnapshot>, ActivateError> {
        Ok(Vec::new())
    }
    /// True when the backend signalled a used ring that the vmm has not relayed yet
    /// (consumes the signals).
    fn take_pending_calls(&self) -> bool {
        false
    }
    /// Notifies every active queue once, so a restarted backend looks at the rings again
    /// (a guest kick that arrived while the rings were stopped is not lost).
    fn kick_all(&self) {}
    /// Starts the device again with its queues at `bases` (after a migration, or after a
    /// failed one on the source).
    fn resume_rings(
        &mut self,
        mem: &GuestMemoryMmap,
        acked_features: u64,
        queues: &[QueueConfig],
        _bases: &[VringSnapshot],
    ) -> Result<(), ActivateError> {
        self.activate(mem, acked_features, queues)
    }
}
