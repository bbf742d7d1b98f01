//! cuBLASLt (CUDA 13) fills a table of driver entry points of its own when its first
//! handle is made, each by its exact name (`dlsym`),
//! and `cublasLtCtxInit` fails with "Driver API initialization failed" (so `cublasCreate`
//! with CUBLAS_STATUS_INTERNAL_ERROR) when one of them is missing; it then asks every
//! stream it is given for its green context. Both are checked here against the built
//! library and a sim worker. The names are the table's, read from libcublasLt.so.13.
//! PyTorch's allocator resolves a list of its own the same way; it is checked here too.

mod common;

use std::ffi::{c_void, CString};
use std::ptr::null_mut;

use common::cuda::*;

/// The driver entry points cuBLASLt 13 resolves for its own use, in its order.
const CUBLASLT_TABLE: &[&str] = &[
    "cuDeviceGet",
    "cuDeviceGetName",
    "cuDeviceGetAttribute",
    "cuInit",
    "cuDriverGetVersion",
    "cuKernelGetFunction",
    "cuKernelGetAttribute",
    "cuKernelSetAttribute",
    "cuKernelGetLibrary",
    "cuLibraryGetKernel",
    "cuLibraryLoadData",
    "cuLibraryUnload",
    "cuModuleLoadData",
    "cuModuleLoadDataEx",
    "cuModuleUnload",
    "cuModuleGetFunction",
    "cuModuleGetGlobal_v2",
    "cuLaunchKernel",
    "cuLaunchKernelEx",
    "cuGetErrorName",
    "cuLinkCreate_v2",
    "cuLinkAddData_v2",
    "cuLinkComplete",
    "cuLinkDestroy",
    "cuFuncSetAttribute",
    "cuFuncGetAttribute",
    "cuFuncSetCacheConfig",
    "cuOccupancyMaxActiveClusters",
    "cuCtxGetCurrent",
    "cuCtxSetCurrent",
    "cuCtxGetLimit",
    "cuCtxSynchronize",
    "cuCtxGetId",
    "cuDevicePrimaryCtxRetain",
    "cuDevicePrimaryCtxRelease",
    "cuEventCreate",
    "cuEventDestroy_v2",
    "cuEventElapsedTime",
    "cuEventQuery",
    "cuEventRecord",
    "cuEventSynchronize",
    "cuStreamWaitEvent",
    "cuCtxPushCurrent_v2",
    "cuCtxPopCurrent_v2",
    "cuCtxGetDevice",
    "cuStreamWaitValue32",
    "cuStreamBatchMemOp",
    "cuStreamGetCaptureInfo_v2",
    "cuStreamGetCtx",
    "cuStreamGetGreenCtx",
    "cuGreenCtxGetDevResource",
    "cuGreenCtxStreamCreate",
    "cuMemAddressReserve",
    "cuMemCreate",
    "cuMemMap",
    "cuMemSetAccess",
    "cuMemRelease",
    "cuMemUnmap",
    "cuMemAddressFree",
    "cuMemPoolCreate",
    "cuMemPoolDestroy",
    "cuMemAllocFromPoolAsync",
    "cuMemPoolSetAttribute",
    "cuMemGetAllocationGranularity",
    "cuDeviceTotalMem_v2",
    "cuMemGetInfo_v2",
    "cuGraphKernelNodeGetParams",
    "cuGraphExecDestroy",
    "cuGraphLaunch",
    "cuGraphDestroy",
    "cuGraphInstantiate",
    "cuGraphGetNodes",
    "cuGraphNodeGetType",
    "cuMemAlloc_v2",
    "cuMemFree_v2",
    "cuMemcpyHtoD_v2",
    "cuMemcpy",
    "cuMemcpyAsync",
    "cuMemcpy2DAsync_v2",
    "cuMemcpyDtoDAsync_v2",
    "cuMemsetD8_v2",
    "cuMemPrefetchAsync",
    "cuPointerGetAttribute",
    "cuPointerGetAttributes",
    "cuGetExportTable",
    "cuStreamCreate",
    "cuStreamDestroy_v2",
    "cuStreamBeginCapture_v2",
    "cuStreamEndCapture",
    "cuStreamIsCapturing",
    "cuStreamSynchronize",
    "cuGetErrorString",
    "cuCtxDisablePeerAccess",
    "cuCtxEnablePeerAccess",
    "cuDeviceCanAccessPeer",
    "cuTensorMapEncodeTiled",
    "cuOccupancyMaxActiveBlocksPerMultiprocessor",
    "cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags",
    "cuOccupancyMaxPotentialClusterSize",
    "cuGraphExecKernelNodeSetParams",
    "cuModuleLoadFatBinary",
    "cuLinkAddFile_v2",
    "cuCtxPushCurrent",
    "cuCtxPopCurrent",
    "cuDevicePrimaryCtxReset",
    "cuMemcpyDtoH_v2",
    "cuDevicePrimaryCtxRelease_v2",
    "cuDevicePrimaryCtxSetFlags_v2",
    "cuDeviceGetCount",
];

