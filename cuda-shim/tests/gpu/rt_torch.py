"""PyTorch on a vGPU, stage by stage ("STAGE name: ok" or "STAGE name: FAIL ..."):
torch.cuda.is_available(), a matrix product checked against the CPU's, and a small
training step (the same model, data and optimiser on the CPU and the device: the loss
falls and the weights agree). Prints "TORCH OK" when every stage passed. Runs natively and
on a vGPU (LD_LIBRARY_PATH, VGPU_SOCKET)."""

import traceback

import torch


def stage(name, f):
    try:
        f()
        print(f"STAGE {name}: ok", flush=True)
        return True
    except Exception as e:  # each stage's failure is reported, the next stage still runs
        traceback.print_exc()
        print(f"STAGE {name}: FAIL {type(e).__name__}: {e}", flush=True)
        return False


def available():
    print("available:", torch.cuda.is_available(), "devices:", torch.cuda.device_count())
    assert torch.cuda.is_available()
    print("device:", torch.cuda.get_device_name(0))


def matmul():
    torch.manual_seed(1)
    x = torch.randn(1024, 512)
    y = torch.randn(512, 768)
    z = (x.cuda() @ y.cuda()).cpu()
    torch.testing.assert_close(z, x @ y, rtol=1e-3, atol=1e-3)


def train():
    def run(dev):
        torch.manual_seed(3)
        m = torch.nn.Sequential(
            torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10)
        ).to(dev)
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        g = torch.Generator().manual_seed(4)
        x = torch.randn(256, 64, generator=g).to(dev)
        y = torch.randint(0, 10, (256,), generator=g).to(dev)
        losses = []
        for _ in range(5):
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(m(x), y)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses, [p.detach().cpu() for p in m.parameters()]

    cpu_losses, cpu_params = run("cpu")
    dev_losses, dev_params = run("cuda")
    print("losses cpu", cpu_losses, "cuda", dev_losses)
    assert dev_losses[-1] < dev_losses[0]
    for a, b in zip(cpu_params, dev_params):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-4)


if stage("available", available):
    results = [stage("matmul", matmul), stage("train", train)]
    if all(results):
        print("TORCH OK")
