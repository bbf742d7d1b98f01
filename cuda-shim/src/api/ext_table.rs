//! `cuGetProcAddress` names of the libraries, function attributes, occupancy, pitched
//! copies, pools, host functions, captures and graphs (base name -> entry point).

use super::{func::*, graph::*, hostfn::*, launch_ex::*, library::*, memcpy2d::*, pool::*};
use super::{limits::*, pointer::*};

macro_rules! table {
    ($($base:literal => $f:path),* $(,)?) => {
        vec![$(($base, $f as *const () as usize)),*]
    };
}

/// (base name, function) of every entry point of these areas.
pub fn entries() -> Vec<(&'static str, usize)> {
    table! {
        "cuFuncSetAttribute" => cuFuncSetAttribute,
        "cuFuncSetCacheConfig" => cuFuncSetCacheConfig,
        "cuFuncSetSharedMemConfig" => cuFuncSetSharedMemConfig,
        "cuFuncGetName" => cuFuncGetName,
        "cuFuncGetModule" => cuFuncGetModule,
        "cuOccupancyMaxActiveBlocksPerMultiprocessor" => cuOccupancyMaxActiveBlocksPerMultiprocessor,
        "cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags" => cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags,
        "cuOccupancyMaxPotentialBlockSize" => cuOccupancyMaxPotentialBlockSize,
        "cuOccupancyMaxPotentialBlockSizeWithFlags" => cuOccupancyMaxPotentialBlockSizeWithFlags,
        "cuOccupancyAvailableDynamicSMemPerBlock" => cuOccupancyAvailableDynamicSMemPerBlock,
        "cuLaunchKernelEx" => cuLaunchKernelEx,
        "cuLibraryLoadData" => cuLibraryLoadData,
        "cuLibraryLoadFromFile" => cuLibraryLoadFromFile,
        "cuLibraryUnload" => cuLibraryUnload,
        "cuLibraryGetKernel" => cuLibraryGetKernel,
        "cuLibraryGetModule" => cuLibraryGetModule,
        "cuLibraryGetGlobal" => cuLibraryGetGlobal,
        "cuKernelGetFunction" => cuKernelGetFunction,
        "cuKernelGetAttribute" => cuKernelGetAttribute,
        "cuKernelSetAttribute" => cuKernelSetAttribute,
        "cuKernelSetCacheConfig" => cuKernelSetCacheConfig,
        "cuKernelGetName" => cuKernelGetName,
        "cuKernelGetLibrary" => cuKernelGetLibrary,
        "cuMemcpy2D" => cuMemcpy2D_v2,
        "cuMemcpy2DUnaligned" => cuMemcpy2DUnaligned_v2,
        "cuMemcpy2DAsync" => cuMemcpy2DAsync_v2,
        "cuMemcpy3D" => cuMemcpy3D_v2,
        "cuMemcpy3DAsync" => cuMemcpy3DAsync_v2,
        "cuMemAllocPitch" => cuMemAllocPitch_v2,
        "cuMemsetD2D8" => cuMemsetD2D8_v2,
        "cuMemsetD2D16" => cuMemsetD2D16_v2,
        "cuMemsetD2D32" => cuMemsetD2D32_v2,
        "cuMemsetD2D8Async" => cuMemsetD2D8Async,
        "cuMemsetD2D16Async" => cuMemsetD2D16Async,
        "cuMemsetD2D32Async" => cuMemsetD2D32Async,
        "cuMemAllocAsync" => cuMemAllocAsync,
        "cuMemAllocFromPoolAsync" => cuMemAllocFromPoolAsync,
        "cuMemFreeAsync" => cuMemFreeAsync,
        "cuMemPoolCreate" => cuMemPoolCreate,
        "cuMemPoolDestroy" => cuMemPoolDestroy,
        "cuMemPoolTrimTo" => cuMemPoolTrimTo,
        "cuMemPoolSetAttribute" => cuMemPoolSetAttribute,
        "cuMemPoolGetAttribute" => cuMemPoolGetAttribute,
        "cuMemPoolSetAccess" => cuMemPoolSetAccess,
        "cuMemPoolGetAccess" => cuMemPoolGetAccess,
        "cuDeviceGetDefaultMemPool" => cuDeviceGetDefaultMemPool,
        "cuDeviceGetMemPool" => cuDeviceGetMemPool,
        "cuDeviceSetMemPool" => cuDeviceSetMemPool,
        "cuPointerGetAttributes" => cuPointerGetAttributes,
        "cuCtxGetLimit" => cuCtxGetLimit,
        "cuCtxSetLimit" => cuCtxSetLimit,
        "cuLaunchHostFunc" => cuLaunchHostFunc,
        "cuStreamAddCallback" => cuStreamAddCallback,
        "cuStreamWriteValue32" => cuStreamWriteValue32_v2,
        "cuStreamWriteValue64" => cuStreamWriteValue64_v2,
        "cuStreamBeginCapture" => cuStreamBeginCapture_v2,
        "cuStreamEndCapture" => cuStreamEndCapture,
        "cuStreamIsCapturing" => cuStreamIsCapturing,
        "cuStreamGetCaptureInfo" => cuStreamGetCaptureInfo_v2,
        "cuThreadExchangeStreamCaptureMode" => cuThreadExchangeStreamCaptureMode,
        "cuGraphCreate" => cuGraphCreate,
        "cuGraphDestroy" => cuGraphDestroy,
        "cuGraphAddKernelNode" => cuGraphAddKernelNode_v2,
        "cuGraphAddMemcpyNode" => cuGraphAddMemcpyNode,
        "cuGraphAddMemsetNode" => cuGraphAddMemsetNode,
        "cuGraphGetNodes" => cuGraphGetNodes,
        "cuGraphInstantiate" => cuGraphInstantiateWithFlags,
        "cuGraphInstantiateWithFlags" => cuGraphInstantiateWithFlags,
        "cuGraphLaunch" => cuGraphLaunch,
        "cuGraphUpload" => cuGraphUpload,
        "cuGraphExecDestroy" => cuGraphExecDestroy,
    }
}
