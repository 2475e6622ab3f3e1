"""Plain decoding and prefill on GGUF files, specdec against llama.cpp's llama-bench, side by side: for each
file llama-bench's pp512 and tg64 (2 threads, -r repeats), then specdec's prefill of 512 random ids and 64
greedy tokens from a one-token prompt (tg64's empty context), median (min-max) of the repeats, as a markdown
table. --depth N decodes after N positions of context instead (llama-bench's -d N: tg64 @ dN), where the KV
cache's reads join the weights'.

    .venv/bin/python scripts/bench_gguf_plain.py models/llama-1.7b-Q8_0.gguf models/llama-1.7b-Q4_K.gguf \
        [--repeats 3] [--depth 0] [--llama-bench PATH]

llama-bench: --llama-bench, else SPECDEC_LLAMA_BENCH, else beside SPECDEC_LLAMA_SERVER, else PATH (built from
the llama.cpp sources in llama-cpp-python's source package: docs/usage.md). Without one, specdec's alone.
The files: `specdec make-model random|padded ...`.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import time
from pathlib import Path

import torch

from specdec.api import SpecDec
from specdec.config import SamplingParams, SpecConfig


def llama_bench_binary(given: str | None) -> str | None:
    if given:
        return given
    if os.environ.get("SPECDEC_LLAMA_BENCH"):
        return os.environ["SPECDEC_LLAMA_BENCH"]
    server = os.environ.get("SPECDEC_LLAMA_SERVER")
    if server and (Path(server).parent / "llama-bench").exists():
        return str(Path(server).parent / "llama-bench")
    return shutil.which("llama-bench")


def llama_bench(binary: str, path: Path, repeats: int, threads: int, depth: int = 0) -> dict[str, tuple[float, float]]:
    """{"pp512": (mean, sd), "tg64": (mean, sd)} as llama-bench reports them (after `depth` positions)."""
    out = subprocess.run([binary, "-m", str(path), "-t", str(threads), "-p", "512", "-n", "64", "-r", str(repeats),
                          "-d", str(depth), "-o", "json"], capture_output=True, text=True, check=True).stdout
    result = {}
    for test in json.loads(out):
        name = "pp512" if test["n_prompt"] else "tg64"
        result[name] = (test["avg_ts"], test["stddev_ts"])
    return result


def specdec_rates(path: Path, repeats: int, depth: int = 0) -> tuple[str, list[float], list[float]]:
    """(path label, prefill tok/s of 512 ids, decoding tok/s of 64 greedy tokens) per repeat. The tokens are
    decoded after a one-token prompt, as llama-bench's tg64 decodes from an empty context, or after `depth`
    ids (its -d): each step then also reads that many positions of KV cache; the 512 ids are prefilled
    after the `depth` too."""
    sd = SpecDec(target=str(path), drafter="none")
    engine, backend = sd.engine, sd.engine.target
    ids = torch.randint(100, min(40000, backend.vocab_size), (depth + 512,), generator=torch.Generator().manual_seed(0))
    prefill, decode, label = [], [], ""
    for _ in range(repeats):
        backend.reset()
        if depth:
            backend.forward(ids[:depth])
        start = time.perf_counter()
        backend.forward(ids[depth:])
        prefill.append(512 / (time.perf_counter() - start))
        backend.reset()
        run = engine.generate(ids[: max(1, depth)].tolist(), SamplingParams(temperature=0),
                              SpecConfig(gamma=0, max_new_tokens=64, stop_at_eos=False)).run()
        decode.append(run.stats.tokens_per_second)
        label = run.stats.path
    return label, prefill, decode


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.1f} ({min(values):.1f}–{max(values):.1f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--depth", type=int, default=0, help="positions of context before the decoded tokens")
    parser.add_argument("--llama-bench", default=None)
    args = parser.parse_args()
    threads = torch.get_num_threads()
    binary = llama_bench_binary(args.llama_bench)
    if args.depth:
        print(f"after {args.depth} positions of context (llama-bench -d {args.depth})")
    print("| file | size GB | specdec path | llama.cpp pp512 | specdec pp512 | × | llama.cpp tg64 | specdec tg64 | × |")
    print("|---|---|---|---|---|---|---|---|---|")
    for path in args.files:
        peer = llama_bench(binary, path, args.repeats, threads, args.depth) if binary else {}
        label, prefill, decode = specdec_rates(path, args.repeats, args.depth)
        cells = []
        for name, ours in (("pp512", prefill), ("tg64", decode)):
            if name in peer:
                mean, sd = peer[name]
                cells += [f"{mean:.1f} ± {sd:.1f}", spread(ours), f"{statistics.median(ours) / mean:.2f}×"]
            else:
                cells += ["–", spread(ours), "–"]
        print(f"| {path.name} | {path.stat().st_size / 1e9:.2f} | `{label}` | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
