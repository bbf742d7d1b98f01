//! Response status codes.

use core::fmt;

/// The `status` word of a response. `Ok` is 0; everything else is an error and the
/// response's result words are zero unless the opcode's table says otherwise.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Status {
    /// Success.
    Ok = 0,
    /// The header's opcode is not one this protocol version knows.
    UnknownOpcode = 1,
    /// The descriptor chain has the wrong shape: too few or too many descriptors, a
    /// readable one where a writable one is needed (or the reverse), or a descriptor
    /// outside guest RAM.
    BadDescriptor = 2,
    /// A length is wrong: header shorter than its opcode's arguments, data descriptors
    /// that do not add up to the size in the arguments, response descriptor too short.
    BadLength = 3,
    /// A device pointer (plus the extent used) is not inside one live allocation of this
    /// vGPU, or is misaligned for the element type.
    BadDevicePointer = 4,
    /// The vGPU's memory share (or the physical GPU) has no room for the allocation.
    OutOfMemory = 5,
    /// The device does not implement this opcode or variant (see the feature bits).
    NotSupported = 6,
    /// An argument is out of range (zero size, bad flags, bad grid, bad memset width...).
    InvalidArgument = 7,
    /// `GET_FUNCTION`/`LAUNCH`: no such function (or function handle).
    UnknownFunction = 8,
    /// `LAUNCH`: the number of kernel arguments does not match the function's parameters.
    BadArgCount = 9,
    /// `LAUNCH`: an argument's kind (value type or pointer/access mode) does not match
    /// the function's parameter.
    BadArgType = 10,
    /// No such module handle, or no built-in module of that name.
    UnknownModule = 11,
    /// No such event (never recorded, or destroyed).
    UnknownEvent = 12,
    /// The event has not completed yet.
    NotReady = 13,
    /// A per-vGPU table (modules, events, ...) is full; free something first.
    OutOfResources = 14,
    /// A kernel faulted at run time (e.g. a gather index past its source), in this vGPU only.
    KernelFault = 15,
    /// The physical device failed; the request's effects are unknown.
    DeviceError = 16,
    /// The vGPU may not do this (e.g. attach shared memory outside its share group).
    PermissionDenied = 17,
}

impl Status {
    /// Every status, for tables and tests.
    pub const ALL: [Status; 18] = [
        Status::Ok,
        Status::UnknownOpcode,
        Status::BadDescriptor,
        Status::BadLength,
        Status::BadDevicePointer,
        Status::OutOfMemory,
        Status::NotSupported,
        Status::InvalidArgument,
        Status::UnknownFunction,
        Status::BadArgCount,
        Status::BadArgType,
        Status::UnknownModule,
        Status::UnknownEvent,
        Status::NotReady,
        Status::OutOfResources,
        Status::KernelFault,
        Status::DeviceError,
        Status::PermissionDenied,
    ];

    /// The status with this wire value, if any (a newer device may send codes an older
    /// guest does not know: treat those as errors).
    pub fn from_u32(v: u32) -> Option<Status> {
        Self::ALL.iter().copied().find(|s| *s as u32 == v)
    }

    /// True for `Ok`.
    pub fn is_ok(self) -> bool {
        self == Status::Ok
    }

    /// A short upper-case name for logs.
    pub fn name(self) -> &'static str {
        match self {
            Status::Ok => "OK",
            Status::UnknownOpcode => "UNKNOWN_OPCODE",
            Status::BadDescriptor => "BAD_DESCRIPTOR",
            Status::BadLength => "BAD_LENGTH",
            Status::BadDevicePointer => "BAD_DEVICE_POINTER",
            Status::OutOfMemory => "OUT_OF_MEMORY",
            Status::NotSupported => "NOT_SUPPORTED",
            Status::InvalidArgument => "INVALID_ARGUMENT",
            Status::UnknownFunction => "UNKNOWN_FUNCTION",
            Status::BadArgCount => "BAD_ARG_COUNT",
            Status::BadArgType => "BAD_ARG_TYPE",
            Status::UnknownModule => "UNKNOWN_MODULE",
            Status::UnknownEvent => "UNKNOWN_EVENT",
            Status::NotReady => "NOT_READY",
            Status::OutOfResources => "OUT_OF_RESOURCES",
            Status::KernelFault => "KERNEL_FAULT",
            Status::DeviceError => "DEVICE_ERROR",
            Status::PermissionDenied => "PERMISSION_DENIED",
        }
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
