//! The one error type of the driver. Display is written by hand so the core stays
//! dependency-free and no_std.

use core::fmt;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Error {
    /// MagicValue was not "virt": nothing virtio-mmio at this address.
    BadMagic(u32),
    /// Only modern (version 2) virtio-mmio is supported.
    UnsupportedVersion(u32),
    /// DeviceID 0: a placeholder slot with no device behind it.
    NoDevice,
    /// The device is not the kind the caller asked for.
    WrongDevice { expected: u32, found: u32 },
    /// The device does not offer features the driver cannot work without.
    MissingFeatures(u64),
    /// The device cleared FEATURES_OK: it cannot work with the accepted subset.
    FeaturesRejected,
    /// The device did not complete a reset or a register handshake in time.
    Timeout,
    /// The device set DEVICE_NEEDS_RESET.
    DeviceNeedsReset,
    /// The config generation kept changing while reading config space.
    ConfigUnstable,
    /// A config read past the end of what the caller may read.
    ConfigOutOfRange { offset: usize, len: usize },
    /// QueueNumMax is 0: the device has no such queue.
    QueueUnavailable(u16),
    /// QueueReady was already set before the driver configured the queue.
    QueueAlreadyActive(u16),
    /// A queue size of 0, above what the device allows, not a power of two, or above
    /// the driver's compile-time capacity.
    BadQueueSize(u16),
    /// The memory given for a queue is too small or misaligned.
    BadQueueMemory,
    /// The transport could not provide DMA memory.
    OutOfDmaMemory,
    /// The transport cannot give a device address for this buffer.
    AddressNotTranslatable,
    /// A chain with no buffers.
    EmptyChain,
    /// Device-readable buffers must come before device-writable ones in a chain.
    BadChainOrder,
    /// A buffer length that overflows the 32-bit descriptor length or the chain total.
    BufferTooLarge,
    /// Not enough free descriptors for the chain.
    QueueFull,
    /// The device's used index moved further than the chains it was given.
    BadUsedIndex { last_seen: u16, device: u16 },
    /// The device returned a used id that is not the head of an outstanding chain.
    BadUsedId(u32),
    /// The device claims to have written more than the chain's writable bytes; the chain
    /// is recycled, `token` says which.
    UsedLenTooLarge { token: u16, len: u32, writable: u32 },
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Error::BadMagic(m) => write!(f, "bad virtio-mmio magic {m:#010x}"),
            Error::UnsupportedVersion(v) => {
                write!(f, "virtio-mmio version {v} unsupported (need 2, modern)")
            }
            Error::NoDevice => write!(f, "no device behind this virtio-mmio slot"),
            Error::WrongDevice { expected, found } => {
                write!(f, "device id {found}, expected {expected}")
            }
            Error::MissingFeatures(bits) => {
                write!(f, "device lacks required features {bits:#x}")
            }
            Error::FeaturesRejected => write!(f, "device rejected the negotiated features"),
            Error::Timeout => write!(f, "device did not respond in time"),
            Error::DeviceNeedsReset => write!(f, "device needs reset"),
            Error::ConfigUnstable => write!(f, "config space kept changing while read"),
            Error::ConfigOutOfRange { offset, len } => {
                write!(f, "config read of {len} bytes at {offset:#x} out of range")
            }
            Error::QueueUnavailable(q) => write!(f, "queue {q} not offered by the device"),
            Error::QueueAlreadyActive(q) => write!(f, "queue {q} already active"),
            Error::BadQueueSize(n) => write!(f, "invalid queue size {n}"),
            Error::BadQueueMemory => write!(f, "queue memory too small or misaligned"),
            Error::OutOfDmaMemory => write!(f, "out of DMA memory"),
            Error::AddressNotTranslatable => {
                write!(f, "buffer address has no device-visible translation")
            }
            Error::EmptyChain => write!(f, "empty descriptor chain"),
            Error::BadChainOrder => {
                write!(f, "device-readable buffer after a device-writable one")
            }
            Error::BufferTooLarge => write!(f, "buffer too large for a descriptor"),
            Error::QueueFull => write!(f, "not enough free descriptors"),
            Error::BadUsedIndex { last_seen, device } => write!(
                f,
                "device used index {device} runs ahead of the chains given (last seen {last_seen})"
            ),
            Error::BadUsedId(id) => write!(f, "device returned unknown used id {id}"),
            Error::UsedLenTooLarge {
                token,
                len,
                writable,
            } => write!(
                f,
                "device used {len} bytes of chain {token} with only {writable} writable"
            ),
        }
    }
}

pub type Result<T> = core::result::Result<T, Error>;
