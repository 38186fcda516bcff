"""Peers of the compiled path (benches/graph.rs) on the CPU with 2 threads: PyTorch eager,
torch.compile (default backend, inductor) and jax.jit, each from its own virtual environment:

    python benches/graph_peers.py torch     # in a virtual environment with torch
    python benches/graph_peers.py jax       # in a virtual environment with jax and jaxlib (CPU)

A peer whose module is missing is skipped with a line saying why. Rows, all f32:

  mlp_train_step_b128   MLP 784-1024-1024-10, batch 128: forward, cross-entropy, backward and an
                        SGD update (lr 0.01, no momentum); parameters initialised like nn.Linear.
                        torch eager uses torch.optim.SGD. torch.compile compiles one function doing
                        the forward, the loss, backward() and the update as in-place writes under
                        no_grad: by default backward() breaks the graph (two graphs, the backward
                        compiled by AOTAutograd); "1 graph" sets torch._dynamo.config
                        .trace_autograd_ops and fullgraph=True, so the whole step is one graph.
                        jax.jit is (params, x, y) -> (params, loss), the parameters donated.
  block_fwd_b4_s256     Pre-LN transformer block, d_model 512, 8 heads, seq 256, batch 4, MLP 2048,
                        exact (erf) GELU, no mask, no dropout: x + attn(LN(x)), then + MLP(LN(.)).
                        torch runs it under no_grad, with F.scaled_dot_product_attention.
  block_fwd_bwd_b4_s256 The same block, loss = sum of the output, gradients of all parameters.
  first_call            Compile and first run of each compiled function, each in a fresh process
                        (fresh inductor cache; JAX's persistent cache is off by default), timed
                        from just before the first call, inputs and parameters already built.

Each steady-state line: the median seconds per call over timed batches (after warm-up), the
fastest batch, the noise (p90 - p10) / median over the batches, the process CPU time / wall time
and the threads that did work (>10% of the wall time) while timing. Threads: the process pins
itself to 2 CPUs (like taskset -c 0,1) before any library starts a pool, OMP_NUM_THREADS=2,
torch.set_num_threads(2); XLA sizes its CPU pool from the CPUs the process may use, so the
pinning is what limits JAX. Run with nothing else busy (the header gives the load average):
torch's OpenMP threads wait on each other badly when the CPUs are shared.
"""

import atexit
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:2])  # Linux, as is cpu_ticks
os.environ["OMP_NUM_THREADS"] = "2"
os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="graph-peers-inductor-")
atexit.register(shutil.rmtree, os.environ["TORCHINDUCTOR_CACHE_DIR"], True)

B, D, H, S, FF = 4, 512, 8, 256, 2048


def cpu_ticks():
    """CPU ticks (user + system) of each thread of this process, by thread id."""
    ticks = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:  # the thread has ended
            continue
        ticks[tid] = int(fields[11]) + int(fields[12])
    return ticks


