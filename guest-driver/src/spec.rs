//! Constants from the virtio 1.x specification (virtio-mmio transport, split virtqueues).

/// virtio-mmio register offsets (virtio 1.x, 4.2.2).
pub mod reg {
    pub const MAGIC: usize = 0x000;
    pub const VERSION: usize = 0x004;
    pub const DEVICE_ID: usize = 0x008;
    pub const VENDOR_ID: usize = 0x00c;
    pub const DEVICE_FEATURES: usize = 0x010;
    pub const DEVICE_FEATURES_SEL: usize = 0x014;
    pub const DRIVER_FEATURES: usize = 0x020;
    pub const DRIVER_FEATURES_SEL: usize = 0x024;
    pub const QUEUE_SEL: usize = 0x030;
    pub const QUEUE_NUM_MAX: usize = 0x034;
    pub const QUEUE_NUM: usize = 0x038;
    pub const QUEUE_READY: usize = 0x044;
    pub const QUEUE_NOTIFY: usize = 0x050;
    pub const INTERRUPT_STATUS: usize = 0x060;
    pub const INTERRUPT_ACK: usize = 0x064;
    pub const STATUS: usize = 0x070;
    pub const QUEUE_DESC_LOW: usize = 0x080;
    pub const QUEUE_DESC_HIGH: usize = 0x084;
    pub const QUEUE_DRIVER_LOW: usize = 0x090;
    pub const QUEUE_DRIVER_HIGH: usize = 0x094;
    pub const QUEUE_DEVICE_LOW: usize = 0x0a0;
    pub const QUEUE_DEVICE_HIGH: usize = 0x0a4;
    pub const CONFIG_GENERATION: usize = 0x0fc;
    pub const CONFIG: usize = 0x100;
}

/// "virt" in little endian.
pub const MMIO_MAGIC: u32 = 0x7472_6976;
pub const MMIO_VERSION_MODERN: u32 = 2;
/// The register window is one page; config space is the rest of it.
pub const MMIO_WINDOW: usize = 0x1000;

/// Device status bits (virtio 1.x, 2.1).
pub mod status {
    pub const ACKNOWLEDGE: u32 = 0x01;
    pub const DRIVER: u32 = 0x02;
    pub const DRIVER_OK: u32 = 0x04;
    pub const FEATURES_OK: u32 = 0x08;
    pub const DEVICE_NEEDS_RESET: u32 = 0x40;
    pub const FAILED: u32 = 0x80;
}

/// Transport feature bits (virtio 1.x, 6).
pub mod feature {
    pub const RING_INDIRECT_DESC: u64 = 1 << 28;
    pub const RING_EVENT_IDX: u64 = 1 << 29;
    pub const VERSION_1: u64 = 1 << 32;
    pub const ACCESS_PLATFORM: u64 = 1 << 33;
    pub const RING_PACKED: u64 = 1 << 34;
}

/// InterruptStatus bits.
pub mod interrupt {
    pub const USED_BUFFER: u32 = 0x1;
    pub const CONFIG_CHANGE: u32 = 0x2;
}

/// Split virtqueue descriptor and ring flags (virtio 1.x, 2.7).
pub mod ring {
    pub const DESC_F_NEXT: u16 = 1;
    pub const DESC_F_WRITE: u16 = 2;
    pub const AVAIL_F_NO_INTERRUPT: u16 = 1;
    pub const USED_F_NO_NOTIFY: u16 = 1;
    /// Largest split queue the spec allows.
    pub const MAX_QUEUE_SIZE: u16 = 32768;
}
