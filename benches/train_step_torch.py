"""The training step of benches/train_step.rs in PyTorch eager, on the same machine:
MLP 784-1024-1024-10, batch 128, f32, SGD, cross-entropy, 2 threads.

    python3 -m venv "$TORCH_VENV" && "$TORCH_VENV"/bin/pip install torch
    "$TORCH_VENV"/bin/python benches/train_step_torch.py

Prints the median step time over timed batches.
"""

import statistics
import time

import torch

torch.set_num_threads(2)
torch.manual_seed(0)
model = torch.nn.Sequential(
    torch.nn.Linear(784, 1024), torch.nn.ReLU(),
    torch.nn.Linear(1024, 1024), torch.nn.ReLU(),
    torch.nn.Linear(1024, 10),
)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(128, 784)
y = torch.randint(0, 10, (128,))


def step():
    opt.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    return loss


for _ in range(20):
    step()
times = []
for _ in range(20):
    t0 = time.perf_counter()
    for _ in range(10):
        step()
    times.append((time.perf_counter() - t0) / 10)
print(f"pytorch {torch.__version__} eager train step (MLP 784-1024-1024-10, b128, f32, SGD, 2 threads): "
      f"median {statistics.median(times) * 1e3:.3f} ms, min {min(times) * 1e3:.3f} ms, max {max(times) * 1e3:.3f} ms")
