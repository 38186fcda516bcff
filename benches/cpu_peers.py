"""PyTorch and numpy on the shapes of benches/cpu_ops.rs, printed side by side so the CPU
benchmarks can be compared with peers measured on the same machine.

    python3 -m venv "$TORCH_VENV" && "$TORCH_VENV"/bin/pip install torch numpy
    "$TORCH_VENV"/bin/python benches/cpu_peers.py [group ...]

Groups: matmul elementwise dispatch rows reduce conv sdpa (default: all). Each line gives the
median time over timed batches and the same throughput unit the criterion benchmark reports
(GFLOP/s for products, GB/s for memory-bound ops). Threads: 2 unless a case says 1.
"""

import sys
import time

import numpy as np
import torch

from peer_timing import median_batch_seconds

torch.set_num_threads(2)


def median_s(fn, min_time=0.4, batches=7):
    fn()
    fn()
    t0 = time.perf_counter()
    fn()
    one = max(time.perf_counter() - t0, 1e-7)
    per = max(1, int(min_time / batches / one))
    return median_batch_seconds(fn, per, batches)


def report(group, name, seconds, work, unit):
    rate = work / seconds / 1e9
    print(f"{group:<22} {name:<26} {seconds * 1e3:10.4f} ms  {rate:9.2f} {unit}")


def matmul():
    cases = [
        ("f32_1024_2t", torch.float32, 1, 1024, 1024, 1024, 2),
        ("f32_2048_2t", torch.float32, 1, 2048, 2048, 2048, 2),
        ("f32_1024_1t", torch.float32, 1, 1024, 1024, 1024, 1),
        ("f32_4096x1024x64", torch.float32, 1, 4096, 1024, 64, 2),
        ("f32_4096x64x1024", torch.float32, 1, 4096, 64, 1024, 2),
        ("f32_32x128x64x128", torch.float32, 32, 128, 64, 128, 2),
        ("bf16_1024_2t", torch.bfloat16, 1, 1024, 1024, 1024, 2),
        ("bf16_2048_2t", torch.bfloat16, 1, 2048, 2048, 2048, 2),
        ("f16_1024_2t", torch.float16, 1, 1024, 1024, 1024, 2),
    ]
    for name, dt, b, m, k, n, th in cases:
        torch.set_num_threads(th)
        shape_a = (m, k) if b == 1 else (b, m, k)
        shape_b = (k, n) if b == 1 else (b, k, n)
        a = torch.randn(*shape_a).to(dt)
        c = torch.randn(*shape_b).to(dt)
        report("matmul", "torch " + name, median_s(lambda: a @ c), 2 * b * m * k * n, "GFLOP/s")
        if dt == torch.float32:
            an, cn = a.numpy(), c.numpy()
            report("matmul", "numpy " + name, median_s(lambda: an @ cn), 2 * b * m * k * n, "GFLOP/s")
    torch.set_num_threads(2)
    a = torch.randn(4096, 4096)
    x = torch.randn(4096)
    report("matmul", "torch f32_matvec_4096", median_s(lambda: a @ x), 4096 * 4096 * 4, "GB/s")


def elementwise():
    n = 1 << 24
    a = torch.randn(n)
    b = torch.randn(n)
    an, bn = a.numpy(), b.numpy()
    three, two = 3 * 4 * n, 2 * 4 * n
    report("elementwise_16M_f32", "torch add", median_s(lambda: a + b), three, "GB/s")
    report("elementwise_16M_f32", "numpy add", median_s(lambda: an + bn), three, "GB/s")
    out = torch.empty(n)
    report("elementwise_16M_f32", "torch add (preallocated)", median_s(lambda: torch.add(a, b, out=out)), three, "GB/s")
    report("elementwise_16M_f32", "torch mul", median_s(lambda: a * b), three, "GB/s")
    report("elementwise_16M_f32", "torch mul_scalar", median_s(lambda: a * 1.5), two, "GB/s")
    for name, fn in [
        ("exp", torch.exp),
        ("tanh", torch.tanh),
        ("sigmoid", torch.sigmoid),
        ("silu", torch.nn.functional.silu),
        ("gelu", torch.nn.functional.gelu),
        ("gelu_tanh", lambda t: torch.nn.functional.gelu(t, approximate="tanh")),
        ("relu", torch.relu),
    ]:
        report("elementwise_16M_f32", "torch " + name, median_s(lambda: fn(a)), two, "GB/s")
    report("elementwise_16M_f32", "numpy exp", median_s(lambda: np.exp(an)), two, "GB/s")


