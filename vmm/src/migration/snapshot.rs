//! The VM's state apart from guest RAM, as it travels between hosts: versioned, and
//! serialized with serde (JSON on the wire, docs/migration.md). KVM's own structs travel
//! as byte blobs of their UAPI layout (`pod.rs`); everything the vmm owns has named fields.

use serde::{Deserialize, Serialize};

/// The snapshot format this vmm writes and reads. A destination refuses any other.
pub const SNAPSHOT_VERSION: u32 = 1;

/// What the destination needs before any RAM arrives: enough to build an empty VM of the
/// same shape.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VmDescription {
    pub snapshot_version: u32,
    /// Guest RAM in bytes (the regions follow `layout::ram_regions`).
    pub memory: u64,
    pub vcpus: u8,
    /// How many virtio-mmio vGPU devices, in slot order.
    pub vgpus: usize,
    /// A Linux guest (software-interrupt assist, PIT), not a payload.
    pub linux: bool,
    /// The CPU profile's name (`host` or `restricted`).
    pub cpu_profile: String,
    /// The one-time token a destination started with `--migrate-token-file` demands.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
}

/// One vCPU. Blobs are the kernel's structs of the same name (x86-64 layout).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VcpuState {
    /// `struct kvm_mp_state`.
    pub mp_state: Vec<u8>,
    /// `struct kvm_regs`.
    pub regs: Vec<u8>,
    /// `struct kvm_sregs`.
    pub sregs: Vec<u8>,
    /// `struct kvm_fpu`.
    pub fpu: Vec<u8>,
    /// `struct kvm_xsave` (4 KiB legacy area), absent where KVM has no XSAVE support.
    pub xsave: Option<Vec<u8>>,
    /// `struct kvm_xcrs`, absent where KVM has no XCR support.
    pub xcrs: Option<Vec<u8>>,
    /// `struct kvm_lapic_state`.
    pub lapic: Vec<u8>,
    /// `struct kvm_vcpu_events`.
    pub events: Vec<u8>,
    /// Every MSR of KVM's index list that it let us read: (index, value).
    pub msrs: Vec<(u32, u64)>,
    /// The vCPU had parked itself (port 0xF5): it stays parked on the destination.
    pub parked: bool,
}

/// VM-wide KVM state.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KvmVmState {
    /// `struct kvm_clock_data`.
    pub clock: Option<Vec<u8>>,
    /// `struct kvm_irqchip` for the master PIC, the slave PIC and the IOAPIC.
    pub irqchips: Vec<Vec<u8>>,
    /// `struct kvm_pit_state2`, for VMs with the in-kernel PIT.
    pub pit: Option<Vec<u8>>,
}

/// COM1's registers (vm-superio's `SerialState`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SerialSnapshot {
    pub baud_divisor_low: u8,
    pub baud_divisor_high: u8,
    pub interrupt_enable: u8,
    pub interrupt_identification: u8,
    pub line_control: u8,
    pub line_status: u8,
    pub modem_control: u8,
    pub modem_status: u8,
    pub scratch: u8,
    pub in_buffer: Vec<u8>,
}

/// One virtqueue's transport registers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueSnapshot {
    pub max: u16,
    pub size: u16,
    pub ready: bool,
    pub desc: u64,
    pub driver: u64,
    pub device: u64,
}

/// A virtio-mmio transport: feature negotiation, queue configuration, status and
/// interrupt status.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TransportSnapshot {
    pub status: u32,
    pub device_features_sel: u32,
    pub driver_features_sel: u32,
    pub driver_features: u64,
    pub queue_sel: u32,
    pub queues: Vec<QueueSnapshot>,
    /// The device was activated (DRIVER_OK accepted): its backend must be started.
    pub active: bool,
    pub interrupt_status: u32,
}

/// A vhost-user ring's position: `GET_VRING_BASE` on the source after the ring stopped,
/// `SET_VRING_BASE` on the destination.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VringSnapshot {
    pub index: u16,
    pub base: u32,
}

/// One vGPU device: its transport and its rings.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceSnapshot {
    pub transport: TransportSnapshot,
    pub vrings: Vec<VringSnapshot>,
}

/// Everything but guest RAM, taken while the VM is paused.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VmSnapshot {
    pub version: u32,
    pub vcpus: Vec<VcpuState>,
    pub kvm: KvmVmState,
    pub serial: SerialSnapshot,
    pub devices: Vec<DeviceSnapshot>,
}

impl From<vm_superio::serial::SerialState> for SerialSnapshot {
    fn from(s: vm_superio::serial::SerialState) -> Self {
        Self {
            baud_divisor_low: s.baud_divisor_low,
            baud_divisor_high: s.baud_divisor_high,
            interrupt_enable: s.interrupt_enable,
            interrupt_identification: s.interrupt_identification,
            line_control: s.line_control,
            line_status: s.line_status,
            modem_control: s.modem_control,
            modem_status: s.modem_status,
            scratch: s.scratch,
            in_buffer: s.in_buffer,
        }
    }
}

impl From<&SerialSnapshot> for vm_superio::serial::SerialState {
    fn from(s: &SerialSnapshot) -> Self {
        Self {
            baud_divisor_low: s.baud_divisor_low,
            baud_divisor_high: s.baud_divisor_high,
            interrupt_enable: s.interrupt_enable,
            interrupt_identification: s.interrupt_identification,
            line_control: s.line_control,
            line_status: s.line_status,
            modem_control: s.modem_control,
            modem_status: s.modem_status,
            scratch: s.scratch,
            in_buffer: s.in_buffer.clone(),
        }
    }
}
