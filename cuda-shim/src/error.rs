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

#[cfg(test)]
mod tests {
    use crate::types::{error_text, res};

    /// Every result the library returns, and every one include/cuda.h declares, has the
    /// name cuda.h gives it in cuGetErrorName's table, and a description.
    #[test]
    fn every_result_has_its_cuda_h_name_and_a_description() {
        let header = include_str!("../include/cuda.h");
        let mut declared = 0;
        for line in header.lines() {
            let Some((name, value)) = line.trim().trim_end_matches(',').split_once(" = ") else {
                continue;
            };
            if !(name == "CUDA_SUCCESS" || name.starts_with("CUDA_ERROR_")) {
                continue;
            }
            let code: u32 = value.trim().parse().expect("a number");
            let (n, d) = error_text(code).unwrap_or_else(|| panic!("{name} ({code}) has no name"));
            assert_eq!(n.to_str().ok(), Some(name), "code {code}");
            assert!(!d.is_empty(), "{name} has no description");
            declared += 1;
        }
        assert!(declared >= 20, "cuda.h declares {declared} results");
        for code in [
            res::DEVICE_UNAVAILABLE,
            res::NO_DEVICE,
            res::NOT_INITIALIZED,
            res::TIMEOUT,
            res::UNKNOWN,
        ] {
            assert!(error_text(code).is_some(), "{code} has no name");
        }
        let (name, text) = error_text(46).expect("46");
        assert_eq!(name.to_str().ok(), Some("CUDA_ERROR_DEVICE_UNAVAILABLE"));
        assert!(text.to_string_lossy().contains("unavailable"));
    }
}
