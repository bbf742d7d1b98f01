"""JAX on a vGPU: jit of a small function and a matrix product, checked against NumPy.
Prints "JAX OK". Runs natively and on a vGPU (LD_LIBRARY_PATH, VGPU_SOCKET)."""

import numpy as np
import jax
import jax.numpy as jnp

print("devices:", jax.devices())
assert jax.devices()[0].platform == "gpu"


@jax.jit
def f(x, y):
    return jnp.tanh(x) * y + jnp.sum(x * y)


rng = np.random.default_rng(7)
x = rng.standard_normal(4096, dtype=np.float32)
y = rng.standard_normal(4096, dtype=np.float32)
got = np.asarray(f(x, y))
want = np.tanh(x) * y + np.sum(x * y)
np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-3)
a = rng.standard_normal((256, 128), dtype=np.float32)
b = rng.standard_normal((128, 64), dtype=np.float32)
np.testing.assert_allclose(
    np.asarray(jnp.dot(a, b, precision=jax.lax.Precision.HIGHEST)), a @ b, rtol=1e-4, atol=1e-3
)
print("JAX OK")
