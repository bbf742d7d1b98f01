//! The one table of the library's entry points: every `cu*` name the library exports,
//! grouped by the base name `cuGetProcAddress` resolves, with the CUDA version each
//! variant answers from and the Rust function behind it. `cuGetProcAddress` looks names
//! up here only (`procaddr.rs`); the functions that answer `CUDA_ERROR_NOT_SUPPORTED` are
//! defined here; `tests/entry_points.rs` checks that the built library exports exactly
//! these names and that `include/cuda.h` and docs/cuda-api.md name every one.
//!
//! A row is `base`, optionally `@ version` (the CUDA version that introduced it, when
//! later than 2.0), or `base => [symbol @ version, ...]` (the variants `cuGetProcAddress`
//! answers by the `cudaVersion` asked for: the newest one at or below it; below the
//! oldest: `CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT`), then `per_thread [...]` (what it
//! answers with `CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM`, chosen the same way) and
//! `by_name [...]` (exported under their own names only: `cuGetProcAddress` answers base
//! names). Each symbol is the name of the exported Rust function that implements it.

use std::ffi::c_int;

use super::procaddr::{cuGetProcAddress, cuGetProcAddress_v2};
use super::{capture::*, context::*, copy::*, device::*, enumerate::*, export::*, func::*};
use super::{graph::*, hostfn::*, launch::*, launch_ex::*, library::*, limits::*, memcpy::*};
use super::{memcpy2d::*, memory::*, module::*, pointer::*, pool::*, ptsz::*, runtime::*};
use super::{stream::*, stubs::not_supported, tensor_map::*, vmm::*};

/// The address of an exported function.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Address(*const ());

// SAFETY: the address of a function's code: immutable, and never dereferenced by Rust.
unsafe impl Sync for Address {}
// SAFETY: as above.
unsafe impl Send for Address {}

impl Address {
    /// The address as `cuGetProcAddress` hands it out.
    pub fn get(self) -> usize {
        self.0 as usize
    }
}

/// An exported function: its symbol (the Rust function's name) and address.
#[derive(Clone, Copy, Debug)]
pub struct Symbol {
    pub name: &'static str,
    pub address: Address,
}

/// A variant `cuGetProcAddress` answers for a `cudaVersion` of `since` or later.
#[derive(Clone, Copy, Debug)]
pub struct Variant {
    pub since: c_int,
    pub symbol: Symbol,
}

/// One base name of the driver API.
#[derive(Debug)]
pub struct EntryPoint {
    /// The base name programs ask `cuGetProcAddress` for (`cuMemAlloc`).
    pub name: &'static str,
    /// False: every variant answers `CUDA_ERROR_NOT_SUPPORTED` (docs/cuda-api.md, "Not
    /// supported").
    pub supported: bool,
    /// What `cuGetProcAddress` answers without the per-thread flag, oldest first.
    pub versions: &'static [Variant],
    /// What it answers with `CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM`, oldest
    /// first; empty: the same as without.
    pub per_thread: &'static [Variant],
    /// Exported under their own names only.
    pub by_name: &'static [Symbol],
}

impl EntryPoint {
    /// Every symbol of this entry point (a symbol may appear under two base names).
    pub fn symbols(&self) -> impl Iterator<Item = Symbol> + '_ {
        let variants = self.versions.iter().chain(self.per_thread);
        variants
            .map(|v| v.symbol)
            .chain(self.by_name.iter().copied())
    }
}

/// The entry point of base name `name`.
pub fn find(name: &str) -> Option<&'static EntryPoint> {
    ENTRY_POINTS.iter().find(|e| e.name == name)
}

