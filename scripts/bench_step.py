"""The cost of one target pass by the number of positions it scores, on each bf16 path of the lean
backend, side by side and interleaved: v(n) = cost(n positions) / cost(1) for n = 1 .. 64, one
position against the memory bound, and prefill tokens/s on a long prompt; then plain decoding
against transformers' generate().

    .venv/bin/python scripts/bench_step.py [--target smollm2-135m] [--repeats 15] [--prefill 300,1500]
        [--rows 1,2,4,8,16,32,64] [--no-plain] [--gguf]

Paths: "lean+tiles" (kernels.cpp on AMX tiles, where the CPU has them), "lean+kernels" (kernels.cpp's
AVX-512 BF16 dot products, passes of up to 16 rows; longer ones fall to oneDNN), "lean" (oneDNN's
pre-packed products, the path without kernels.cpp). With --gguf also the target's own GGUF blocks with
int8 activations (a float32 copy of the model): "gguf-int8 packed" (quant.cpp's kernels on the blocks
repacked at load: AVX-512 VNNI / AMX-INT8 where the CPU has them, else AVX2) and "gguf-int8 avx2" (its
AVX2 kernels on the file's blocks as they are). A .gguf target runs on these two only (its layers hold
no float weights), the memory bound its file's size.
"""

import argparse
import statistics
import time
from pathlib import Path

import torch

from specdec.backends import LeanBackend
from specdec.backends.compute_path import choose_path
from specdec.bench.peers import hf_generate
from specdec.config import SamplingParams, SpecConfig
from specdec.decoding.engine import SpeculativeEngine
from specdec.gguf_file import is_gguf_path
from specdec.modeling import kernels, quant
from specdec.models import load_model
from specdec.tasks.prompts import task_prompts


