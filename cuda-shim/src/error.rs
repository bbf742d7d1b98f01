//! How guest-driver and device errors become CUDA results.

use guest_driver::Error;
use vgpu_proto::{Opcode, Status};

use crate::types::{res, CUresult};

/// The CUDA result for a failed vGPU request, as the real driver would answer the same
/// mistake.
pub fn map_error(e: &Error) -> CUresult {
    match *e {
        Error::Device { opcode, status } => map_status(opcode, status),
        Error::OutOfDmaMemory => res::OUT_OF_MEMORY,
        Error::AddressNotTranslatable | Error::BufferTooLarge | Error::RequestTooLarge => {
            res::INVALID_VALUE
        }
        Error::Timeout | Error::Broken if crate::watch::gone() => res::DEVICE_UNAVAILABLE,
        Error::Timeout => res::TIMEOUT,
        Error::Broken => res::DEVICE_UNAVAILABLE,
        _ => res::UNKNOWN,
    }
}

/// The CUDA result for a device status.
pub fn map_status(opcode: u32, status: Status) -> CUresult {
    let module_load = opcode == Opcode::ModuleLoad as u32;
    match status {
        Status::Ok => res::SUCCESS,
        // A device that cannot run PTX has no image it could run for this module.
        Status::NotSupported if module_load => res::NO_BINARY_FOR_GPU,
        Status::NotSupported => res::NOT_SUPPORTED,
        Status::InvalidArgument | Status::BadLength if module_load => res::INVALID_PTX,
        Status::OutOfMemory => res::OUT_OF_MEMORY,
        Status::BadDevicePointer
        | Status::InvalidArgument
        | Status::BadLength
        | Status::BadArgCount
        | Status::BadArgType => res::INVALID_VALUE,
        Status::UnknownFunction => res::NOT_FOUND,
        Status::UnknownModule | Status::UnknownEvent => res::INVALID_HANDLE,
        Status::NotReady => res::NOT_READY,
        Status::OutOfResources => res::LAUNCH_OUT_OF_RESOURCES,
        Status::KernelFault => res::LAUNCH_FAILED,
        Status::PermissionDenied => res::NOT_PERMITTED,
        _ => res::UNKNOWN,
    }
}
