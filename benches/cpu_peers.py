"""PyTorch and numpy on the shapes of benches/cpu_ops.rs, printed side by side so the CPU
benchmarks can be compared with peers measured on the same machine.

    python3 -m venv "$TORCH_VENV" && "$TORCH_VENV"/bin/pip install torch numpy
    "$TORCH_VENV"/bin/python benches/cpu_peers.py [group ...]

Groups: matmul elementwise dispatch rows reduce conv sdpa candle (default: all). `candle` builds
a scratch crate with candle-core from the crate registry (cargo on PATH; set CANDLE_PEER_DIR to
keep its build between runs) and times its whole eager call on the dispatch rows. `--jemalloc`
runs the torch groups a second time with jemalloc preloaded (Debian's libjemalloc2), labelled
`torch+jemalloc`. Each line gives the
median time over timed batches and the same throughput unit the criterion benchmark reports
(GFLOP/s for products, GB/s for memory-bound ops). Threads: 2 unless a case says 1.
"""

import os
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


def label(peer):
    """`peer`, or `peer+jemalloc` in the run that `--jemalloc` starts with jemalloc preloaded."""
    return peer + os.environ.get("CPU_PEERS_SUFFIX", "")


def report(group, name, seconds, work, unit):
    rate = work / seconds / 1e9
    if name.startswith("torch "):
        name = label("torch") + name[len("torch"):]
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
    for name, fn in [
        ("add_4_f32", lambda: a + b),
        ("mul_4_f32", lambda: a * b),
        ("add_scalar_4_f32", lambda: a + 1.0),
        ("exp_4_f32", lambda: torch.exp(a)),
        ("relu_4_f32", lambda: torch.relu(a)),
        ("sum_last_4_f32", lambda: a.sum(-1)),
        ("max_last_4_f32", lambda: a.amax(-1)),
        ("max_all_4_f32", lambda: a.max()),
        ("le_4_f32", lambda: a <= b),
    ]:
        s = median_s(fn, min_time=0.5)
        print(f"{'dispatch':<22} {label('torch') + ' ' + name:<26} {s * 1e6:10.4f} us")
    an, bn = a.numpy(), b.numpy()
    s = median_s(lambda: an + bn, min_time=0.5)
    print(f"{'dispatch':<22} {'numpy add_4_f32':<26} {s * 1e6:10.4f} us")


# candle-core's whole eager call on the dispatch rows, from a scratch crate built here (cargo and
# the crate registry needed; CANDLE_PEER_DIR keeps the build between runs).
CANDLE_TOML = """[package]
name = "candle-peer"
version = "0.1.0"
edition = "2021"

[dependencies]
candle-core = "0.11"
"""

CANDLE_MAIN = r"""use candle_core::{Device, Tensor, D};
use std::time::Instant;

// The median over 15 timed batches of 200000 calls, after 100000 warm-up calls.
fn median_ns(f: &dyn Fn() -> Tensor) -> f64 {
    for _ in 0..100_000 {
        std::hint::black_box(f());
    }
    let mut v: Vec<f64> = (0..15)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..200_000 {
                std::hint::black_box(f());
            }
            t.elapsed().as_nanos() as f64 / 200_000.0
        })
        .collect();
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn main() {
    let dev = Device::Cpu;
    let a = Tensor::new(&[1.0f32, 2.0, 3.0, 4.0], &dev).unwrap();
    let b = Tensor::new(&[5.0f32, 6.0, 7.0, 8.0], &dev).unwrap();
    let rows: Vec<(&str, Box<dyn Fn() -> Tensor>)> = vec![
        ("add_4_f32", Box::new(|| a.add(&b).unwrap())),
        ("mul_4_f32", Box::new(|| a.mul(&b).unwrap())),
        ("add_scalar_4_f32", Box::new(|| (&a + 1.0).unwrap())),
        ("exp_4_f32", Box::new(|| a.exp().unwrap())),
        ("relu_4_f32", Box::new(|| a.relu().unwrap())),
        ("sum_last_4_f32", Box::new(|| a.sum(D::Minus1).unwrap())),
        ("max_last_4_f32", Box::new(|| a.max(D::Minus1).unwrap())),
        ("max_all_4_f32", Box::new(|| a.flatten_all().unwrap().max(0).unwrap())),
        ("le_4_f32", Box::new(|| a.le(&b).unwrap())),
    ];
    for (name, f) in &rows {
        let us = median_ns(f.as_ref()) / 1000.0;
        println!("{:<22} {:<26} {:10.4} us", "dispatch", format!("candle {name}"), us);
    }
}
"""


def candle():
    import shutil
    import subprocess
    import tempfile

    if shutil.which("cargo") is None:
        print(f"{'dispatch':<22} candle: skipped, cargo is not on PATH")
        return
    root = os.environ.get("CANDLE_PEER_DIR") or tempfile.mkdtemp(prefix="candle-peer-")
    os.makedirs(os.path.join(root, "src"), exist_ok=True)
    for rel, text in [("Cargo.toml", CANDLE_TOML), ("src/main.rs", CANDLE_MAIN)]:
        with open(os.path.join(root, rel), "w") as f:
            f.write(text)
    # Its own workspace, so a folder inside another cargo workspace does not adopt it.
    with open(os.path.join(root, "Cargo.toml"), "a") as f:
        f.write("\n[workspace]\n")
    build = subprocess.run(["cargo", "build", "--release", "--quiet"], cwd=root)
    if build.returncode != 0:
        print(f"{'dispatch':<22} candle: skipped, the scratch crate did not build")
        return
    run = subprocess.run([os.path.join(root, "target", "release", "candle-peer")])
    if run.returncode != 0:
        print(f"{'dispatch':<22} candle: the scratch crate failed ({run.returncode})")


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
          "reduce": reduce, "conv": conv, "sdpa": sdpa, "candle": candle}


def jemalloc_rerun(groups):
    """The torch groups once more in a child process with jemalloc preloaded (PyTorch's
    allocations go through malloc; jemalloc changes the memory-bound rows)."""
    import ctypes.util
    import subprocess

    lib = ctypes.util.find_library("jemalloc")
    if lib is None:
        print("torch+jemalloc: skipped, no jemalloc library found (Debian: libjemalloc2)")
        return
    env = dict(os.environ, LD_PRELOAD=lib, CPU_PEERS_SUFFIX="+jemalloc")
    torch_groups = [g for g in groups if g != "candle"]
    subprocess.run([sys.executable, os.path.abspath(__file__), *torch_groups], env=env, check=False)


if __name__ == "__main__":
    args = sys.argv[1:]
    jemalloc = "--jemalloc" in args
    groups = [a for a in args if a != "--jemalloc"] or list(GROUPS)
    if not os.environ.get("CPU_PEERS_SUFFIX"):
        print(f"torch {torch.__version__}, numpy {np.__version__}, {torch.get_num_threads()} threads,"
              f" load average {os.getloadavg()[0]:.2f}")
    for g in groups:
        GROUPS[g]()
    if jemalloc:
        jemalloc_rerun(groups)
