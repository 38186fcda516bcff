"""The official OpenAI Python client against a tpu-rs server.

Run by tests/openai_client.rs as `python openai_client.py BASE_URL`; prints one line per check
and exits non-zero on the first failure.
"""

import sys

import openai

base = sys.argv[1]
client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused")


def check(name, ok, detail=""):
    print(f"{'ok' if ok else 'FAILED'} {name} {detail}")
    if not ok:
        sys.exit(1)


models = [m.id for m in client.models.list()]
check("models", models == ["smollm2", "all-minilm-l6-v2"], models)

r = client.chat.completions.create(
    model="smollm2",
    messages=[{"role": "user", "content": "What is the capital of France?"}],
    max_tokens=8,
    temperature=0,
)
text = r.choices[0].message.content
check("chat", "Paris" in text and r.usage.completion_tokens >= 1, repr(text))

stream = client.chat.completions.create(
    model="smollm2",
    messages=[{"role": "user", "content": "What is the capital of France?"}],
    max_tokens=8,
    temperature=0,
    stream=True,
    stream_options={"include_usage": True},
)
pieces, usage = [], None
for chunk in stream:
    if chunk.choices and chunk.choices[0].delta.content:
        pieces.append(chunk.choices[0].delta.content)
    if chunk.usage is not None:
        usage = chunk.usage
check("streaming chat", "".join(pieces) == text, repr("".join(pieces)))
check("streaming usage", usage is not None and usage.completion_tokens == r.usage.completion_tokens)

c = client.completions.create(model="smollm2", prompt="The capital of France is", max_tokens=3, temperature=0)
check("completions", len(c.choices) == 1 and c.choices[0].finish_reason in ("stop", "length"), repr(c.choices[0].text))

e = client.embeddings.create(model="all-minilm-l6-v2", input=["A man is eating food.", "The sky is blue."])
check("embeddings", len(e.data) == 2 and len(e.data[0].embedding) == 384)

try:
    client.chat.completions.create(model="smollm2", messages=[{"role": "user", "content": "Hi"}], temperature=5)
    check("bad request raises", False)
except openai.BadRequestError as err:
    check("bad request raises", "temperature" in str(err), str(err)[:80])

try:
    client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "Hi"}])
    check("unknown model raises", False)
except openai.NotFoundError as err:
    check("unknown model raises", "nope" in str(err), str(err)[:80])
