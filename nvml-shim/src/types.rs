//! NVML's C types, result codes and constants, as NVIDIA's `nvml.h` defines them.

use std::ffi::{c_char, c_uint, c_ulonglong, CStr};

/// `nvmlReturn_t`.
pub type NvmlReturn = c_uint;

/// `nvmlReturn_t` values.
pub mod ret {
    use super::NvmlReturn;
    pub const SUCCESS: NvmlReturn = 0;
    pub const UNINITIALIZED: NvmlReturn = 1;
    pub const INVALID_ARGUMENT: NvmlReturn = 2;
    pub const NOT_SUPPORTED: NvmlReturn = 3;
    pub const NO_PERMISSION: NvmlReturn = 4;
    pub const NOT_FOUND: NvmlReturn = 6;
    pub const INSUFFICIENT_SIZE: NvmlReturn = 7;
    pub const DRIVER_NOT_LOADED: NvmlReturn = 9;
    pub const GPU_IS_LOST: NvmlReturn = 15;
    pub const ARGUMENT_VERSION_MISMATCH: NvmlReturn = 25;
    pub const UNKNOWN: NvmlReturn = 999;
}

/// Every result code NVML defines with its text (`nvmlErrorString`).
const ERRORS: &[(NvmlReturn, &CStr)] = &[
    (0, c"Success"),
    (1, c"Uninitialized"),
    (2, c"Invalid Argument"),
    (3, c"Not Supported"),
    (4, c"Insufficient Permissions"),
    (5, c"Already Initialized"),
    (6, c"Not Found"),
    (7, c"Insufficient Size"),
    (8, c"Insufficient External Power"),
    (9, c"Driver Not Loaded"),
    (10, c"Timeout"),
    (11, c"Interrupt request issue"),
    (12, c"NVML Shared Library Not Found"),
    (13, c"Function Not Found"),
    (14, c"Corrupted infoROM"),
    (15, c"GPU is lost"),
    (16, c"GPU requires restart"),
    (17, c"The operating system has blocked the request"),
    (18, c"RM has detected an NVML/RM version mismatch"),
    (19, c"In use by another client"),
    (20, c"Insufficient Memory"),
    (21, c"No data"),
    (
        22,
        c"The requested vGPU operation is not available because ECC is enabled",
    ),
    (23, c"Ran out of critical resources, other than memory"),
    (24, c"The requested frequency is not supported"),
    (25, c"The provided version is invalid or unsupported"),
    (26, c"The requested functionality has been deprecated"),
    (27, c"The system is not ready for the request"),
    (28, c"No GPUs were found"),
    (
        29,
        c"Resource not in correct state to perform requested operation",
    ),
    (999, c"Unknown Error"),
];

/// The text of `code`; "Unknown Error" for a code NVML does not define.
pub fn error_text(code: NvmlReturn) -> &'static CStr {
    ERRORS
        .iter()
        .find(|(c, _)| *c == code)
        .map_or(c"Unknown Error", |&(_, t)| t)
}

/// `nvmlDevice_t`: an opaque pointer the library hands out and only compares.
pub type NvmlDevice = *mut std::ffi::c_void;

/// `nvmlMemory_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Memory {
    pub total: c_ulonglong,
    pub free: c_ulonglong,
    pub used: c_ulonglong,
}

/// `nvmlMemory_v2_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct MemoryV2 {
    pub version: c_uint,
    pub total: c_ulonglong,
    pub reserved: c_ulonglong,
    pub free: c_ulonglong,
    pub used: c_ulonglong,
}

/// `nvmlMemory_v2`: the size of `nvmlMemory_v2_t` with version 2 in the top byte.
pub const MEMORY_V2: c_uint = std::mem::size_of::<MemoryV2>() as c_uint | (2 << 24);

/// `nvmlUtilization_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Utilization {
    pub gpu: c_uint,
    pub memory: c_uint,
}

/// `NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE`.
pub const BUS_ID_LEGACY_LEN: usize = 16;
/// `NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE`.
pub const BUS_ID_LEN: usize = 32;

/// `nvmlPciInfo_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct PciInfo {
    pub bus_id_legacy: [c_char; BUS_ID_LEGACY_LEN],
    pub domain: c_uint,
    pub bus: c_uint,
    pub device: c_uint,
    pub pci_device_id: c_uint,
    pub pci_subsystem_id: c_uint,
    pub bus_id: [c_char; BUS_ID_LEN],
}

/// `nvmlProcessInfo_v1_t` (what the unversioned `nvmlDeviceGetComputeRunningProcesses`
/// writes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ProcessInfoV1 {
    pub pid: c_uint,
    pub used_gpu_memory: c_ulonglong,
}

/// `nvmlProcessInfo_v2_t` / `nvmlProcessInfo_t` (the `_v2` and `_v3` functions).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ProcessInfo {
    pub pid: c_uint,
    pub used_gpu_memory: c_ulonglong,
    pub gpu_instance_id: c_uint,
    pub compute_instance_id: c_uint,
}

/// `gpuInstanceId` and `computeInstanceId` of a process on a GPU without MIG.
pub const NO_INSTANCE: c_uint = 0xFFFF_FFFF;

/// `NVML_COMPUTEMODE_DEFAULT` .. `NVML_COMPUTEMODE_EXCLUSIVE_PROCESS`: the same numbers as
/// CUDA's `CU_COMPUTEMODE_*`.
pub const COMPUTE_MODE_COUNT: c_uint = 4;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_match_nvml_h() {
        assert_eq!(std::mem::size_of::<Memory>(), 24);
        assert_eq!(std::mem::size_of::<MemoryV2>(), 40);
        assert_eq!(MEMORY_V2, 40 | 0x0200_0000);
        assert_eq!(std::mem::size_of::<PciInfo>(), 68);
        assert_eq!(std::mem::size_of::<ProcessInfoV1>(), 16);
        assert_eq!(std::mem::size_of::<ProcessInfo>(), 24);
        assert_eq!(std::mem::size_of::<Utilization>(), 8);
    }

    #[test]
    fn every_code_has_a_text() {
        assert_eq!(error_text(ret::SUCCESS), c"Success");
        assert_eq!(error_text(ret::DRIVER_NOT_LOADED), c"Driver Not Loaded");
        assert_eq!(error_text(12345), c"Unknown Error");
    }
}
