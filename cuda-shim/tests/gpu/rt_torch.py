"""PyTorch on a vGPU: torch.cuda.is_available() and a matrix product on the device checked
against the CPU's; prints "TORCH OK". Runs natively and on a vGPU (LD_LIBRARY_PATH,
VGPU_SOCKET)."""

import torch

print("available:", torch.cuda.is_available(), "devices:", torch.cuda.device_count())
assert torch.cuda.is_available()
print("device:", torch.cuda.get_device_name(0))
torch.manual_seed(1)
x = torch.randn(1024, 512)
y = torch.randn(512, 768)
z = (x.cuda() @ y.cuda()).cpu()
torch.testing.assert_close(z, x @ y, rtol=1e-3, atol=1e-3)
print("matmul: ok")
print("TORCH OK")
