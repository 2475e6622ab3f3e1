"""Issue 7 benchmark: one target step (1 and 8 positions) against the machine's memory bound and its
multiply-add floor, for the lean backend on kernels.cpp, the lean backend on oneDNN and transformers;
and plain decoding tokens/s against transformers' generate(). bf16, side by side, interleaved.

    .venv/bin/python scripts/bench_step.py [--target smollm2-135m] [--repeats 30]
"""

import argparse
import statistics
import time

import torch

from specdec.backends import LeanBackend, TransformersBackend
from specdec.bench.peers import hf_generate
from specdec.config import SamplingParams, SpecConfig
from specdec.engine import SpeculativeEngine
from specdec.modeling import kernels
from specdec.models import load_model
from specdec.prompts import task_prompts


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


def multiply_add_rate(kern, rows: int = 16, repeats: int = 30) -> float:
    """Multiply-adds per second of the bf16 linear kernel on a cache-resident matrix: the compute
    ceiling a step of `rows` positions meets once it is no longer waiting on memory."""
    w = torch.randn(1024, 576).to(torch.bfloat16)
    x = torch.randn(rows, 576).to(torch.bfloat16)
    kern.linear(x, w)
    best = min(_timed(lambda: kern.linear(x, w)) for _ in range(repeats))
    return rows * w.numel() / best


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def step_times(backend, context: torch.Tensor, positions: int, repeats: int) -> list[float]:
    backend.reset()
    backend.forward(context)
    times = []
    draft = torch.randint(0, 1000, (positions,))
    for _ in range(repeats):
        t = time.perf_counter()
        backend.forward(draft)
        times.append(time.perf_counter() - t)
        backend.rollback(context.numel())
    return times


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--target", default="smollm2-135m")
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args()
    loaded = load_model(args.target, "bfloat16")
    weight_bytes = sum(p.numel() * p.element_size() for p in loaded.model.parameters())
    read_gbs, copy_gbs = bandwidth()
    bound_ms = weight_bytes / (read_gbs * 1e9) * 1e3
    print(f"weights {weight_bytes / 1e6:.0f} MB; read bandwidth {read_gbs:.1f} GB/s, copy {copy_gbs:.1f} GB/s; "
          f"memory bound of one step {bound_ms:.1f} ms")
    context = torch.tensor(loaded.tokenizer("The quick brown fox jumps over the lazy dog. " * 20)["input_ids"][:200])
    t0 = time.perf_counter()
    kern = kernels.load()
    print(f"kernels.cpp: {'loaded' if kern else 'unavailable: ' + str(kernels.unavailable_reason())} in "
          f"{time.perf_counter() - t0:.1f} s (a first build on a machine takes ~30 s, then it is cached)")
    params = weight_bytes // 2
    if kern:
        rate = multiply_add_rate(kern)
        print(f"bf16 multiply-add rate {rate / 1e9:.0f} G/s: a step of 8 positions needs at least "
              f"{8 * params / rate * 1e3:.1f} ms of arithmetic")
    t0 = time.perf_counter()
    lean = LeanBackend(loaded.model)
    lean.forward(context[:4])
    print(f"lean backend set-up and first call: {time.perf_counter() - t0:.2f} s")
    backends = {lean.path: lean, "lean (oneDNN)": LeanBackend(loaded.model, use_kernels=False),
                "transformers": TransformersBackend(loaded.model)}
    for positions in (1, 8):
        rows = {}
        for backend in backends.values():
            step_times(backend, context, positions, 3)  # warm-up
        for _ in range(3):  # interleave the backends
            for name, backend in backends.items():
                rows.setdefault(name, []).extend(step_times(backend, context, positions, args.repeats // 3))
        for name, times in rows.items():
            med = statistics.median(times) * 1e3
            q = statistics.quantiles(times, n=4)
            print(f"{positions} position(s), {name:14s}: median {med:.1f} ms (IQR {q[0]*1e3:.1f}-{q[2]*1e3:.1f}), "
                  f"{med / bound_ms:.2f}x the memory bound")
    prompts = [p.text for task in ("code", "chat") for p in task_prompts(task, 2, seed=0)]
    ratios = []
    greedy = SamplingParams()
    for text in prompts:
        ids = loaded.encode(text)
        plain = SpeculativeEngine(lean, None, loaded.eos_token_ids)
        run = plain.generate(ids, greedy, SpecConfig(gamma=0, max_new_tokens=64)).run()
        tokens, seconds = hf_generate(loaded.model, ids, greedy, 64, loaded.eos_token_ids)
        ours = run.stats.tokens_per_second
        theirs = len(tokens) / seconds
        ratios.append(ours / theirs)
        print(f"plain decoding: {lean.path} {ours:.1f} tok/s vs transformers generate() {theirs:.1f} tok/s "
              f"({ours / theirs:.2f}x); "
              f"identical: {run.tokens == tokens}")
    print(f"plain decoding speedup over generate(): median {statistics.median(ratios):.2f}x "
          f"(min {min(ratios):.2f}, max {max(ratios):.2f})")


if __name__ == "__main__":
    main()
