"""An unmodified cuda-python program (cuda.bindings.driver, PTX compiled with NVRTC): adds
two vectors and checks every element. Runs natively and on a vGPU (LD_LIBRARY_PATH
pointing at the vGPU library, VGPU_SOCKET at a worker)."""

import sys

import numpy as np
from cuda.bindings import driver, nvrtc

SOURCE = b"""
extern "C" __global__ void vecadd(const float *a, const float *b, float *c, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        c[i] = a[i] + b[i];
}
"""


def check(result):
    err, *rest = result
    if isinstance(err, driver.CUresult) and err != driver.CUresult.CUDA_SUCCESS:
        _, name = driver.cuGetErrorName(err)
        raise RuntimeError(f"CUDA error {name.decode() if name else err}")
    if isinstance(err, nvrtc.nvrtcResult) and err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise RuntimeError(f"NVRTC error {err}")
    if not rest:
        return None
    return rest[0] if len(rest) == 1 else rest


def ptx_for(major, minor):
    prog = check(nvrtc.nvrtcCreateProgram(SOURCE, b"vecadd.cu", 0, [], []))
    opts = [f"--gpu-architecture=compute_{major}{minor}".encode()]
    err = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)[0]
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        size = check(nvrtc.nvrtcGetProgramLogSize(prog))
        log = b" " * size
        check(nvrtc.nvrtcGetProgramLog(prog, log))
        raise RuntimeError(f"NVRTC: {log.decode(errors='replace')}")
    size = check(nvrtc.nvrtcGetPTXSize(prog))
    ptx = b" " * size
    check(nvrtc.nvrtcGetPTX(prog, ptx))
    return ptx


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1 << 20
    check(driver.cuInit(0))
    dev = check(driver.cuDeviceGet(0))
    attr = driver.CUdevice_attribute
    major = check(driver.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev))
    minor = check(driver.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev))
    sms = check(driver.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev))
    name = check(driver.cuDeviceGetName(128, dev)).split(b"\0")[0].decode()
    print(f"vecadd.py: device {name}, cc {major}.{minor}, {sms} SMs")
    ctx = check(driver.cuDevicePrimaryCtxRetain(dev))
    check(driver.cuCtxSetCurrent(ctx))
    ptx = ptx_for(major, minor)
    image = np.char.array(ptx)
    module = check(driver.cuModuleLoadData(image.ctypes.data))
    fn = check(driver.cuModuleGetFunction(module, b"vecadd"))

    a = np.arange(n, dtype=np.float32)
    b = 0.5 * np.arange(n, dtype=np.float32)
    c = np.full(n, -1.0, dtype=np.float32)
    da = check(driver.cuMemAlloc(a.nbytes))
    db = check(driver.cuMemAlloc(b.nbytes))
    dc = check(driver.cuMemAlloc(c.nbytes))
    check(driver.cuMemcpyHtoD(da, a.ctypes.data, a.nbytes))
    check(driver.cuMemcpyHtoD(db, b.ctypes.data, b.nbytes))
    stream = check(driver.cuStreamCreate(0))

    pa = np.array([int(da)], dtype=np.uint64)
    pb = np.array([int(db)], dtype=np.uint64)
    pc = np.array([int(dc)], dtype=np.uint64)
    pn = np.array([n], dtype=np.int32)
    params = np.array([p.ctypes.data for p in (pa, pb, pc, pn)], dtype=np.uint64)
    block = 256
    grid = (n + block - 1) // block
    check(driver.cuLaunchKernel(fn, grid, 1, 1, block, 1, 1, 0, stream, params.ctypes.data, 0))
    check(driver.cuStreamSynchronize(stream))
    check(driver.cuMemcpyDtoH(c.ctypes.data, dc, c.nbytes))
    want = a + b
    bad = np.nonzero(c != want)[0]
    if bad.size:
        i = int(bad[0])
        raise SystemExit(f"vecadd.py: element {i} is {c[i]}, want {want[i]}")
    for p in (da, db, dc):
        check(driver.cuMemFree(p))
    check(driver.cuStreamDestroy(stream))
    check(driver.cuModuleUnload(module))
    check(driver.cuDevicePrimaryCtxRelease(dev))
    print(f"VECADD OK python n={n}")


if __name__ == "__main__":
    main()
