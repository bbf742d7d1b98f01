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
    cuDeviceGetByPCIBusId,
    cuDeviceGetP2PAttribute,
    cuDeviceGetProperties,
    cuDeviceGetLuid,
    cuDeviceGetTexture1DLinearMaxWidth,
    cuLaunchCooperativeKernel,
    cuLaunchCooperativeKernelMultiDevice,
    cuStreamAttachMemAsync,
    cuStreamGetAttribute,
    cuStreamSetAttribute,
    cuStreamWaitValue32_v2,
    cuModuleLoadFatBinary,
    cuModuleGetTexRef,
    cuModuleGetSurfRef,
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
    cuCtxAttach,
    cuCtxDetach,
    cuLibraryGetUnifiedFunction,
    cuLibraryGetManaged,
    cuTensorMapReplaceAddress,
    cuTensorMapEncodeIm2col,
    cuTensorMapEncodeTiled,
    cuStreamBatchMemOp_v2,
    cuStreamWaitValue64_v2,
    // Their CUDA 11 names, which cuBLASLt's own table of driver entry points resolves by
    // name and requires to exist.
    cuStreamBatchMemOp,
    cuStreamWaitValue32,
    cuStreamWaitValue64,
    // What the CUDA runtime resolves at start-up beyond the above (so its calls answer
    // cudaErrorNotSupported rather than a driver too old): array and texture descriptors,
    // green contexts, graphics interop, the logs API, external memory mappings and
    // semaphores, managed-memory batches.
    cuArray3DGetDescriptor_v2,
    cuArrayGetDescriptor_v2,
    cuArrayGetMemoryRequirements,
    cuArrayGetPlane,
    cuArrayGetSparseProperties,
    cuMipmappedArrayCreate,
    cuMipmappedArrayDestroy,
    cuMipmappedArrayGetLevel,
    cuMipmappedArrayGetMemoryRequirements,
    cuMipmappedArrayGetSparseProperties,
    cuSurfObjectGetResourceDesc,
    cuTexObjectGetResourceDesc,
    cuTexObjectGetResourceViewDesc,
    cuTexObjectGetTextureDesc,
    cuCtxFromGreenCtx,
    cuCtxGetDevResource,
    cuDevResourceGenerateDesc,
    cuDevSmResourceSplitByCount,
    cuDeviceGetDevResource,
    cuGreenCtxCreate,
    cuGreenCtxDestroy,
    cuGreenCtxGetDevResource,
    cuGreenCtxGetId,
    cuGreenCtxRecordEvent,
    cuGreenCtxStreamCreate,
    cuGreenCtxWaitEvent,
    cuGraphKernelNodeGetParams_v2,
    cuGraphExecKernelNodeSetParams_v2,
    cuGraphKernelNodeGetParams,
    cuGraphExecKernelNodeSetParams,
    cuGraphNodeGetType,
    cuCtxRecordEvent,
    cuCtxWaitEvent,
    cuDeviceGetHostAtomicCapabilities,
    cuDeviceGetP2PAtomicCapabilities,
    cuDeviceGetNvSciSyncAttributes,
    cuDeviceRegisterAsyncNotification,
    cuDeviceUnregisterAsyncNotification,
    cuFlushGPUDirectRDMAWrites,
    cuEGLStreamConsumerAcquireFrame,
    cuEGLStreamConsumerConnect,
    cuEGLStreamConsumerConnectWithFlags,
    cuEGLStreamConsumerDisconnect,
    cuEGLStreamConsumerReleaseFrame,
    cuEGLStreamProducerConnect,
    cuEGLStreamProducerDisconnect,
    cuEGLStreamProducerPresentFrame,
    cuEGLStreamProducerReturnFrame,
    cuGLCtxCreate_v2,
    cuGLGetDevices_v2,
    cuGLInit,
    cuGLMapBufferObject_v2,
    cuGLMapBufferObjectAsync_v2,
    cuGLRegisterBufferObject,
    cuGLSetBufferObjectMapFlags,
    cuGLUnmapBufferObject,
    cuGLUnmapBufferObjectAsync,
    cuGLUnregisterBufferObject,
    cuGraphicsEGLRegisterImage,
    cuGraphicsGLRegisterBuffer,
    cuGraphicsGLRegisterImage,
    cuGraphicsResourceGetMappedEglFrame,
    cuGraphicsResourceGetMappedMipmappedArray,
    cuGraphicsResourceGetMappedPointer_v2,
    cuGraphicsResourceSetMapFlags_v2,
    cuGraphicsSubResourceGetMappedArray,
    cuGraphicsVDPAURegisterOutputSurface,
    cuGraphicsVDPAURegisterVideoSurface,
    cuVDPAUCtxCreate_v2,
    cuVDPAUGetDevice,
    cuLogsCurrent,
    cuLogsDumpToFile,
    cuLogsDumpToMemory,
    cuLogsRegisterCallback,
    cuLogsUnregisterCallback,
    cuExternalMemoryGetMappedBuffer,
    cuExternalMemoryGetMappedMipmappedArray,
    cuSignalExternalSemaphoresAsync,
    cuWaitExternalSemaphoresAsync,
    cuMemRangeGetAttributes,
    cuMemPrefetchBatchAsync,
    cuMemDiscardBatchAsync,
    cuMemDiscardAndPrefetchBatchAsync,
    cuProfilerInitialize,
);
