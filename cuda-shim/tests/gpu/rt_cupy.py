"""CuPy (CUDA runtime + NVRTC kernels + cuBLAS) on a vGPU: an elementwise kernel, a
reduction and a matrix product through cuBLAS, each checked against NumPy; prints
"CUPY OK". Runs natively and on a vGPU (LD_LIBRARY_PATH, VGPU_SOCKET)."""

import cupy as cp
import numpy as np

n = 1 << 20
print("device:", cp.cuda.runtime.getDeviceProperties(0)["name"].decode())
h = np.arange(n, dtype=np.float32)
a = cp.asarray(h)
b = a * 2 + 1
np.testing.assert_array_equal(cp.asnumpy(b), h * 2 + 1)
print("elementwise: ok")
s = float(cp.asarray(h[:4096]).sum())
assert s == float(h[:4096].sum()), s
print("reduction: ok")
rng = np.random.default_rng(1)
x = rng.standard_normal((512, 256), dtype=np.float32)
y = rng.standard_normal((256, 384), dtype=np.float32)
z = cp.asnumpy(cp.asarray(x) @ cp.asarray(y))
np.testing.assert_allclose(z, x @ y, rtol=1e-3, atol=1e-3)
print("matmul (cuBLAS): ok")
print("CUPY OK")
