"""rowops.cpp's attention alone in a decoding step's shape (SmolLM2: 9 query heads over 3 KV heads of 64,
30 layers, each its own cache of random keys and values), two or more builds of it side by side and
interleaved, medians of 15; each build's outputs compared to the bit with the first one's. T1=1 runs it on
one thread.

    .venv/bin/python docs/results/zen2-epyc/attention_prefetch_ab.py OLD/specdec/modeling/rowops.cpp \\
        specdec/modeling/rowops.cpp
"""

import os
import statistics
import sys
import time
from pathlib import Path

import torch

from specdec.modeling.extension import Extension

LAYERS, KV_HEADS, HEADS, HEAD_DIM = 30, 3, 9, 64


def main() -> None:
    sources = sys.argv[1:]
    builds = {s: Extension(Path(s), "AVX2 and FMA", "SPECDEC_ROWOPS", "").load() for s in sources}
    if os.environ.get("T1"):
        torch.set_num_threads(1)
    torch.manual_seed(0)
    for context in (300, 800, 1000, 3000):
        capacity = context + 64
        k_caches = [torch.randn(KV_HEADS, capacity, HEAD_DIM) for _ in range(LAYERS)]
        v_caches = [torch.randn(KV_HEADS, capacity, HEAD_DIM) for _ in range(LAYERS)]
        q = torch.randn(1, HEADS, 1, HEAD_DIM)
        k, v = torch.randn(1, KV_HEADS, 1, HEAD_DIM), torch.randn(1, KV_HEADS, 1, HEAD_DIM)
        every_key = torch.empty(0, dtype=torch.bool)
        seconds: dict[str, list[float]] = {s: [] for s in sources}
        outputs = {}
        for _ in range(15):
            for source, build in builds.items():
                start = time.perf_counter()
                for layer in range(LAYERS):
                    outputs[source] = build.attend(q, k, v, k_caches[layer], v_caches[layer], context - 1, 0, every_key,
                                                   HEAD_DIM**-0.5)
                seconds[source].append(time.perf_counter() - start)
        read = LAYERS * 2 * KV_HEADS * context * HEAD_DIM * 4
        for source in sources:
            t = statistics.median(seconds[source])
            same = torch.equal(outputs[source], outputs[sources[0]])
            print(f"{context} keys | {source} | {t * 1e3:.2f} ms for {LAYERS} layers | {read / t / 1e9:.1f} GB/s | "
                  f"same bits as the first: {same}")


if __name__ == "__main__":
    main()
