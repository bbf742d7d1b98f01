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
    cuMemAllocPitch_v2,
    cuMemAllocAsync,
    cuMemFreeAsync,
    cuMemAllocFromPoolAsync,
    cuMemPrefetchAsync,
    cuMemPrefetchAsync_v2,
    cuMemAdvise,
    cuMemAdvise_v2,
    cuMemRangeGetAttribute,
    cuMemcpy,
    cuMemcpyAsync,
    cuMemcpyPeer,
    cuMemcpyPeerAsync,
    cuMemcpy2D_v2,
    cuMemcpy2DAsync_v2,
    cuMemcpy2DUnaligned_v2,
    cuMemcpy3D_v2,
    cuMemcpy3DAsync_v2,
    cuMemsetD2D8_v2,
    cuMemsetD2D16_v2,
    cuMemsetD2D32_v2,
    cuMemsetD2D8Async,
    cuMemsetD2D16Async,
    cuMemsetD2D32Async,
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
    cuMemPoolCreate,
    cuMemPoolDestroy,
    cuDeviceGetDefaultMemPool,
    cuDeviceGetMemPool,
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
    cuCtxGetLimit,
    cuCtxSetLimit,
    cuCtxGetCacheConfig,
    cuCtxSetCacheConfig,
    cuCtxGetSharedMemConfig,
    cuCtxSetSharedMemConfig,
    cuCtxResetPersistingL2Cache,
    cuDeviceGetByPCIBusId,
    cuDeviceGetP2PAttribute,
    cuDeviceGetProperties,
    cuDeviceGetLuid,
    cuDeviceGetTexture1DLinearMaxWidth,
    cuFuncSetAttribute,
    cuFuncSetCacheConfig,
    cuFuncSetSharedMemConfig,
    cuFuncGetModule,
    cuFuncGetName,
    cuFuncGetParamInfo,
    cuLaunchKernelEx,
    cuLaunchCooperativeKernel,
    cuLaunchCooperativeKernelMultiDevice,
    cuLaunchHostFunc,
    cuStreamAddCallback,
    cuStreamAttachMemAsync,
    cuStreamBeginCapture_v2,
    cuStreamEndCapture,
    cuStreamIsCapturing,
    cuStreamGetCaptureInfo_v2,
    cuStreamGetAttribute,
    cuStreamSetAttribute,
    cuStreamWaitValue32_v2,
    cuStreamWriteValue32_v2,
    cuGraphCreate,
    cuGraphDestroy,
    cuGraphInstantiateWithFlags,
    cuGraphLaunch,
    cuGraphExecDestroy,
    cuModuleLoadFatBinary,
    cuModuleGetTexRef,
    cuModuleGetSurfRef,
    cuModuleEnumerateFunctions,
    cuModuleGetFunctionCount,
    cuLinkCreate_v2,
    cuLinkAddData_v2,
    cuLinkAddFile_v2,
    cuLinkComplete,
    cuLinkDestroy,
    cuLibraryLoadData,
    cuLibraryLoadFromFile,
    cuLibraryUnload,
    cuLibraryGetKernel,
    cuLibraryGetModule,
    cuKernelGetFunction,
    cuKernelGetAttribute,
    cuKernelSetAttribute,
    cuOccupancyMaxActiveBlocksPerMultiprocessor,
    cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags,
    cuOccupancyMaxPotentialBlockSize,
    cuOccupancyMaxPotentialBlockSizeWithFlags,
    cuOccupancyAvailableDynamicSMemPerBlock,
    cuImportExternalMemory,
    cuDestroyExternalMemory,
    cuImportExternalSemaphore,
    cuDestroyExternalSemaphore,
    cuGraphicsUnregisterResource,
    cuGraphicsMapResources,
    cuGraphicsUnmapResources,
    cuProfilerStart,
    cuProfilerStop,
    cuCtxAttach,
    cuCtxDetach,
);