#[test]
fn every_entry_point_cublaslt_resolves_is_exported_and_found_by_its_base_name() {
    let path = common::library();
    // SAFETY: loading our own library runs no initialisers with preconditions.
    let lib = unsafe { libloading::Library::new(&path) }.expect("dlopen libvgpu_cuda.so");
    let cu = Cuda::load();
    let mut missing = Vec::new();
    for name in CUBLASLT_TABLE {
        let c = CString::new(*name).unwrap();
        // SAFETY: only the address is looked at, never called through this type.
        let exported = unsafe { lib.get::<*mut c_void>(c.as_bytes_with_nul()) }.is_ok();
        // cuGetProcAddress takes the name without its ABI suffix.
        let base = CString::new(name.strip_suffix("_v2").unwrap_or(name)).unwrap();
        let mut p: Ptr = null_mut();
        let mut status = -1;
        // SAFETY: a valid name and out pointers.
        let r = unsafe { (cu.get_proc)(base.as_ptr(), &mut p, 13000, 0, &mut status) };
        if !exported || r != OK || status != 0 || p.is_null() {
            missing.push(format!("{name} (exported {exported}, lookup {r}/{status})"));
        }
    }
    assert!(missing.is_empty(), "cuBLASLt would not start: {missing:?}");
}

/// What PyTorch's allocator looks up with `cuGetProcAddress` (c10/cuda/driver_api.h: the
/// required entry points at CUDA 12.0, the multicast ones at 12.3) the first time an
/// allocation fails or expandable segments are asked for; a missing one stops the
/// program ("Can't find ...") where it should have raised OutOfMemoryError.
const PYTORCH_DRIVER_API: &[(&str, i32)] = &[
    ("cuDeviceGet", 12000),
    ("cuDeviceGetAttribute", 12000),
    ("cuMemGetAddressRange", 12000),
    ("cuMemAddressReserve", 12000),
    ("cuMemRelease", 12000),
    ("cuMemMap", 12000),
    ("cuMemAddressFree", 12000),
    ("cuMemSetAccess", 12000),
    ("cuMemUnmap", 12000),
    ("cuMemCreate", 12000),
    ("cuMemGetAllocationGranularity", 12000),
    ("cuMemExportToShareableHandle", 12000),
    ("cuMemImportFromShareableHandle", 12000),
    ("cuMemRetainAllocationHandle", 12000),
    ("cuMemGetAllocationPropertiesFromHandle", 12000),
    ("cuMemsetD32Async", 12000),
    ("cuStreamWriteValue32", 12000),
    ("cuGetErrorString", 12000),
    ("cuMulticastAddDevice", 12030),
    ("cuMulticastBindMem", 12030),
    ("cuMulticastCreate", 12030),
    ("cuMulticastUnbind", 12030),
];

#[test]
fn every_entry_point_pytorchs_allocator_looks_up_is_found() {
    let cu = Cuda::load();
    let mut missing = Vec::new();
    for (name, version) in PYTORCH_DRIVER_API {
        let c = CString::new(*name).unwrap();
        let mut p: Ptr = null_mut();
        let mut status = -1;
        // SAFETY: a valid name and out pointers.
        let r = unsafe { (cu.get_proc)(c.as_ptr(), &mut p, *version, 0, &mut status) };
        if r != OK || status != 0 || p.is_null() {
            missing.push(format!("{name} at {version} (lookup {r}/{status})"));
        }
    }
    assert!(missing.is_empty(), "PyTorch would stop: {missing:?}");
}

#[test]
fn a_stream_has_no_green_context_on_a_vgpu() {
    let (worker, cu) = common::cuda::start("cublaslt-green");
    assert_eq!(call!(cu, "cuInit", fn(u32), 0), OK);
    let mut ctx: Ptr = null_mut();
    assert_eq!(
        call!(
            cu,
            "cuDevicePrimaryCtxRetain",
            fn(*mut Ptr, i32),
            &mut ctx,
            0
        ),
        OK
    );
    let mut green: Ptr = 0x1 as Ptr;
    // No current context yet: as the driver answers.
    assert_eq!(
        call!(
            cu,
            "cuStreamGetGreenCtx",
            fn(Ptr, *mut Ptr),
            null_mut(),
            &mut green
        ),
        INVALID_CONTEXT
    );
    assert_eq!(call!(cu, "cuCtxSetCurrent", fn(Ptr), ctx), OK);
    assert_eq!(
        call!(
            cu,
            "cuStreamGetGreenCtx",
            fn(Ptr, *mut Ptr),
            null_mut(),
            &mut green
        ),
        OK
    );
    assert!(green.is_null());
    let mut s: Ptr = null_mut();
    assert_eq!(
        call!(cu, "cuStreamCreate", fn(*mut Ptr, u32), &mut s, 0),
        OK
    );
    green = 0x1 as Ptr;
    assert_eq!(
        call!(cu, "cuStreamGetGreenCtx", fn(Ptr, *mut Ptr), s, &mut green),
        OK
    );
    assert!(green.is_null());
    // A stream that is not one, and no place to answer in.
    assert_eq!(
        call!(
            cu,
            "cuStreamGetGreenCtx",
            fn(Ptr, *mut Ptr),
            0xdead0 as Ptr,
            &mut green
        ),
        INVALID_HANDLE
    );
    assert_eq!(
        call!(cu, "cuStreamGetGreenCtx", fn(Ptr, *mut Ptr), s, null_mut()),
        INVALID_VALUE
    );
    assert_eq!(call!(cu, "cuStreamDestroy", fn(Ptr), s), OK);
    drop(worker);
}
