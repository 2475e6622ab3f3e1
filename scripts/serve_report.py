"""Issue 6 report: start `specdec serve` on the built-in model, then measure per-token latency
with and without speculation (p50/p95 over requests), run a small concurrent load, and print a
streamed chat completion from the official openai client.

    .venv/bin/python scripts/serve_report.py [--requests 12] [--port 8765]
"""

import argparse
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from bench_serve import percentile, wait_ready  # this folder's: one way to wait and to rank
from openai import OpenAI

from specdec.prompts import task_prompts


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=12)
    parser.add_argument("--port", type=int, default=8765)
    args = parser.parse_args()
    base = f"http://127.0.0.1:{args.port}"
    proc = subprocess.Popen([sys.executable, "-m", "specdec", "serve", "--port", str(args.port),
                             "--max-queue", "32", "--spec-off-depth", "32"])
    try:
        wait_ready(base, proc)
        client = OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=300)
        prompts = [p.text for task in ("code", "summarise", "translate", "chat")
                   for p in task_prompts(task, max(1, args.requests // 4), seed=7)]
        per_token = {"speculative (gamma auto)": [], "plain (gamma 0)": []}
        for text in prompts:  # interleaved: each prompt with and without speculation
            for label, gamma in (("speculative (gamma auto)", "auto"), ("plain (gamma 0)", 0)):
                start = time.perf_counter()
                first = None
                tokens = 0
                stream = client.chat.completions.create(model="smollm2-135m", stream=True, max_tokens=96,
                                                        temperature=0, messages=[{"role": "user", "content": text}],
                                                        extra_body={"gamma": gamma})
                for chunk in stream:
                    if first is None and chunk.choices[0].delta.content:
                        first = time.perf_counter()
                    if chunk.usage:
                        tokens = chunk.usage.completion_tokens
                total = time.perf_counter() - start
                per_token[label].append(total / max(tokens, 1))
        for label, values in per_token.items():
            print(f"{label}: time per output token p50 {percentile(values, 0.5) * 1e3:.1f} ms, "
                  f"p95 {percentile(values, 0.95) * 1e3:.1f} ms over {len(values)} requests")
        ratio = [b / a for a, b in zip(per_token["speculative (gamma auto)"], per_token["plain (gamma 0)"])]
        print("time to first token is part of each request's time; per-request speedup: "
              f"median {statistics.median(ratio):.2f}x (min {min(ratio):.2f}, max {max(ratio):.2f})")

        def ask(i):
            out = client.completions.create(model="smollm2-135m", prompt=f"Count: {i}, {i + 1},", max_tokens=16,
                                            temperature=1.0, seed=i, extra_body={"gamma": 2})
            return out.choices[0].text

        expected = [ask(i) for i in range(16)]
        start = time.perf_counter()
        with ThreadPoolExecutor(8) as pool:
            got = list(pool.map(ask, range(16)))
        print(f"load: 8 clients, 16 requests in {time.perf_counter() - start:.1f} s; "
              f"lost {16 - len(got)}, crossed {sum(a != b for a, b in zip(got, expected))}")

        print("\ntranscript (openai client, streamed chat completion):")
        print(">>> user: Translate to German: The file could not be opened.")
        print("<<< assistant: ", end="", flush=True)
        stream = client.chat.completions.create(model="smollm2-135m", stream=True, max_tokens=48, temperature=0,
                                                messages=[{"role": "user",
                                                           "content": "Translate to German: The file could not be opened."}])
        for chunk in stream:
            print(chunk.choices[0].delta.content or "", end="", flush=True)
            if chunk.model_extra.get("speculation"):
                print(f"\n[speculation: {chunk.model_extra['speculation']}]")
    finally:
        proc.terminate()
        proc.wait(timeout=30)


if __name__ == "__main__":
    main()
