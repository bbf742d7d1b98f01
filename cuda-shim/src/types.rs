//! The C types of the CUDA Driver API, as CUDA 12/13's `cuda.h` defines them: result codes,
//! attribute numbers, flags. Handles are opaque pointers; the library hands out small
//! integers cast to pointers and never dereferences a handle a program passes in.

#![allow(non_camel_case_types, non_upper_case_globals, non_snake_case)]

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};

pub type CUresult = c_uint;
pub type CUdevice = c_int;
pub type CUdeviceptr = u64;
pub type CUcontext = *mut c_void;
pub type CUmodule = *mut c_void;
pub type CUfunction = *mut c_void;
pub type CUstream = *mut c_void;
pub type CUevent = *mut c_void;

/// `CUuuid`: 16 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct CUuuid {
    pub bytes: [c_char; 16],
}

/// `CUresult` values (cuda.h `cudaError_enum`).
pub mod res {
    use super::CUresult;
    pub const SUCCESS: CUresult = 0;
    pub const INVALID_VALUE: CUresult = 1;
    pub const OUT_OF_MEMORY: CUresult = 2;
    pub const NOT_INITIALIZED: CUresult = 3;
    pub const DEINITIALIZED: CUresult = 4;
    pub const DEVICE_UNAVAILABLE: CUresult = 46;
    pub const NO_DEVICE: CUresult = 100;
    pub const INVALID_DEVICE: CUresult = 101;
    pub const INVALID_IMAGE: CUresult = 200;
    pub const INVALID_CONTEXT: CUresult = 201;
    pub const NO_BINARY_FOR_GPU: CUresult = 209;
    pub const UNSUPPORTED_LIMIT: CUresult = 215;
    pub const INVALID_PTX: CUresult = 218;
    pub const JIT_COMPILER_NOT_FOUND: CUresult = 221;
    pub const FILE_NOT_FOUND: CUresult = 301;
    pub const INVALID_HANDLE: CUresult = 400;
    pub const ILLEGAL_STATE: CUresult = 401;
    pub const NOT_FOUND: CUresult = 500;
    pub const NOT_READY: CUresult = 600;
    pub const ILLEGAL_ADDRESS: CUresult = 700;
    pub const LAUNCH_OUT_OF_RESOURCES: CUresult = 701;
    pub const HOST_MEMORY_ALREADY_REGISTERED: CUresult = 712;
    pub const HOST_MEMORY_NOT_REGISTERED: CUresult = 713;
    pub const LAUNCH_FAILED: CUresult = 719;
    pub const COOPERATIVE_LAUNCH_TOO_LARGE: CUresult = 720;
    pub const NOT_PERMITTED: CUresult = 800;
    pub const NOT_SUPPORTED: CUresult = 801;
    pub const STREAM_CAPTURE_UNSUPPORTED: CUresult = 900;
    pub const STREAM_CAPTURE_UNMATCHED: CUresult = 903;
    pub const STREAM_CAPTURE_MERGE: CUresult = 902;
    pub const STREAM_CAPTURE_IMPLICIT: CUresult = 906;
    pub const CAPTURED_EVENT: CUresult = 907;
    pub const TIMEOUT: CUresult = 909;
    pub const UNKNOWN: CUresult = 999;
}