def measure(fn, min_time=3.0, batch_time=0.1, min_batches=15):
    """Per-call seconds of timed batches of `fn`, CPU time / wall time, and busy threads."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < max(0.5, 0.2 * min_time):
        fn()
    t0 = time.perf_counter()
    fn()
    per = max(1, round(batch_time / max(time.perf_counter() - t0, 1e-7)))
    times, before, start = [], cpu_ticks(), time.perf_counter()
    while len(times) < min_batches or time.perf_counter() - start < min_time:
        t0 = time.perf_counter()
        for _ in range(per):
            fn()
        times.append((time.perf_counter() - t0) / per)
    wall, after = time.perf_counter() - start, cpu_ticks()
    hz = os.sysconf("SC_CLK_TCK")
    used = [(after[t] - before.get(t, 0)) / hz for t in after]
    return times, sum(used) / wall, sum(u > 0.1 * wall for u in used)


def report(group, name, times, cpu, busy):
    med = statistics.median(times)
    dec = statistics.quantiles(times, n=10)
    print(f"{group:<22} {name:<26} {med * 1e3:10.4f} ms  min {min(times) * 1e3:10.4f} ms  "
          f"noise {(dec[8] - dec[0]) / med:6.1%}  cpu/wall {cpu:4.2f}  threads {busy}  "
          f"load {os.getloadavg()[0]:.1f}", flush=True)


def torch_cases():
    import torch
    import torch.nn.functional as F
    from torch import nn

    torch.set_num_threads(2)
    torch.manual_seed(0)

    def mlp(compiled, one_graph=False):
        model = nn.Sequential(nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
                              nn.Linear(1024, 10))
        x, y = torch.randn(128, 784), torch.randint(0, 10, (128,))
        if not compiled:
            opt = torch.optim.SGD(model.parameters(), lr=0.01)

            def step():
                opt.zero_grad()
                F.cross_entropy(model(x), y).backward()
                opt.step()
            return step
        params = list(model.parameters())

        @torch._dynamo.config.patch(trace_autograd_ops=one_graph)
        @torch.compile(fullgraph=one_graph)
        def step():
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            with torch.no_grad():
                for p in params:
                    p.sub_(p.grad, alpha=0.01)
                    p.grad = None
            return loss.detach()
        return step

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(D), nn.LayerNorm(D)
            self.qkv, self.out = nn.Linear(D, 3 * D), nn.Linear(D, D)
            self.fc1, self.fc2 = nn.Linear(D, FF), nn.Linear(FF, D)

        def forward(self, x):
            q, k, v = self.qkv(self.ln1(x)).view(B, S, 3, H, D // H).permute(2, 0, 3, 1, 4)
            a = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(B, S, D)
            x = x + self.out(a)
            return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))

    def block(compiled, backward):
        model, x = Block(), torch.randn(B, S, D)
        run = torch.compile(model) if compiled else model
        if backward:
            def step():
                model.zero_grad(set_to_none=True)
                run(x).sum().backward()
            return step

        def fwd():
            with torch.no_grad():
                run(x)
        return fwd

    cases = []
    for name, c in [("torch eager", False), ("torch.compile", True)]:
        cases += [("mlp_train_step_b128", name, lambda c=c: mlp(c)),
                  ("block_fwd_b4_s256", name, lambda c=c: block(c, False)),
                  ("block_fwd_bwd_b4_s256", name, lambda c=c: block(c, True))]
    cases.append(("mlp_train_step_b128", "torch.compile 1 graph", lambda: mlp(True, True)))
    return f"torch {torch.__version__}, {torch.get_num_threads()} threads", cases


def jax_cases():
    import jax
    import jax.numpy as jnp
    import jaxlib

    def linear_init(key, fan_in, fan_out):
        bound = fan_in ** -0.5
        kw, kb = jax.random.split(key)
        return (jax.random.uniform(kw, (fan_in, fan_out), jnp.float32, -bound, bound),
                jax.random.uniform(kb, (fan_out,), jnp.float32, -bound, bound))

    def mlp():
        keys = jax.random.split(jax.random.key(0), 5)
        params = [linear_init(k, i, o) for k, (i, o) in zip(keys, [(784, 1024), (1024, 1024), (1024, 10)])]
        x = jax.random.normal(keys[3], (128, 784), jnp.float32)
        y = jax.random.randint(keys[4], (128,), 0, 10)

        def loss_fn(params, x, y):
            for i, (w, b) in enumerate(params):
                x = x @ w + b
                x = jax.nn.relu(x) if i < len(params) - 1 else x
            return -jnp.take_along_axis(jax.nn.log_softmax(x), y[:, None], axis=1).mean()

        def train(params, x, y):
            loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
            return jax.tree.map(lambda p, g: p - 0.01 * g, params, grads), loss
        step, state = jax.jit(train, donate_argnums=0), [params]

        def run():
            state[0], loss = step(state[0], x, y)
            jax.block_until_ready((state[0], loss))
        return run

    def layer_norm(x, g, b):
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        return (x - mu) * jax.lax.rsqrt(var + 1e-5) * g + b

    def forward(p, x):
        qkv = (layer_norm(x, *p["ln1"]) @ p["qkv"][0] + p["qkv"][1]).reshape(B, S, 3, H, D // H)
        q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
        a = jax.nn.softmax(jnp.einsum("bqhd,bkhd->bhqk", q, k) * (D // H) ** -0.5, axis=-1)
        x = x + jnp.einsum("bhqk,bkhd->bqhd", a, v).reshape(B, S, D) @ p["out"][0] + p["out"][1]
        h = jax.nn.gelu(layer_norm(x, *p["ln2"]) @ p["fc1"][0] + p["fc1"][1], approximate=False)
        return x + h @ p["fc2"][0] + p["fc2"][1]

    def block(backward):
        keys = jax.random.split(jax.random.key(0), 5)
        p = {n: linear_init(k, i, o) for k, (n, i, o) in
             zip(keys, [("qkv", D, 3 * D), ("out", D, D), ("fc1", D, FF), ("fc2", FF, D)])}
        p["ln1"] = p["ln2"] = (jnp.ones(D), jnp.zeros(D))
        x = jax.random.normal(keys[4], (B, S, D), jnp.float32)
        fn = jax.jit(jax.grad(lambda p, x: forward(p, x).sum()) if backward else forward)
        return lambda: jax.block_until_ready(fn(p, x))

    cases = [("mlp_train_step_b128", "jax.jit", mlp),
             ("block_fwd_b4_s256", "jax.jit", lambda: block(False)),
             ("block_fwd_bwd_b4_s256", "jax.jit", lambda: block(True))]
    return f"jax {jax.__version__}, jaxlib {jaxlib.__version__}, {jax.devices()}", cases


PEERS = {"torch": torch_cases, "jax": jax_cases}


def first_call(peer, index):
    """In a fresh process: seconds of the first call of compiled case `index` of `peer`."""
    _, cases = PEERS[peer]()
    fn = cases[index][2]()
    t0 = time.perf_counter()
    fn()
    print(time.perf_counter() - t0)


def main(peers):
    for peer in peers:
        try:
            header, cases = PEERS[peer]()
        except ImportError as e:
            print(f"{peer}: skipped ({e})", flush=True)
            continue
        print(f"# {header}; CPUs allowed {len(os.sched_getaffinity(0))}, OMP_NUM_THREADS="
              f"{os.environ['OMP_NUM_THREADS']}, load average {os.getloadavg()[0]:.2f}", flush=True)
        for group, name, make in cases:
            report(group, name, *measure(make()))
        for i, (group, name, _) in enumerate(cases):
            if "eager" in name:
                continue
            out = subprocess.run([sys.executable, __file__, "--first", peer, str(i)],
                                 capture_output=True, text=True)
            if out.returncode:
                print(f"{'first_call':<22} {name} {group}: failed\n{out.stderr[-2000:]}", flush=True)
                continue
            s = float(out.stdout.split()[-1])
            print(f"{'first_call':<22} {name + ' ' + group:<49} {s * 1e3:10.1f} ms  (compile + first run)",
                  flush=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--first"]:
        first_call(sys.argv[2], int(sys.argv[3]))
    else:
        main(sys.argv[1:] or list(PEERS))