def bandwidth(size_mb: int = 512, repeats: int = 10) -> tuple[float, float]:
    """(read GB/s by a sum over a large buffer, copy GB/s counting bytes read + written)."""
    src = torch.ones(size_mb * 2**20 // 4)
    dst = torch.empty_like(src)
    reads, copies = [], []
    for _ in range(repeats):
        t = time.perf_counter()
        src.sum()
        reads.append(time.perf_counter() - t)
        t = time.perf_counter()
        dst.copy_(src)
        copies.append(time.perf_counter() - t)
    nbytes = src.numel() * 4
    return nbytes / min(reads) / 1e9, 2 * nbytes / min(copies) / 1e9


def step_times(backend, context: torch.Tensor, positions: int, repeats: int) -> list[float]:
    backend.reset()
    backend.prefill(context)
    times = []
    draft = torch.randint(0, min(1000, backend.vocab_size), (positions,), generator=torch.Generator().manual_seed(positions))
    for _ in range(repeats):
        t = time.perf_counter()
        backend.forward(draft)
        times.append(time.perf_counter() - t)
        backend.rollback(context.numel())
    return times


def prefill_seconds(backend, prompt: torch.Tensor) -> float:
    backend.reset()
    t = time.perf_counter()
    backend.append(prompt)
    return time.perf_counter() - t


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--target", default="smollm2-135m")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--rows", default="1,2,4,8,16,32,64")
    parser.add_argument("--prefill", default="1500", help="prompt lengths for the prefill rate, comma-separated (0: skip)")
    parser.add_argument("--no-plain", action="store_true", help="skip plain decoding against generate()")
    parser.add_argument("--gguf", action="store_true", help="also the GGUF blocks with int8 activations (packed, AVX2)")
    args = parser.parse_args()
    rows = [int(r) for r in args.rows.split(",")]
    on_file = is_gguf_path(args.target)
    loaded = load_model(args.target, "float32" if on_file else "bfloat16")
    weight_bytes = (Path(args.target).stat().st_size if on_file
                    else sum(p.numel() * p.element_size() for p in loaded.model.parameters()))
    read_gbs, copy_gbs = bandwidth()
    bound_ms = weight_bytes / (read_gbs * 1e9) * 1e3
    print(f"weights {weight_bytes / 1e6:.0f} MB; read bandwidth {read_gbs:.1f} GB/s, copy {copy_gbs:.1f} GB/s; "
          f"memory bound of one step {bound_ms:.1f} ms")
    backends = {}
    if not on_file:
        t0 = time.perf_counter()
        kern = kernels.load()
        tiles = "yes" if kern and kern.tiles else (kern.tiles_reason if kern else "no")
        print(f"kernels.cpp: {'loaded' if kern else 'unavailable: ' + str(kernels.unavailable_reason())} in "
              f"{time.perf_counter() - t0:.1f} s; AMX tiles: {tiles}")
        if kern is not None and kern.tiles:
            backends["lean+tiles"] = LeanBackend(loaded.model)
        if kern is not None:
            backends["lean+kernels"] = LeanBackend(loaded.model, use_tiles=False)
        backends["lean (oneDNN)"] = LeanBackend(loaded.model, use_kernels=False)
    if args.gguf or on_file:
        loaded32 = loaded if on_file else load_model(args.target, "float32")
        if quant.packed_int8():
            backends["gguf-int8 packed"] = LeanBackend(loaded32.model, gguf=loaded32.gguf, int8_activations=True)
        on_file_layout = choose_path(loaded32.model.config.model_type, torch.float32, torch.device("cpu"), "gguf",
                                     int8=True, repack=False)
        backends["gguf-int8 avx2"] = LeanBackend(loaded32.model, gguf=loaded32.gguf, compute=on_file_layout)
    text = "The quick brown fox jumps over the lazy dog. " * 200
    all_ids = torch.tensor(loaded.tokenizer(text)["input_ids"])
    context = all_ids[:200]
    times: dict[tuple[str, int], list[float]] = {}
    for n in rows:  # warm-up, every shape once
        for backend in backends.values():
            step_times(backend, context, n, 2)
    for n in rows:
        for _ in range(3):  # interleave the paths
            for name, backend in backends.items():
                times.setdefault((name, n), []).extend(step_times(backend, context, n, max(1, args.repeats // 3)))
    print(f"\none pass of n positions after a {context.numel()}-token context, median ms (IQR), v(n) = cost(n) / cost(1):")
    print("| n | " + " | ".join(backends) + " |")
    print("|---|" + "---|" * len(backends))
    for n in rows:
        cells = []
        for name in backends:
            med = statistics.median(times[name, n]) * 1e3
            q = statistics.quantiles(times[name, n], n=4)
            base = statistics.median(times[name, rows[0]]) * 1e3
            cells.append(f"{med:.1f} ({q[0] * 1e3:.1f}-{q[2] * 1e3:.1f}) v={med / base:.2f}")
        print(f"| {n} | " + " | ".join(cells) + " |")
    if 1 in rows:
        for name in backends:
            med = statistics.median(times[name, 1]) * 1e3
            print(f"{name}: one position {med:.1f} ms = {med / bound_ms:.2f}x the memory bound")
    lengths = [int(n) for n in args.prefill.split(",") if int(n) > 0]
    if lengths:
        for backend in backends.values():  # warm-up
            prefill_seconds(backend, all_ids[:64])
    for length in lengths:
        prompt = all_ids[:length]
        seconds = {name: [] for name in backends}
        for _ in range(3):
            for name, backend in backends.items():
                seconds[name].append(prefill_seconds(backend, prompt))
        print(f"\nprefill of a {prompt.numel()}-token prompt (median of 3):")
        for name, values in seconds.items():
            med = statistics.median(values)
            print(f"  {name:14s} {med * 1e3:.0f} ms, {prompt.numel() / med:.0f} tokens/s")
    if args.no_plain or on_file:  # transformers' generate() needs the float weights a .gguf target lacks
        return
    lean = next(iter(backends.values()))
    prompts = [p.text for task in ("code", "chat") for p in task_prompts(task, 2, seed=0)]
    ratios = []
    greedy = SamplingParams()
    for text in prompts:
        ids = loaded.encode(text)
        plain = SpeculativeEngine(lean, None, loaded.eos_token_ids)
        run = plain.generate(ids, greedy, SpecConfig(gamma=0, max_new_tokens=64)).run()
        tokens, seconds_taken = hf_generate(loaded.model, ids, greedy, 64, loaded.eos_token_ids)
        ours = run.stats.tokens_per_second
        theirs = len(tokens) / seconds_taken
        ratios.append(ours / theirs)
        print(f"plain decoding: {lean.path} {ours:.1f} tok/s vs transformers generate() {theirs:.1f} tok/s "
              f"({ours / theirs:.2f}x); identical: {run.tokens == tokens}")
    print(f"plain decoding speedup over generate(): median {statistics.median(ratios):.2f}x "
          f"(min {min(ratios):.2f}, max {max(ratios):.2f})")


if __name__ == "__main__":
    main()