/// `CUdevice_attribute` values this library answers from the device or a fixed value.
pub mod attr {
    pub const MAX_THREADS_PER_BLOCK: i32 = 1;
    pub const MAX_BLOCK_DIM_X: i32 = 2;
    pub const MAX_BLOCK_DIM_Y: i32 = 3;
    pub const MAX_BLOCK_DIM_Z: i32 = 4;
    pub const MAX_GRID_DIM_X: i32 = 5;
    pub const MAX_GRID_DIM_Y: i32 = 6;
    pub const MAX_GRID_DIM_Z: i32 = 7;
    pub const MAX_SHARED_MEMORY_PER_BLOCK: i32 = 8;
    pub const TOTAL_CONSTANT_MEMORY: i32 = 9;
    pub const WARP_SIZE: i32 = 10;
    pub const MAX_PITCH: i32 = 11;
    pub const MAX_REGISTERS_PER_BLOCK: i32 = 12;
    pub const CLOCK_RATE: i32 = 13;
    pub const TEXTURE_ALIGNMENT: i32 = 14;
    pub const GPU_OVERLAP: i32 = 15;
    pub const MULTIPROCESSOR_COUNT: i32 = 16;
    pub const CAN_MAP_HOST_MEMORY: i32 = 19;
    pub const CONCURRENT_KERNELS: i32 = 31;
    pub const ECC_ENABLED: i32 = 32;
    pub const PCI_BUS_ID: i32 = 33;
    pub const PCI_DEVICE_ID: i32 = 34;
    pub const MEMORY_CLOCK_RATE: i32 = 36;
    pub const GLOBAL_MEMORY_BUS_WIDTH: i32 = 37;
    pub const L2_CACHE_SIZE: i32 = 38;
    pub const MAX_THREADS_PER_MULTIPROCESSOR: i32 = 39;
    pub const ASYNC_ENGINE_COUNT: i32 = 40;
    pub const UNIFIED_ADDRESSING: i32 = 41;
    pub const PCI_DOMAIN_ID: i32 = 50;
    pub const COMPUTE_CAPABILITY_MAJOR: i32 = 75;
    pub const COMPUTE_CAPABILITY_MINOR: i32 = 76;
    pub const GLOBAL_L1_CACHE_SUPPORTED: i32 = 79;
    pub const LOCAL_L1_CACHE_SUPPORTED: i32 = 80;
    pub const MAX_SHARED_MEMORY_PER_MULTIPROCESSOR: i32 = 81;
    pub const MAX_REGISTERS_PER_MULTIPROCESSOR: i32 = 82;
    pub const SINGLE_TO_DOUBLE_PRECISION_PERF_RATIO: i32 = 87;
    pub const COMPUTE_PREEMPTION_SUPPORTED: i32 = 90;
    pub const MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: i32 = 97;
    pub const HOST_REGISTER_SUPPORTED: i32 = 99;
    pub const VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: i32 = 102;
    pub const MAX_BLOCKS_PER_MULTIPROCESSOR: i32 = 106;
    pub const RESERVED_SHARED_MEMORY_PER_BLOCK: i32 = 111;
    pub const MEMORY_POOLS_SUPPORTED: i32 = 115;
    pub const CLUSTER_LAUNCH: i32 = 120;
    pub const TENSOR_MAP_ACCESS_SUPPORTED: i32 = 127;
    /// One past the last attribute CUDA 13.0 defines (`CU_DEVICE_ATTRIBUTE_MAX`).
    pub const MAX: i32 = 148;
}

/// `CUpointer_attribute` values.
pub mod ptr_attr {
    pub const CONTEXT: i32 = 1;
    pub const MEMORY_TYPE: i32 = 2;
    pub const DEVICE_POINTER: i32 = 3;
    pub const HOST_POINTER: i32 = 4;
    pub const BUFFER_ID: i32 = 7;
    pub const IS_MANAGED: i32 = 8;
    pub const DEVICE_ORDINAL: i32 = 9;
    pub const RANGE_START_ADDR: i32 = 11;
    pub const RANGE_SIZE: i32 = 12;
    pub const MAPPED: i32 = 13;
}

/// `CUmemorytype` values.
pub const CU_MEMORYTYPE_HOST: u32 = 1;
pub const CU_MEMORYTYPE_DEVICE: u32 = 2;

/// `CU_STREAM_LEGACY` and `CU_STREAM_PER_THREAD`.
pub const CU_STREAM_LEGACY: usize = 0x1;
pub const CU_STREAM_PER_THREAD: usize = 0x2;
/// `CU_STREAM_NON_BLOCKING`.
pub const CU_STREAM_NON_BLOCKING: c_uint = 0x1;
/// `CU_EVENT_DISABLE_TIMING`.
pub const CU_EVENT_DISABLE_TIMING: c_uint = 0x2;
/// `CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK`.
pub const CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK: c_int = 0;
/// `CU_LAUNCH_PARAM_*` markers of `cuLaunchKernel`'s `extra`.
pub const CU_LAUNCH_PARAM_END: usize = 0x0;
pub const CU_LAUNCH_PARAM_BUFFER_POINTER: usize = 0x1;
pub const CU_LAUNCH_PARAM_BUFFER_SIZE: usize = 0x2;
/// `CUdriverProcAddressQueryResult` values.
pub const CU_GET_PROC_ADDRESS_SUCCESS: c_int = 0;
pub const CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND: c_int = 1;
pub const CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT: c_int = 2;

/// The driver API version this library implements (`cuDriverGetVersion`).
pub const DRIVER_VERSION: c_int = 13000;

