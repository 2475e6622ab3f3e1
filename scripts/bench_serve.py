"""The server under concurrent load, as users drive it: the official openai client against a real
`specdec serve` on loopback (issue 14's goals).

1. Throughput: 1, 4 and 8 concurrent clients, each streaming chat completions (96 tokens, T=0; every
   group serves the same 16 prompts, four of each task); total tokens/s, p50 time per output token and time to first token.
   Each also with speculation off (gamma 0), to show what speculation adds at each load.
2. A mixed load: 16 clients x 200 requests (streamed and not, seeded and greedy, one in ten
   abandoned by its client): lost, crossed and hung requests, and every answer compared with the
   same request run alone on an idle server.

3. What a launch costs: seconds from starting the process until /health answers, and the server's
   resident memory (peak and now) after the load, against the target file's size.

    .venv/bin/python scripts/bench_serve.py [--target smollm2-135m|FILE.gguf] [--clients 1,4,8] [--port 8766]
        [--max-batch 8] [--row-budget 16] [--weights auto] [--temperature 0] [--mixed 200] [--out FILE]
"""

import argparse
import json
import random
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
from openai import OpenAI

from specdec.tasks.prompts import task_prompts

MODEL = "smollm2-135m"


def wait_ready(base: str, proc) -> float:
    """Seconds until /health answers."""
    start = time.perf_counter()
    for _ in range(3000):
        if proc.poll() is not None:
            sys.exit("server exited")
        try:
            if httpx.get(base + "/health", timeout=1).status_code == 200:
                return time.perf_counter() - start
        except httpx.HTTPError:
            time.sleep(0.1)
    sys.exit("server did not start")


