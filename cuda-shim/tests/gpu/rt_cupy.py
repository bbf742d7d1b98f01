"""CuPy (CUDA runtime + NVRTC kernels + CUB + cuBLAS) on a vGPU, stage by stage, each
checked against NumPy and reported on its own line ("STAGE name: ok" or "STAGE name: FAIL
..."): an elementwise kernel, a reduction of 4096 float32 and one of 4 Mi float64 (CUB:
kernel names of C++ templates), a matrix product through cuBLAS. Prints "CUPY OK" when
every stage passed. Runs natively and on a vGPU (LD_LIBRARY_PATH, VGPU_SOCKET)."""

import traceback

import cupy as cp
import numpy as np


def stage(name, f):
    try:
        f()
        print(f"STAGE {name}: ok", flush=True)
        return True
    except Exception as e:  # each stage's failure is reported, the next stage still runs
        traceback.print_exc()
        print(f"STAGE {name}: FAIL {type(e).__name__}: {e}", flush=True)
        return False


def elementwise():
    h = np.arange(1 << 20, dtype=np.float32)
    np.testing.assert_array_equal(cp.asnumpy(cp.asarray(h) * 2 + 1), h * 2 + 1)


def reduction():
    h = np.arange(4096, dtype=np.float32)
    s = float(cp.asarray(h).sum())
    assert s == float(h.sum()), s


def reduction_big():
    x = np.random.default_rng(2).standard_normal(1 << 22)
    s = float(cp.asarray(x).sum())
    assert abs(s - x.sum()) < 1e-6 * max(1.0, abs(x.sum())), (s, x.sum())


def matmul():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((512, 256), dtype=np.float32)
    y = rng.standard_normal((256, 384), dtype=np.float32)
    z = cp.asnumpy(cp.asarray(x) @ cp.asarray(y))
    np.testing.assert_allclose(z, x @ y, rtol=1e-3, atol=1e-3)


print("device:", cp.cuda.runtime.getDeviceProperties(0)["name"].decode())
results = [
    stage("elementwise", elementwise),
    stage("reduction", reduction),
    stage("reduction-big", reduction_big),
    stage("matmul", matmul),
]
if all(results):
    print("CUPY OK")