/// (code, name, description) of every result this library returns, as cuda.h documents.
const ERRORS: &[(CUresult, &CStr, &CStr)] = &[
    (0, c"CUDA_SUCCESS", c"no error"),
    (1, c"CUDA_ERROR_INVALID_VALUE", c"invalid argument"),
    (2, c"CUDA_ERROR_OUT_OF_MEMORY", c"out of memory"),
    (3, c"CUDA_ERROR_NOT_INITIALIZED", c"initialization error"),
    (4, c"CUDA_ERROR_DEINITIALIZED", c"driver shutting down"),
    (
        46,
        c"CUDA_ERROR_DEVICE_UNAVAILABLE",
        c"CUDA-capable device(s) is/are busy or unavailable",
    ),
    (
        100,
        c"CUDA_ERROR_NO_DEVICE",
        c"no CUDA-capable device is detected",
    ),
    (101, c"CUDA_ERROR_INVALID_DEVICE", c"invalid device ordinal"),
    (
        200,
        c"CUDA_ERROR_INVALID_IMAGE",
        c"device kernel image is invalid",
    ),
    (
        201,
        c"CUDA_ERROR_INVALID_CONTEXT",
        c"invalid device context",
    ),
    (
        209,
        c"CUDA_ERROR_NO_BINARY_FOR_GPU",
        c"no kernel image is available for execution on the device",
    ),
    (
        215,
        c"CUDA_ERROR_UNSUPPORTED_LIMIT",
        c"limit is not supported on this architecture",
    ),
    (
        218,
        c"CUDA_ERROR_INVALID_PTX",
        c"a PTX JIT compilation failed",
    ),
    (
        221,
        c"CUDA_ERROR_JIT_COMPILER_NOT_FOUND",
        c"PTX JIT compiler library not found",
    ),
    (301, c"CUDA_ERROR_FILE_NOT_FOUND", c"file not found"),
    (
        400,
        c"CUDA_ERROR_INVALID_HANDLE",
        c"invalid resource handle",
    ),
    (
        401,
        c"CUDA_ERROR_ILLEGAL_STATE",
        c"the operation cannot be performed in the present state",
    ),
    (500, c"CUDA_ERROR_NOT_FOUND", c"named symbol not found"),
    (600, c"CUDA_ERROR_NOT_READY", c"device not ready"),
    (
        700,
        c"CUDA_ERROR_ILLEGAL_ADDRESS",
        c"an illegal memory access was encountered",
    ),
    (
        701,
        c"CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES",
        c"too many resources requested for launch",
    ),
    (
        712,
        c"CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED",
        c"part or all of the requested memory range is already mapped",
    ),
    (
        713,
        c"CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED",
        c"pointer does not correspond to a registered memory region",
    ),
    (
        719,
        c"CUDA_ERROR_LAUNCH_FAILED",
        c"unspecified launch failure",
    ),
    (800, c"CUDA_ERROR_NOT_PERMITTED", c"operation not permitted"),
    (801, c"CUDA_ERROR_NOT_SUPPORTED", c"operation not supported"),
    (
        900,
        c"CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED",
        c"operation not permitted when stream is capturing",
    ),
    (
        902,
        c"CUDA_ERROR_STREAM_CAPTURE_MERGE",
        c"operation would result in a merge of separate capture sequences",
    ),
    (
        903,
        c"CUDA_ERROR_STREAM_CAPTURE_UNMATCHED",
        c"capture was not initiated in this stream",
    ),
    (
        906,
        c"CUDA_ERROR_STREAM_CAPTURE_IMPLICIT",
        c"operation would make the legacy stream depend on a capturing blocking stream",
    ),
    (
        907,
        c"CUDA_ERROR_CAPTURED_EVENT",
        c"operation not permitted on an event last recorded in a capturing stream",
    ),
    (909, c"CUDA_ERROR_TIMEOUT", c"wait operation timed out"),
    (999, c"CUDA_ERROR_UNKNOWN", c"unknown error"),
];

/// The name and description of a result code this library knows.
pub fn error_text(code: CUresult) -> Option<(&'static CStr, &'static CStr)> {
    ERRORS
        .iter()
        .find(|(c, _, _)| *c == code)
        .map(|&(_, n, d)| (n, d))
}

/// A `const char*` for C.
pub fn c_str_ptr(s: &'static CStr) -> *const c_char {
    s.as_ptr()
}
