"""The NVML calls frameworks make, made the way they make them, on a vGPU.

PyTorch's NVML-based device count and UUIDs (ctypes on libnvidia-ml.so.1, as
torch.cuda._raw_device_count_nvml and _raw_device_uuid_nvml do), and what
torch.cuda.list_gpu_processes, device_memory_used and utilization read through pynvml
(NVIDIA's nvidia-ml-py). The program uses the vGPU through libcuda.so.1 (ctypes) between
the queries. Usage: frameworks.py SHARE_BYTES. Prints "ok" when every check holds.
"""

import ctypes
import os
import sys

import pynvml


def check(cond, what):
    if not cond:
        raise SystemExit(f"check failed: {what}")


def torch_style_count_and_uuid():
    """torch.cuda._raw_device_count_nvml and _raw_device_uuid_nvml."""
    nvml = ctypes.CDLL("libnvidia-ml.so.1")
    check(nvml.nvmlInit() == 0, "nvmlInit")
    count = ctypes.c_int(-1)
    check(nvml.nvmlDeviceGetCount_v2(ctypes.byref(count)) == 0, "nvmlDeviceGetCount_v2")
    check(count.value == 1, f"one device, got {count.value}")
    handle = ctypes.c_void_p()
    check(nvml.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(handle)) == 0, "handle")
    buf = ctypes.create_string_buffer(96)
    check(nvml.nvmlDeviceGetUUID(handle, buf, 96) == 0, "nvmlDeviceGetUUID")
    del nvml
    return buf.value.decode()


def main():
    share = int(sys.argv[1])
    uuid = torch_style_count_and_uuid()

    pynvml.nvmlInit()
    check(pynvml.nvmlDeviceGetCount() == 1, "pynvml count")
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    check(pynvml.nvmlDeviceGetUUID(h) == uuid, "the same UUID both ways")
    check(pynvml.nvmlDeviceGetName(h).startswith("vGPU"), "the vGPU's name")
    before = pynvml.nvmlDeviceGetMemoryInfo(h)
    check(before.total == share, f"total {before.total} is the share {share}")
    check(pynvml.nvmlDeviceGetComputeRunningProcesses(h) == [], "no process yet")

    cuda = ctypes.CDLL("libcuda.so.1")
    check(cuda.cuInit(0) == 0, "cuInit")
    ctx = ctypes.c_void_p()
    check(cuda.cuCtxCreate_v2(ctypes.byref(ctx), 0, 0) == 0, "cuCtxCreate")
    ptr = ctypes.c_uint64()
    size = 48 << 20
    check(cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(size)) == 0, "cuMemAlloc")

    # torch.cuda.device_memory_used and list_gpu_processes.
    after = pynvml.nvmlDeviceGetMemoryInfo(h)
    check(after.total == share, "total unchanged")
    check(after.used >= before.used + size, f"used {after.used} grew by {size}")
    check(after.free == after.total - after.used, "free is what is left")
    procs = pynvml.nvmlDeviceGetComputeRunningProcesses(h)
    check([p.pid for p in procs] == [os.getpid()], f"only this process: {procs}")
    check(procs[0].usedGpuMemory == after.used, "its memory is the vGPU's")

    # torch.cuda.utilization and memory_usage: the tenant gets no busy share.
    try:
        pynvml.nvmlDeviceGetUtilizationRates(h)
        check(False, "utilization answered")
    except pynvml.NVMLError_NotSupported:
        pass
    # A function NVML defines that a vGPU does not offer, and one it does not define.
    try:
        pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU)
        check(False, "temperature answered")
    except pynvml.NVMLError_NotSupported:
        pass
    try:
        pynvml._nvmlGetFunctionPointer("nvmlDeviceGetNoSuchThing")
        check(False, "an undefined function found")
    except pynvml.NVMLError_FunctionNotFound:
        pass
    check(pynvml.nvmlSystemGetCudaDriverVersion() == 13000, "CUDA version")
    pynvml.nvmlShutdown()
    # PyTorch's count leaves its nvmlInit unbalanced: NVML stays initialised until a
    # second shutdown.
    check(pynvml.nvmlDeviceGetCount() == 1, "still initialised")
    pynvml.nvmlShutdown()
    try:
        pynvml.nvmlDeviceGetCount()
        check(False, "count after shutdown")
    except pynvml.NVMLError_Uninitialized:
        pass
    print("ok")


main()