def dispatch():
    a = torch.tensor([1.0, 2.0, 3.0, 4.0])
    b = torch.tensor([5.0, 6.0, 7.0, 8.0])
    s = median_s(lambda: a + b, min_time=0.5)
    print(f"{'dispatch':<22} {'torch add_4_f32':<26} {s * 1e6:10.4f} us")
    an, bn = a.numpy(), b.numpy()
    s = median_s(lambda: an + bn, min_time=0.5)
    print(f"{'dispatch':<22} {'numpy add_4_f32':<26} {s * 1e6:10.4f} us")


def rows():
    x = torch.randn(4096, 4096)
    w = torch.randn(4096)
    b = torch.randn(4096)
    bytes_ = 2 * 4 * 4096 * 4096
    F = torch.nn.functional
    report("rows_4096x4096_f32", "torch softmax", median_s(lambda: F.softmax(x, -1)), bytes_, "GB/s")
    report("rows_4096x4096_f32", "torch log_softmax", median_s(lambda: F.log_softmax(x, -1)), bytes_, "GB/s")
    report("rows_4096x4096_f32", "torch layer_norm", median_s(lambda: F.layer_norm(x, [4096], w, b)), bytes_, "GB/s")
    report("rows_4096x4096_f32", "torch rms_norm", median_s(lambda: F.rms_norm(x, [4096], w, 1e-6)), bytes_, "GB/s")


def reduce():
    x = torch.randn(4096, 4096)
    xn = x.numpy()
    bytes_ = 4 * 4096 * 4096
    for name, fn in [
        ("sum_last", lambda: x.sum(-1)),
        ("sum_first", lambda: x.sum(0)),
        ("max_last", lambda: x.amax(-1)),
        ("max_first", lambda: x.amax(0)),
        ("mean_last", lambda: x.mean(-1)),
        ("mean_first", lambda: x.mean(0)),
    ]:
        report("reduce_4096x4096_f32", "torch " + name, median_s(fn), bytes_, "GB/s")
    report("reduce_4096x4096_f32", "numpy sum_last", median_s(lambda: xn.sum(-1)), bytes_, "GB/s")


def conv():
    x = torch.randn(32, 64, 56, 56)
    w = torch.randn(64, 64, 3, 3)
    flops = 2 * 32 * 64 * 56 * 56 * 64 * 9
    F = torch.nn.functional
    report("conv2d", "torch f32_b32_64x64_56x56_3x3", median_s(lambda: F.conv2d(x, w, padding=1), batches=5), flops, "GFLOP/s")
    xb, wb = x.bfloat16(), w.bfloat16()
    report("conv2d", "torch bf16_b32_64x64_56x56_3x3", median_s(lambda: F.conv2d(xb, wb, padding=1), batches=5), flops, "GFLOP/s")


def sdpa():
    q = torch.randn(4, 8, 256, 64)
    k = torch.randn(4, 8, 256, 64)
    v = torch.randn(4, 8, 256, 64)
    flops = 4 * 4 * 8 * 256 * 256 * 64
    F = torch.nn.functional
    report("sdpa_b4_h8_s256_d64", "torch full", median_s(lambda: F.scaled_dot_product_attention(q, k, v)), flops, "GFLOP/s")
    report("sdpa_b4_h8_s256_d64", "torch causal", median_s(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)), flops, "GFLOP/s")


GROUPS = {"matmul": matmul, "elementwise": elementwise, "dispatch": dispatch, "rows": rows,
          "reduce": reduce, "conv": conv, "sdpa": sdpa}

if __name__ == "__main__":
    print(f"torch {torch.__version__}, numpy {np.__version__}, {torch.get_num_threads()} threads")
    for g in sys.argv[1:] or GROUPS:
        GROUPS[g]()
