//! Functions a program commonly calls that a vGPU does not offer: each answers
//! CUDA_ERROR_NOT_SUPPORTED and logs its name once. They take no arguments on purpose: a
//! C caller's arguments are simply ignored (the x86-64 and AArch64 C conventions let the
//! callee ignore them), so one shape fits every signature.

use std::collections::HashSet;
use std::sync::Mutex;

use crate::types::{res, CUresult};

/// Logs `what` at warn level the first time only.
pub fn log_once(what: &str) {
    static SEEN: Mutex<Option<HashSet<String>>> = Mutex::new(None);
    let mut seen = SEEN.lock().unwrap_or_else(|e| e.into_inner());
    if seen
        .get_or_insert_with(HashSet::new)
        .insert(what.to_string())
    {
        tracing::warn!("{what} is not supported on a vGPU: answering CUDA_ERROR_NOT_SUPPORTED");
    }
}

macro_rules! stubs {
    ($($name:ident),* $(,)?) => {
        $(
            #[no_mangle]
            pub extern "C" fn $name() -> CUresult {
                crate::guard(stringify!($name), || {
                    log_once(stringify!($name));
                    Err(res::NOT_SUPPORTED)
                })
            }
        )*
        /// Every stub: (exported name, function).
        pub const STUBS: &[(&str, extern "C" fn() -> CUresult)] = &[$((stringify!($name), $name)),*];
    };
}

stubs!(
    cuMemAllocManaged,
    cuMemPrefetchAsync,
    cuMemPrefetchAsync_v2,
    cuMemAdvise,
    cuMemAdvise_v2,
    cuMemRangeGetAttribute,
    cuMemAddressReserve,
    cuMemAddressFree,
    cuMemCreate,
    cuMemRelease,
    cuMemMap,
    cuMemUnmap,
    cuMemSetAccess,
    cuMemGetAllocationGranularity,
    cuMemExportToShareableHandle,
    cuMemImportFromShareableHandle,
    cuArrayCreate_v2,
    cuArrayDestroy,
    cuArray3DCreate_v2,
    cuTexObjectCreate,
    cuTexObjectDestroy,
    cuSurfObjectCreate,
    cuSurfObjectDestroy,
    cuIpcGetMemHandle,
    cuIpcOpenMemHandle_v2,
    cuIpcCloseMemHandle,
    cuIpcGetEventHandle,
    cuIpcOpenEventHandle,
    cuCtxEnablePeerAccess,
    cuCtxDisablePeerAccess,
    cuCtxGetCacheConfig,
    cuCtxSetCacheConfig,
    cuCtxGetSharedMemConfig,
    cuCtxSetSharedMemConfig,
    cuCtxResetPersistingL2Cache,
    cuDeviceGetPCIBusId,
    cuDeviceGetByPCIBusId,
    cuDeviceGetP2PAttribute,
    cuDeviceGetProperties,
    cuDeviceGetLuid,
    cuDeviceGetTexture1DLinearMaxWidth,
    cuLaunchCooperativeKernel,
    cuLaunchCooperativeKernelMultiDevice,
    cuStreamAttachMemAsync,
    cuStreamGetPriority,
    cuStreamGetAttribute,
    cuStreamSetAttribute,
    cuStreamWaitValue32_v2,
    cuModuleLoadFatBinary,
    cuModuleGetTexRef,
    cuModuleGetSurfRef,
    cuModuleGetLoadingMode,
    cuLinkCreate_v2,
    cuLinkAddData_v2,
    cuLinkAddFile_v2,
    cuLinkComplete,
    cuLinkDestroy,
    cuImportExternalMemory,
    cuDestroyExternalMemory,
    cuImportExternalSemaphore,
    cuDestroyExternalSemaphore,
    cuGraphicsUnregisterResource,
    cuGraphicsMapResources,
    cuGraphicsUnmapResources,
    cuProfilerStart,
    cuProfilerStop,
    cuGetExportTable,
    cuCtxAttach,
    cuCtxDetach,
    cuLibraryGetUnifiedFunction,
    cuLibraryGetManaged,
    cuTensorMapReplaceAddress,
    cuTensorMapEncodeIm2col,
    cuTensorMapEncodeTiled,
    cuStreamBatchMemOp_v2,
    cuStreamWaitValue64_v2,
);
