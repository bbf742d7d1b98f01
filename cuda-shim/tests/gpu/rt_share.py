"""PyTorch training on a vGPU for the shares step: a GPU-bound MLP (fp32, 4096 wide) trained
with a fixed seed and fixed data for SECS seconds; every 20th step's loss is printed
("LOSS <step> <value>") so two runs can be compared step by step. With OOM=1 it then
allocates past its vGPU's memory share and expects PyTorch's OutOfMemoryError, after which
it still computes. Prints "SHARE OK" at the end."""

import os
import time

import torch

torch.manual_seed(11)
torch.backends.cuda.matmul.allow_tf32 = False
secs = float(os.environ.get("SECS", "20"))
w = 4096
model = torch.nn.Sequential(
    torch.nn.Linear(w, w), torch.nn.ReLU(), torch.nn.Linear(w, w), torch.nn.ReLU(),
    torch.nn.Linear(w, 16),
).cuda()
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
g = torch.Generator().manual_seed(12)
x = torch.randn(4096, w, generator=g).cuda()
y = torch.randint(0, 16, (4096,), generator=g).cuda()
t = time.time()
step = 0
while time.time() - t < secs:
    opt.zero_grad(set_to_none=True)
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    if step % 20 == 0:
        print(f"LOSS {step} {loss.item():.6f}", flush=True)
    step += 1
torch.cuda.synchronize()
print(f"STEPS {step} in {time.time() - t:.1f} s", flush=True)
if os.environ.get("OOM") == "1":
    total = torch.cuda.mem_get_info()[1]
    try:
        big = torch.empty(total + (1 << 30), dtype=torch.uint8, device="cuda")
        raise SystemExit(f"an allocation of {total + (1 << 30)} bytes past the share succeeded")
    except torch.OutOfMemoryError as e:
        print("OOM OK:", str(e).splitlines()[0][:120], flush=True)
    # The vGPU still computes after the refusal.
    assert float(torch.ones(1024, device="cuda").sum()) == 1024.0
print("SHARE OK", flush=True)