macro_rules! entry_points {
    (
        supported {
            $($base:ident $(@ $since:literal)? $(=> [$($f:ident $(@ $fv:literal)?),+])?
                $(per_thread [$($p:ident @ $pv:literal),+])? $(by_name [$($e:ident),+])?;)*
        }
        not_supported {
            $($nbase:ident $(=> [$($nf:ident),+])? $(by_name [$($ne:ident),+])?;)*
        }
    ) => {
        $(entry_points!(@stubs $nbase [$($($nf),+)?] $($($ne),+)?);)*

        /// Every entry point of the library, implemented ones first.
        pub static ENTRY_POINTS: &[EntryPoint] = &[
            $(EntryPoint {
                name: stringify!($base),
                supported: true,
                versions: entry_points!(@versions $base [$($since)?] [$($($f $(@ $fv)?),+)?]),
                per_thread: &[$($(Variant { since: $pv, symbol: entry_points!(@symbol $p) }),+)?],
                by_name: &[$($(entry_points!(@symbol $e)),+)?],
            },)*
            $(EntryPoint {
                name: stringify!($nbase),
                supported: false,
                versions: entry_points!(@versions $nbase [] [$($($nf),+)?]),
                per_thread: &[],
                by_name: &[$($(entry_points!(@symbol $ne)),+)?],
            },)*
        ];
    };
    (@versions $base:ident [$($since:literal)?] []) => {
        &[Variant { since: entry_points!(@since $($since)?), symbol: entry_points!(@symbol $base) }]
    };
    (@versions $base:ident [] [$($f:ident $(@ $fv:literal)?),+]) => {
        &[$(Variant { since: entry_points!(@since $($fv)?), symbol: entry_points!(@symbol $f) }),+]
    };
    (@since) => { 0 };
    (@since $v:literal) => { $v };
    (@symbol $f:ident) => {
        Symbol { name: stringify!($f), address: Address($f as *const ()) }
    };
    (@stubs $base:ident [] $($e:ident),*) => { not_supported!($base $(, $e)*); };
    (@stubs $base:ident [$($f:ident),+] $($e:ident),*) => { not_supported!($($f),+ $(, $e)*); };
}

