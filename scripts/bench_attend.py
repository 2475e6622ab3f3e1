"""rowops.cpp's attention alone (the GGUF blocks' and the ATen path's float32 attention), against ATen's
SDPA on the same shapes for scale: a long prompt (causal mask), a decoding step and a verification of
8 positions over a long cache, with the built-in targets' head shapes.

    .venv/bin/python scripts/bench_attend.py [--repeats 7] [--narrow]

--narrow weighs the values on AVX2 lanes where the CPU has AVX-512 (the same bits; for comparison).
Prints ms a call (one layer), medians of the repeats.
"""

import argparse
import statistics
import time
from functools import partial

import torch
import torch.nn.functional as F

from specdec.modeling import rowops

SHAPES = {"smollm2-135m": (9, 3, 64), "gemma3-270m": (4, 1, 256)}  # query heads, KV heads, head size
CASES = [("prompt of 1500", 1500, 0), ("prompt of 300", 300, 0), ("1 position after 1500", 1, 1499),
         ("8 positions after 1000", 8, 1000)]


def median_ms(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--narrow", action="store_true", help="AVX2 lanes for the values even on AVX-512")
    args = parser.parse_args()
    rows = rowops.load()
    if rows is None:
        raise SystemExit(f"rowops.cpp does not run here: {rowops.unavailable_reason()}")
    if args.narrow:
        rows.set_wide_lanes(False)
    print("| target | case | rowops attend ms | SDPA ms (float32, the same mask) |")
    print("|---|---|---|---|")
    for target, (n_heads, n_kv, hd) in SHAPES.items():
        for name, t, start in CASES:
            g = torch.Generator().manual_seed(t + start)
            q = torch.randn(1, n_heads, t, hd, generator=g)
            k, v = torch.randn(1, n_kv, t, hd, generator=g), torch.randn(1, n_kv, t, hd, generator=g)
            k_cache, v_cache = torch.randn(n_kv, 2048, hd, generator=g), torch.randn(n_kv, 2048, hd, generator=g)
            positions = torch.arange(start, start + t)
            visible = (torch.arange(start + t)[None] <= positions[:, None] if t > 1
                       else torch.empty(0, dtype=torch.bool))
            ours = median_ms(partial(rows.attend, q, k, v, k_cache, v_cache, start, 0, visible, hd**-0.5),
                             args.repeats)
            keys = k_cache[None, :, : start + t].repeat_interleave(n_heads // n_kv, 1)
            values = v_cache[None, :, : start + t].repeat_interleave(n_heads // n_kv, 1)
            mask = visible if t > 1 else None
            sdpa = median_ms(partial(F.scaled_dot_product_attention, q, keys, values, attn_mask=mask), args.repeats)
            print(f"| {target} | {name} | {ours:.3f} | {sdpa:.3f} |")


if __name__ == "__main__":
    main()