def resident_mb(pid: int) -> dict:
    """The process's resident memory now and at its peak (VmRSS, VmHWM), MB (10^6 bytes, as the file's size)."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return {key: int(fields[key].split()[0]) * 1024 / 1e6 for key in ("VmRSS", "VmHWM")}


def percentile(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, round(q * (len(values) - 1)))]


def stream_chat(client: OpenAI, text: str, gamma, max_tokens: int = 96, temperature: float = 0.0) -> dict:
    start, first, tokens = time.perf_counter(), None, 0
    stream = client.chat.completions.create(model=MODEL, stream=True, max_tokens=max_tokens, temperature=temperature,
                                            messages=[{"role": "user", "content": text}],
                                            extra_body={"gamma": gamma, "ignore_eos": True})
    for chunk in stream:
        if first is None and chunk.choices and chunk.choices[0].delta.content:
            first = time.perf_counter()
        if chunk.usage:
            tokens = chunk.usage.completion_tokens
    end = time.perf_counter()
    return {"seconds": end - start, "tokens": tokens, "ttft": (first or end) - start}


def throughput(base: str, prompts: list[str], clients: int, gamma, temperature: float = 0.0, max_tokens: int = 96) -> dict:
    """Every group serves the same prompts: client i takes prompts i, i + clients, ..."""
    def worker(i):
        client = OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=600)
        return [stream_chat(client, text, gamma, max_tokens, temperature) for text in prompts[i::clients]]

    start = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        runs = [r for rs in pool.map(worker, range(clients)) for r in rs]
    wall = time.perf_counter() - start
    per_token = [r["seconds"] / max(r["tokens"], 1) for r in runs]
    return {"tokens_per_s": sum(r["tokens"] for r in runs) / wall, "p50_tpot_ms": 1e3 * statistics.median(per_token),
            "p50_ttft_ms": 1e3 * statistics.median(r["ttft"] for r in runs), "requests": len(runs), "wall": wall}


def ask(base: str, request: dict, stream: bool, timeout: float) -> str:
    body = {"model": MODEL, "max_tokens": 24, "messages": [{"role": "user", "content": request["text"]}],
            "temperature": request["temperature"], "stream": stream}
    if request["seed"] is not None:
        body["seed"] = request["seed"]
    with httpx.Client(timeout=timeout) as http:
        if not stream:
            r = http.post(base + "/v1/chat/completions", json=body)
            r.raise_for_status()
            return r.json()["choices"][0]["message"]["content"]
        pieces = []
        with http.stream("POST", base + "/v1/chat/completions", json=body) as r:
            r.raise_for_status()
            for line in r.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    chunk = json.loads(line[6:])
                    if chunk.get("choices"):
                        pieces.append(chunk["choices"][0]["delta"].get("content") or "")
        return "".join(pieces)


def mixed_load(base: str, prompts: list[str], clients: int, total: int, seed: int = 0) -> dict:
    rng = random.Random(seed)
    distinct = [{"text": prompts[i % len(prompts)], "temperature": 0.0 if i % 3 == 0 else 0.8,
                 "seed": None if i % 3 == 0 else 1000 + i} for i in range(24)]
    alone = [ask(base, r, stream=False, timeout=300) for r in distinct]  # the reference: idle server, one at a time
    plan = [(rng.randrange(len(distinct)), rng.random() < 0.5, rng.random() < 0.1) for _ in range(total)]
    outcome = {"ok": 0, "abandoned": 0, "lost": 0, "crossed": 0, "hung": 0}
    lock = threading.Lock()

    def one(item):
        index, stream, abandon = item
        try:
            text = ask(base, distinct[index], stream, timeout=0.3 if abandon else 300)
        except httpx.TimeoutException:
            key = "abandoned" if abandon else "hung"
        except httpx.HTTPError:
            key = "lost"
        else:
            key = "ok" if text == alone[index] else "crossed"
        with lock:
            outcome[key] += 1

    start = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(one, plan))
    outcome["seconds"] = time.perf_counter() - start
    for _ in range(100):  # abandoned requests must not keep running
        if httpx.get(base + "/health").json()["queue_depth"] == 0:
            break
        time.sleep(0.1)
    outcome["queue_depth_after"] = httpx.get(base + "/health").json()["queue_depth"]
    return outcome


def main() -> None:
    global MODEL
    parser = argparse.ArgumentParser()
    parser.add_argument("--target", default=MODEL, help="the server's --target: a built-in name or a .gguf file")
    parser.add_argument("--clients", default="1,4,8", help="the concurrent client counts to measure")
    parser.add_argument("--port", type=int, default=8766)
    parser.add_argument("--max-batch", type=int, default=8)
    parser.add_argument("--row-budget", type=int, default=16)
    parser.add_argument("--prompts", type=int, default=4, help="prompts per task (code, summarise, translate, chat)")
    parser.add_argument("--max-tokens", type=int, default=96, help="tokens each throughput request generates")
    parser.add_argument("--mixed", type=int, default=200, help="requests in the mixed load (0: skip it)")
    parser.add_argument("--temperature", type=float, default=0.0, help="the throughput groups' temperature (unseeded)")
    parser.add_argument("--weights", default="auto", help="the server's --weights (float: bf16 on the tiles with AMX)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    MODEL = args.target
    clients_list = [int(c) for c in args.clients.split(",")]
    base = f"http://127.0.0.1:{args.port}"
    proc = subprocess.Popen([sys.executable, "-m", "specdec", "serve", "--target", args.target, "--port", str(args.port),
                             "--served-model-name", MODEL, "--max-queue", "64",
                             "--max-batch", str(args.max_batch), "--row-budget", str(args.row_budget),
                             "--weights", args.weights])
    lines = []

    def say(line: str) -> None:
        print(line, flush=True)
        lines.append(line)

    try:
        ready = wait_ready(base, proc)
        size = Path(args.target).stat().st_size / 1e6 if Path(args.target).is_file() else None
        say(f"launch: /health answered {ready:.1f} s after the process started"
            + (f"; target file {size:.0f} MB" if size else ""))
        tasks = ("code", "summarise", "translate", "chat")
        prompts = [p.text for task in tasks for p in task_prompts(task, args.prompts, seed=7)]
        stream_chat(OpenAI(base_url=base + "/v1", api_key="unused"), prompts[0], "auto", 8)  # warm-up
        say(f"specdec serve --max-batch {args.max_batch} --row-budget {args.row_budget}; openai client, "
            f"streamed chat, {args.max_tokens} tokens, T={args.temperature:g}, ignore_eos")
        say("| clients | gamma | requests | total tokens/s | vs 1 client (auto) | vs 1 client (plain) "
            "| p50 time per output token | p50 TTFT |")
        say("|---|---|---|---|---|---|---|---|")
        one = plain = None
        for clients, gamma in [(c, g) for c in clients_list for g in (0, "auto")]:
            r = throughput(base, prompts, clients, gamma, args.temperature, args.max_tokens)
            if clients == 1:
                one, plain = (r, plain) if gamma == "auto" else (one, r)
            ratio = f"{r['tokens_per_s'] / one['tokens_per_s']:.2f}x" if one else "-"
            ratio_plain = f"{r['tokens_per_s'] / plain['tokens_per_s']:.2f}x"
            say(f"| {clients} | {gamma} | {r['requests']} | {r['tokens_per_s']:.1f} | {ratio} | {ratio_plain} | "
                f"{r['p50_tpot_ms']:.0f} ms | {r['p50_ttft_ms']:.0f} ms |")
        if args.mixed:
            m = mixed_load(base, prompts, 16, args.mixed)
            say(f"\nmixed load: 16 clients x {args.mixed} requests (streamed and not, seeded T=0.8 and greedy, 1 in 10 "
                f"abandoned after 0.3 s) in {m['seconds']:.0f} s: ok {m['ok']}, abandoned {m['abandoned']}, "
                f"lost {m['lost']}, crossed (differs from the same request alone) {m['crossed']}, hung {m['hung']}; "
                f"queue depth afterwards {m['queue_depth_after']}")
        memory = resident_mb(proc.pid)
        say(f"\nresident memory after the load: {memory['VmRSS']:.0f} MB now, {memory['VmHWM']:.0f} MB at the peak"
            + (f" ({memory['VmHWM'] / size:.2f}x the file)" if size else ""))
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