entry_points! {
    supported {
        // Initialisation, errors, entry points.
        cuInit;
        cuDriverGetVersion @ 2020;
        cuGetErrorName @ 6000;
        cuGetErrorString @ 6000;
        cuGetProcAddress => [cuGetProcAddress @ 11030, cuGetProcAddress_v2 @ 12000];
        cuGetExportTable @ 3000;
        // Devices.
        cuDeviceGetCount;
        cuDeviceGet;
        cuDeviceGetName;
        cuDeviceGetUuid => [cuDeviceGetUuid @ 9020, cuDeviceGetUuid_v2 @ 11040];
        cuDeviceGetPCIBusId @ 4010;
        cuDeviceTotalMem => [cuDeviceTotalMem_v2 @ 3020];
        cuDeviceComputeCapability;
        cuDeviceGetAttribute;
        cuDeviceCanAccessPeer @ 4000;
        // Contexts.
        cuDevicePrimaryCtxRetain @ 7000;
        cuDevicePrimaryCtxRelease => [
            cuDevicePrimaryCtxRelease @ 7000,
            cuDevicePrimaryCtxRelease_v2 @ 11000
        ];
        cuDevicePrimaryCtxReset => [
            cuDevicePrimaryCtxReset @ 7000,
            cuDevicePrimaryCtxReset_v2 @ 11000
        ];
        cuDevicePrimaryCtxGetState @ 7000;
        cuDevicePrimaryCtxSetFlags => [
            cuDevicePrimaryCtxSetFlags @ 7000,
            cuDevicePrimaryCtxSetFlags_v2 @ 11000
        ];
        cuCtxCreate => [cuCtxCreate_v2 @ 3020, cuCtxCreate_v3 @ 11040, cuCtxCreate_v4 @ 12050];
        cuCtxDestroy => [cuCtxDestroy @ 2000, cuCtxDestroy_v2 @ 4000];
        cuCtxSetCurrent @ 4000;
        cuCtxGetCurrent @ 4000;
        cuCtxPushCurrent => [cuCtxPushCurrent @ 2000, cuCtxPushCurrent_v2 @ 4000];
        cuCtxPopCurrent => [cuCtxPopCurrent @ 2000, cuCtxPopCurrent_v2 @ 4000];
        cuCtxSynchronize by_name [cuCtxSynchronize_v2];
        cuCtxGetDevice by_name [cuCtxGetDevice_v2];
        cuCtxGetApiVersion @ 3020;
        cuCtxGetFlags @ 7000;
        cuCtxGetId @ 12000;
        cuCtxGetStreamPriorityRange @ 5050;
        cuCtxGetLimit @ 3010;
        cuCtxSetLimit @ 3010;
        // Memory.
        cuMemAlloc => [cuMemAlloc_v2 @ 3020];
        cuMemFree => [cuMemFree_v2 @ 3020];
        cuMemGetInfo => [cuMemGetInfo_v2 @ 3020];
        cuMemAllocHost => [cuMemAllocHost_v2 @ 3020];
        cuMemHostAlloc @ 2020;
        cuMemFreeHost;
        cuMemHostGetFlags @ 2030;
        cuMemHostRegister => [cuMemHostRegister @ 4000, cuMemHostRegister_v2 @ 6050];
        cuMemHostUnregister @ 4000;
        cuMemHostGetDevicePointer => [cuMemHostGetDevicePointer_v2 @ 3020];
        cuMemGetAddressRange => [cuMemGetAddressRange_v2 @ 3020];
        cuPointerGetAttribute @ 4000;
        cuPointerGetAttributes @ 7000;
        // Copies and memsets.
        cuMemcpyHtoD => [cuMemcpyHtoD_v2 @ 3020] per_thread [cuMemcpyHtoD_v2_ptds @ 7000];
        cuMemcpyHtoDAsync => [cuMemcpyHtoDAsync_v2 @ 3020]
            per_thread [cuMemcpyHtoDAsync_v2_ptsz @ 7000];
        cuMemcpyDtoH => [cuMemcpyDtoH_v2 @ 3020] per_thread [cuMemcpyDtoH_v2_ptds @ 7000];
        cuMemcpyDtoHAsync => [cuMemcpyDtoHAsync_v2 @ 3020]
            per_thread [cuMemcpyDtoHAsync_v2_ptsz @ 7000];
        cuMemcpyDtoD => [cuMemcpyDtoD_v2 @ 3020] per_thread [cuMemcpyDtoD_v2_ptds @ 7000];
        cuMemcpyDtoDAsync => [cuMemcpyDtoDAsync_v2 @ 3020]
            per_thread [cuMemcpyDtoDAsync_v2_ptsz @ 7000];
        cuMemsetD8 => [cuMemsetD8_v2 @ 3020] per_thread [cuMemsetD8_v2_ptds @ 7000];
        cuMemsetD16 => [cuMemsetD16_v2 @ 3020] per_thread [cuMemsetD16_v2_ptds @ 7000];
        cuMemsetD32 => [cuMemsetD32_v2 @ 3020] per_thread [cuMemsetD32_v2_ptds @ 7000];
        cuMemsetD8Async @ 3020 per_thread [cuMemsetD8Async_ptsz @ 7000];
        cuMemsetD16Async @ 3020 per_thread [cuMemsetD16Async_ptsz @ 7000];
        cuMemsetD32Async @ 3020 per_thread [cuMemsetD32Async_ptsz @ 7000];
        cuMemcpy @ 4000;
        cuMemcpyAsync @ 4000;
        cuMemcpyPeer @ 4000;
        cuMemcpyPeerAsync @ 4000;
        // Pitched memory.
        cuMemAllocPitch => [cuMemAllocPitch_v2 @ 3020];
        cuMemcpy2D => [cuMemcpy2D_v2 @ 3020];
        cuMemcpy2DUnaligned => [cuMemcpy2DUnaligned_v2 @ 3020];
        cuMemcpy2DAsync => [cuMemcpy2DAsync_v2 @ 3020];
        cuMemcpy3D => [cuMemcpy3D_v2 @ 3020];
        cuMemcpy3DAsync => [cuMemcpy3DAsync_v2 @ 3020];
        cuMemsetD2D8 => [cuMemsetD2D8_v2 @ 3020];
        cuMemsetD2D16 => [cuMemsetD2D16_v2 @ 3020];
        cuMemsetD2D32 => [cuMemsetD2D32_v2 @ 3020];
        cuMemsetD2D8Async @ 3020;
        cuMemsetD2D16Async @ 3020;
        cuMemsetD2D32Async @ 3020;
        // Stream-ordered allocation and pools.
        cuMemAllocAsync @ 11020;
        cuMemAllocFromPoolAsync @ 11020;
        cuMemFreeAsync @ 11020;
        cuMemPoolCreate @ 11020;
        cuMemPoolDestroy @ 11020;
        cuMemPoolTrimTo @ 11020;
        cuMemPoolSetAttribute @ 11020;
        cuMemPoolGetAttribute @ 11020;
        cuMemPoolSetAccess @ 11020;
        cuMemPoolGetAccess @ 11020;
        cuDeviceGetDefaultMemPool @ 11020;
        cuDeviceGetMemPool @ 11020;
        cuDeviceSetMemPool @ 11020;
        // Virtual memory management (reserved ranges, physical allocations, mappings).
        cuMemAddressReserve @ 10020;
        cuMemAddressFree @ 10020;
        cuMemCreate @ 10020;
        cuMemRelease @ 10020;
        cuMemMap @ 10020;
        cuMemUnmap @ 10020;
        cuMemSetAccess @ 10020;
        cuMemGetAccess @ 10020;
        cuMemGetAllocationGranularity @ 10020;
        cuMemRetainAllocationHandle @ 11000;
        cuMemGetAllocationPropertiesFromHandle @ 10020;
        // Modules and launches.
        cuModuleGetLoadingMode @ 11070;
        cuModuleLoad;
        cuModuleLoadData;
        cuModuleLoadDataEx @ 2010;
        cuModuleUnload;
        cuModuleGetFunction;
        cuModuleGetGlobal => [cuModuleGetGlobal_v2 @ 3020];
        cuLaunchKernel @ 4000 per_thread [cuLaunchKernel_ptsz @ 7000];
        cuLaunchKernelEx @ 11060;
        // Libraries and kernels.
        cuLibraryLoadData @ 12000;
        cuLibraryLoadFromFile @ 12000;
        cuLibraryUnload @ 12000;
        cuLibraryGetKernel @ 12000;
        cuLibraryGetModule @ 12000;
        cuLibraryGetGlobal @ 12000;
        cuKernelGetFunction @ 12000;
        cuKernelGetAttribute @ 12000;
        cuKernelSetAttribute @ 12000;
        cuKernelSetCacheConfig @ 12000;
        cuKernelGetName @ 12030;
        cuKernelGetLibrary @ 12050;
        // Function attributes, enumeration, occupancy.
        cuModuleGetFunctionCount @ 12040;
        cuModuleEnumerateFunctions @ 12040;
        cuLibraryGetKernelCount @ 12040;
        cuLibraryEnumerateKernels @ 12040;
        cuFuncGetParamInfo @ 12040;
        cuKernelGetParamInfo @ 12040;
        cuFuncIsLoaded @ 12040;
        cuFuncLoad @ 12040;
        cuFuncGetAttribute @ 2020;
        cuFuncSetAttribute @ 9000;
        cuFuncSetCacheConfig;
        cuFuncSetSharedMemConfig @ 4020;
        cuFuncGetName @ 12030;
        cuFuncGetModule @ 11000;
        cuOccupancyMaxActiveBlocksPerMultiprocessor @ 6050;
        cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags @ 7000;
        cuOccupancyMaxPotentialBlockSize @ 6050;
        cuOccupancyMaxPotentialBlockSizeWithFlags @ 7000;
        cuOccupancyAvailableDynamicSMemPerBlock @ 10020;
        cuOccupancyMaxActiveClusters @ 11070;
        cuOccupancyMaxPotentialClusterSize @ 11070;
        // Streams and events.
        cuStreamCreate;
        cuStreamCreateWithPriority @ 5050;
        cuStreamDestroy => [cuStreamDestroy @ 2000, cuStreamDestroy_v2 @ 4000];
        cuStreamSynchronize per_thread [cuStreamSynchronize_ptsz @ 7000];
        cuStreamQuery per_thread [cuStreamQuery_ptsz @ 7000];
        cuStreamWaitEvent @ 3020 per_thread [cuStreamWaitEvent_ptsz @ 7000];
        cuStreamGetFlags @ 5050 per_thread [cuStreamGetFlags_ptsz @ 7000];
        cuStreamGetCtx => [cuStreamGetCtx @ 9020, cuStreamGetCtx_v2 @ 12050]
            per_thread [cuStreamGetCtx_ptsz @ 9020, cuStreamGetCtx_v2_ptsz @ 12050];
        cuStreamGetGreenCtx @ 12040;
        cuStreamGetPriority @ 5050 per_thread [cuStreamGetPriority_ptsz @ 7000];
        cuStreamGetId @ 12000 per_thread [cuStreamGetId_ptsz @ 12000];
        cuStreamGetDevice @ 12080 per_thread [cuStreamGetDevice_ptsz @ 12080];
        cuEventCreate;
        cuEventRecord per_thread [cuEventRecord_ptsz @ 7000];
        cuEventRecordWithFlags @ 11010 per_thread [cuEventRecordWithFlags_ptsz @ 11010];
        cuEventQuery;
        cuEventSynchronize;
        cuEventElapsedTime => [cuEventElapsedTime @ 2000, cuEventElapsedTime_v2 @ 12080];
        cuEventDestroy => [cuEventDestroy @ 2000, cuEventDestroy_v2 @ 4000];
        // Host functions, value writes.
        cuLaunchHostFunc @ 10000;
        cuStreamAddCallback @ 5000;
        cuStreamWriteValue32 => [cuStreamWriteValue32_v2 @ 8000] by_name [cuStreamWriteValue32];
        cuStreamWriteValue64 => [cuStreamWriteValue64_v2 @ 9000] by_name [cuStreamWriteValue64];
        // Stream capture and graphs.
        cuStreamBeginCapture => [cuStreamBeginCapture @ 10000, cuStreamBeginCapture_v2 @ 10010];
        cuStreamEndCapture @ 10000;
        cuStreamIsCapturing @ 10000;
        cuStreamGetCaptureInfo => [
            cuStreamGetCaptureInfo @ 10010,
            cuStreamGetCaptureInfo_v2 @ 11030,
            cuStreamGetCaptureInfo_v3 @ 12030
        ];
        cuThreadExchangeStreamCaptureMode @ 10010;
        cuGraphCreate @ 10000;
        cuGraphDestroy @ 10000;
        cuGraphAddKernelNode => [cuGraphAddKernelNode @ 10000, cuGraphAddKernelNode_v2 @ 12000];
        cuGraphAddMemcpyNode @ 10000;
        cuGraphAddMemsetNode @ 10000;
        cuGraphGetNodes @ 10000;
        cuGraphInstantiate => [cuGraphInstantiate_v2 @ 10000, cuGraphInstantiateWithFlags @ 12000]
            by_name [cuGraphInstantiate];
        cuGraphInstantiateWithFlags @ 11040;
        cuGraphInstantiateWithParams @ 12000;
        // Tensor maps (TMA descriptors), encoded by the worker's driver.
        cuTensorMapEncodeTiled @ 12000;
        cuTensorMapEncodeIm2col @ 12000;
        cuTensorMapReplaceAddress @ 12000;
        cuGraphUpload @ 11010;
        cuGraphLaunch @ 10000;
        cuGraphExecDestroy @ 10000;
    }
    not_supported {
        cuMemAllocManaged;
        cuMemPrefetchAsync by_name [cuMemPrefetchAsync_v2];
        cuMemAdvise by_name [cuMemAdvise_v2];
        cuMemRangeGetAttribute;
        cuMulticastCreate;
        cuMulticastAddDevice;
        cuMulticastBindMem;
        cuMulticastBindAddr;
        cuMulticastUnbind;
        cuMulticastGetGranularity;
        cuMemExportToShareableHandle;
        cuMemImportFromShareableHandle;
        cuArrayCreate => [cuArrayCreate_v2];
        cuArrayDestroy;
        cuArray3DCreate => [cuArray3DCreate_v2];
        cuTexObjectCreate;
        cuTexObjectDestroy;
        cuSurfObjectCreate;
        cuSurfObjectDestroy;
        cuIpcGetMemHandle;
        cuIpcOpenMemHandle => [cuIpcOpenMemHandle_v2];
        cuIpcCloseMemHandle;
        cuIpcGetEventHandle;
        cuIpcOpenEventHandle;
        cuCtxEnablePeerAccess;
        cuCtxDisablePeerAccess;
        cuCtxGetCacheConfig;
        cuCtxSetCacheConfig;
        cuCtxGetSharedMemConfig;
        cuCtxSetSharedMemConfig;
        cuCtxResetPersistingL2Cache;
        cuDeviceGetByPCIBusId;
        cuDeviceGetP2PAttribute;
        cuDeviceGetProperties;
        cuDeviceGetLuid;
        cuDeviceGetTexture1DLinearMaxWidth;
        cuLaunchCooperativeKernel;
        cuLaunchCooperativeKernelMultiDevice;
        cuStreamAttachMemAsync;
        cuStreamGetAttribute;
        cuStreamSetAttribute;
        cuStreamWaitValue32 => [cuStreamWaitValue32_v2] by_name [cuStreamWaitValue32];
        cuModuleLoadFatBinary;
        cuModuleGetTexRef;
        cuModuleGetSurfRef;
        cuLinkCreate => [cuLinkCreate_v2];
        cuLinkAddData => [cuLinkAddData_v2];
        cuLinkAddFile => [cuLinkAddFile_v2];
        cuLinkComplete;
        cuLinkDestroy;
        cuImportExternalMemory;
        cuDestroyExternalMemory;
        cuImportExternalSemaphore;
        cuDestroyExternalSemaphore;
        cuGraphicsUnregisterResource;
        cuGraphicsMapResources;
        cuGraphicsUnmapResources;
        cuProfilerStart;
        cuProfilerStop;
        cuCtxAttach;
        cuCtxDetach;
        cuLibraryGetUnifiedFunction;
        cuLibraryGetManaged;
        cuStreamBatchMemOp => [cuStreamBatchMemOp_v2] by_name [cuStreamBatchMemOp];
        cuStreamWaitValue64 => [cuStreamWaitValue64_v2] by_name [cuStreamWaitValue64];
        // What the CUDA runtime resolves at start-up beyond the above (so its calls answer
        // cudaErrorNotSupported rather than a driver too old): array and texture
        // descriptors, green contexts, graphics interop, the logs API, external memory
        // mappings and semaphores, managed-memory batches.
        cuArray3DGetDescriptor => [cuArray3DGetDescriptor_v2];
        cuArrayGetDescriptor => [cuArrayGetDescriptor_v2];
        cuArrayGetMemoryRequirements;
        cuArrayGetPlane;
        cuArrayGetSparseProperties;
        cuMipmappedArrayCreate;
        cuMipmappedArrayDestroy;
        cuMipmappedArrayGetLevel;
        cuMipmappedArrayGetMemoryRequirements;
        cuMipmappedArrayGetSparseProperties;
        cuSurfObjectGetResourceDesc;
        cuTexObjectGetResourceDesc;
        cuTexObjectGetResourceViewDesc;
        cuTexObjectGetTextureDesc;
        cuCtxFromGreenCtx;
        cuCtxGetDevResource;
        cuDevResourceGenerateDesc;
        cuDevSmResourceSplitByCount;
        cuDeviceGetDevResource;
        cuGreenCtxCreate;
        cuGreenCtxDestroy;
        cuGreenCtxGetDevResource;
        cuGreenCtxGetId;
        cuGreenCtxRecordEvent;
        cuGreenCtxStreamCreate;
        cuGreenCtxWaitEvent;
        cuGraphKernelNodeGetParams => [cuGraphKernelNodeGetParams_v2] by_name [cuGraphKernelNodeGetParams];
        cuGraphExecKernelNodeSetParams => [cuGraphExecKernelNodeSetParams_v2]
            by_name [cuGraphExecKernelNodeSetParams];
        cuGraphNodeGetType;
        cuCtxRecordEvent;
        cuCtxWaitEvent;
        cuDeviceGetHostAtomicCapabilities;
        cuDeviceGetP2PAtomicCapabilities;
        cuDeviceGetNvSciSyncAttributes;
        cuDeviceRegisterAsyncNotification;
        cuDeviceUnregisterAsyncNotification;
        cuFlushGPUDirectRDMAWrites;
        cuEGLStreamConsumerAcquireFrame;
        cuEGLStreamConsumerConnect;
        cuEGLStreamConsumerConnectWithFlags;
        cuEGLStreamConsumerDisconnect;
        cuEGLStreamConsumerReleaseFrame;
        cuEGLStreamProducerConnect;
        cuEGLStreamProducerDisconnect;
        cuEGLStreamProducerPresentFrame;
        cuEGLStreamProducerReturnFrame;
        cuGLCtxCreate => [cuGLCtxCreate_v2];
        cuGLGetDevices => [cuGLGetDevices_v2];
        cuGLInit;
        cuGLMapBufferObject => [cuGLMapBufferObject_v2];
        cuGLMapBufferObjectAsync => [cuGLMapBufferObjectAsync_v2];
        cuGLRegisterBufferObject;
        cuGLSetBufferObjectMapFlags;
        cuGLUnmapBufferObject;
        cuGLUnmapBufferObjectAsync;
        cuGLUnregisterBufferObject;
        cuGraphicsEGLRegisterImage;
        cuGraphicsGLRegisterBuffer;
        cuGraphicsGLRegisterImage;
        cuGraphicsResourceGetMappedEglFrame;
        cuGraphicsResourceGetMappedMipmappedArray;
        cuGraphicsResourceGetMappedPointer => [cuGraphicsResourceGetMappedPointer_v2];
        cuGraphicsResourceSetMapFlags => [cuGraphicsResourceSetMapFlags_v2];
        cuGraphicsSubResourceGetMappedArray;
        cuGraphicsVDPAURegisterOutputSurface;
        cuGraphicsVDPAURegisterVideoSurface;
        cuVDPAUCtxCreate => [cuVDPAUCtxCreate_v2];
        cuVDPAUGetDevice;
        cuLogsCurrent;
        cuLogsDumpToFile;
        cuLogsDumpToMemory;
        cuLogsRegisterCallback;
        cuLogsUnregisterCallback;
        cuExternalMemoryGetMappedBuffer;
        cuExternalMemoryGetMappedMipmappedArray;
        cuSignalExternalSemaphoresAsync;
        cuWaitExternalSemaphoresAsync;
        cuMemRangeGetAttributes;
        cuMemPrefetchBatchAsync;
        cuMemDiscardBatchAsync;
        cuMemDiscardAndPrefetchBatchAsync;
        cuProfilerInitialize;
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    #[test]
    fn base_names_are_unique_and_variants_ordered_by_version() {
        let mut names = HashSet::new();
        for e in ENTRY_POINTS {
            assert!(names.insert(e.name), "{} listed twice", e.name);
            assert!(!e.versions.is_empty(), "{}: no function", e.name);
            for list in [e.versions, e.per_thread] {
                for pair in list.windows(2) {
                    assert!(
                        pair[0].since < pair[1].since,
                        "{}: variants oldest first, one per version",
                        e.name
                    );
                }
            }
            for v in e.per_thread {
                let name = v.symbol.name;
                assert!(
                    name.ends_with("_ptsz") || name.ends_with("_ptds"),
                    "{}: {name} is not a per-thread variant",
                    e.name
                );
            }
            assert!(e.supported || e.per_thread.is_empty(), "{}", e.name);
        }
    }
}
