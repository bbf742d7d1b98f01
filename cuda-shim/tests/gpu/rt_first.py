"""A PyTorch program's import-to-first-result time: import torch, one tensor on the GPU,
its sum read back. Prints "BENCH import_to_first_result <seconds> s"."""

import time

t = time.perf_counter()
import torch  # noqa: E402 (the import is what is timed)

x = torch.ones(1024, device="cuda")
assert float(x.sum()) == 1024.0
print(f"BENCH import_to_first_result {time.perf_counter() - t:.4g} s", flush=True)
