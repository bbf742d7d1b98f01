"""Framework figures on one GPU, natively or on a vGPU (LD_LIBRARY_PATH, VGPU_SOCKET): a
PyTorch fp32 (no TF32) and bf16 matrix product's TFLOP/s, a training step of a small MLP and of a small CNN,
the time per small asynchronous op, CuPy elementwise throughput at 1 MiB and 256 MiB.
Prints one "BENCH <name> <value> <unit>" line per figure, then "BENCH OK". The
import-to-first-result time is measured by the caller (a separate short program)."""

import time

import cupy as cp
import torch


def timed(f, n, warm=3):
    for _ in range(warm):
        f()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        f()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / n


def report(name, value, unit):
    print(f"BENCH {name} {value:.4g} {unit}", flush=True)


def matmul(dtype, name):
    # Throughput at steady state: the median of 5 windows of 50 products each (one 8192^3
    # bf16 product takes about 1.4 ms; a single short window also measures clock ramp-up
    # and the scheduler's first grant).
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=dtype)
    b = torch.randn(n, n, device="cuda", dtype=dtype)
    windows = sorted(timed(lambda: torch.mm(a, b), 50, warm=10) for _ in range(5))
    report(name, 2 * n**3 / windows[2] / 1e12, "TFLOP/s")


def step_time(model, x, y):
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()

    # The median of 5 windows of 200 steps: a step is launch-bound (tens of small kernels),
    # and one window alone follows the host's minute-to-minute launch rate.
    windows = sorted(timed(step, 200, warm=20) for _ in range(5))
    return windows[2]


def mlp():
    torch.manual_seed(3)
    m = torch.nn.Sequential(
        torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10)
    ).cuda()
    x = torch.randn(256, 64, device="cuda")
    y = torch.randint(0, 10, (256,), device="cuda")
    report("mlp_step", step_time(m, x, y) * 1e3, "ms")


def cnn():
    torch.manual_seed(5)
    m = torch.nn.Sequential(
        torch.nn.Conv2d(1, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(8, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.Flatten(),
        torch.nn.Linear(16 * 7 * 7, 10),
    ).cuda()
    x = torch.randn(64, 1, 14, 14, device="cuda")
    y = torch.randint(0, 10, (64,), device="cuda")
    report("cnn_step", step_time(m, x, y) * 1e3, "ms")


def small_ops():
    x = torch.zeros(1024, device="cuda")
    report("small_op", timed(lambda: x.add_(1), 2000, warm=200) * 1e6, "us")


def cupy_elementwise():
    for size, name, n in ((1 << 20, "1MiB", 200), (256 << 20, "256MiB", 20)):
        a = cp.ones(size // 4, dtype=cp.float32)
        out = cp.empty_like(a)
        k = cp.ElementwiseKernel("float32 x", "float32 y", "y = x * 2.0f + 1.0f", "axpb")
        for _ in range(3):
            k(a, out)
        cp.cuda.Device().synchronize()
        t = time.perf_counter()
        for _ in range(n):
            k(a, out)
        cp.cuda.Device().synchronize()
        s = (time.perf_counter() - t) / n
        report(f"cupy_elementwise_{name}", 2 * size / s / 1e9, "GB/s")


torch.backends.cuda.matmul.allow_tf32 = False
matmul(torch.float32, "matmul_fp32_8192")
mlp()
cnn()
small_ops()
cupy_elementwise()
# Last: on a vGPU this one stops the program (docs/cuda-api.md, "Limits a runtime program
# meets"), after every other figure was printed.
matmul(torch.bfloat16, "matmul_bf16_8192")
print("BENCH OK")
