"""PyTorch on a vGPU, stage by stage ("STAGE name: ok" or "STAGE name: FAIL ..."):
torch.cuda.is_available(), a matrix product (cuBLAS) and a convolution (cuDNN) checked
against the CPU's, training steps of a small MLP and a small CNN (the same model, data
and optimiser on the CPU and the device: the loss falls and the weights agree),
torch.compile of a small function (Triton) and a CUDA graph captured and replayed.
Prints "TORCH OK" when every stage passed. Runs natively and
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


def conv():
    torch.manual_seed(2)
    x = torch.randn(8, 3, 32, 32)
    w = torch.randn(16, 3, 3, 3)
    z = torch.nn.functional.conv2d(x.cuda(), w.cuda(), padding=1).cpu()
    torch.testing.assert_close(z, torch.nn.functional.conv2d(x, w, padding=1), rtol=1e-3, atol=1e-3)


def train_cnn():
    def run(dev):
        torch.manual_seed(5)
        m = torch.nn.Sequential(
            torch.nn.Conv2d(1, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
            torch.nn.Conv2d(8, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.Flatten(),
            torch.nn.Linear(16 * 7 * 7, 10),
        ).to(dev)
        opt = torch.optim.Adam(m.parameters(), lr=1e-3)
        g = torch.Generator().manual_seed(6)
        x = torch.randn(64, 1, 14, 14, generator=g).to(dev)
        y = torch.randint(0, 10, (64,), generator=g).to(dev)
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
    print("cnn losses cpu", cpu_losses, "cuda", dev_losses)
    assert dev_losses[-1] < dev_losses[0]
    for a, b in zip(cpu_params, dev_params):
        torch.testing.assert_close(a, b, rtol=2e-3, atol=2e-4)


def compiled():
    def f(x, y):
        return torch.sin(x) * torch.cos(y) + x * y

    g = torch.compile(f)
    x = torch.randn(4096, device="cuda")
    y = torch.randn(4096, device="cuda")
    torch.testing.assert_close(g(x, y).cpu(), f(x.cpu(), y.cpu()), rtol=1e-4, atol=1e-5)


def graph():
    x = torch.randn(1024, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        y = x * 2 + 1  # warm-up outside the capture
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = x * 2 + 1
    for v in (3.0, -1.5):
        x.fill_(v)
        g.replay()
        torch.cuda.synchronize()
        assert torch.all(y == v * 2 + 1).item(), (v, y[:4])


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
    results = [
        stage("matmul", matmul),
        stage("conv", conv),
        stage("train", train),
        stage("train-cnn", train_cnn),
        stage("compile", compiled),
        stage("graph", graph),
    ]
    if all(results):
        print("TORCH OK")
