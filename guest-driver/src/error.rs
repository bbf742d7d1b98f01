//! The one error type of the driver. Display is written by hand so the core stays
//! dependency-free and no_std.

use core::fmt;

use vgpu_proto::{Opcode, Status};

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

    // The vGPU request layer (crate::vgpu).
    /// The device speaks a protocol major version this driver does not.
    IncompatibleDevice { version: u32 },
    /// A queue index at or above the device's `num_queues`.
    NoSuchQueue(u16),
    /// The device answered a request with an error status.
    Device { opcode: u32, status: Status },
    /// The device answered with a status code this protocol version does not know.
    UnknownStatus { opcode: u32, code: u32 },
    /// The device returned the chain without writing a response (used length below 48):
    /// by the protocol, a malformed request of the guest's own.
    NoResponse { opcode: u32, used_len: u32 },
    /// The response carries another request's id.
    ResponseMismatch { expected: u64, found: u64 },
    /// The request does not fit its slot (too many kernel arguments or dependencies).
    RequestTooLarge,
    /// More data buffers than one request may carry.
    TooManyBuffers,
    /// A ticket that is not outstanding on this stream (already waited for, or foreign).
    UnknownTicket,
    /// The stream gave up on an unresponsive device and reset it; it cannot be used again.
    Broken,
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
            Error::IncompatibleDevice { version } => write!(
                f,
                "device speaks vGPU protocol {}.{}, this driver {}.{}",
                version >> 16,
                version & 0xffff,
                vgpu_proto::VERSION_MAJOR,
                vgpu_proto::VERSION_MINOR
            ),
            Error::NoSuchQueue(q) => write!(f, "the device has no queue {q}"),
            Error::Device { opcode, status } => {
                write!(f, "{}: {status}", OpName(opcode))
            }
            Error::UnknownStatus { opcode, code } => {
                write!(f, "{}: unknown status {code}", OpName(opcode))
            }
            Error::NoResponse { opcode, used_len } => write!(
                f,
                "{}: device returned the chain without a response (used length {used_len})",
                OpName(opcode)
            ),
            Error::ResponseMismatch { expected, found } => {
                write!(f, "response for request {found}, expected {expected}")
            }
            Error::RequestTooLarge => write!(f, "request does not fit its slot"),
            Error::TooManyBuffers => write!(f, "too many data buffers for one request"),
            Error::UnknownTicket => write!(f, "ticket is not outstanding on this stream"),
            Error::Broken => write!(f, "stream unusable: the device was reset after a timeout"),
        }
    }
}

/// An opcode by name when it is known.
struct OpName(u32);

impl fmt::Display for OpName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match Opcode::from_u32(self.0) {
            Some(op) => f.write_str(op.name()),
            None => write!(f, "opcode {:#x}", self.0),
        }
    }
}

pub type Result<T> = core::result::Result<T, Error>;
