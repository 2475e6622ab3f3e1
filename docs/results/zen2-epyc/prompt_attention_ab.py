"""rowops.cpp's attention for prompt chunks, two builds side by side (interleaved): a chunk of T rows after
START cached keys, each row seeing the cache and the chunk's rows up to its own (causal), as a prefill
pass attends; SmolLM2's shapes (9 query heads over 3 KV heads of 64) and Gemma-3-270M's (4 over 1 of 256).
Also a random tree mask and one position, whose outputs must not change either. ms a layer (medians of
5), new / old, and whether the outputs are equal to the bit.

    mkdir -p /tmp/kv/old && git show 409b007~1:specdec/modeling/rowops.h > /tmp/kv/old/rowops.h
    cp specdec/modeling/rowops.cpp /tmp/kv/old/
    .venv/bin/python docs/results/zen2-epyc/prompt_attention_ab.py /tmp/kv/old/rowops.cpp specdec/modeling/rowops.cpp
"""

import statistics
import sys
import time
from pathlib import Path

import torch

from specdec.modeling.extension import Extension

CASES = [  # (rows T, cached keys before them, mask kind)
    (483, 0, "causal"), (256, 0, "causal"), (256, 256, "causal"), (64, 448, "causal"), (16, 200, "tree"), (1, 200, "none"),
]


def mask(kind: str, rows: int, start: int) -> torch.Tensor:
    if kind == "none":
        return torch.empty(0, dtype=torch.bool)
    visible = torch.ones(rows, start + rows, dtype=torch.bool)
    own = torch.ones(rows, rows, dtype=torch.bool).tril() if kind == "causal" else \
        (torch.rand(rows, rows) < 0.5).tril() | torch.eye(rows, dtype=torch.bool)
    visible[:, start:] = own
    return visible


def main() -> None:
    modules = {name: Extension(Path(path), "AVX2 and FMA", "SPECDEC_ROWOPS", "").load()
               for name, path in (("old", sys.argv[1]), ("new", sys.argv[2]))}
    torch.manual_seed(0)
    for n_heads, n_kv, hd in ((9, 3, 64), (4, 1, 256)):
        for rows, start, kind in CASES:
            k_cache, v_cache = torch.randn(n_kv, 1024, hd), torch.randn(n_kv, 1024, hd)
            q, k, v = torch.randn(1, n_heads, rows, hd), torch.randn(1, n_kv, rows, hd), torch.randn(1, n_kv, rows, hd)
            args = (start, 0, mask(kind, rows, start), hd**-0.5)
            outs = {name: m.attend(q, k, v, k_cache, v_cache, *args) for name, m in modules.items()}
            times: dict[str, list[float]] = {name: [] for name in modules}
            for _ in range(5):
                for name, m in modules.items():
                    t = time.perf_counter()
                    m.attend(q, k, v, k_cache, v_cache, *args)
                    times[name].append((time.perf_counter() - t) * 1e3)
            old, new = (statistics.median(times[name]) for name in ("old", "new"))
            print(f"heads {n_heads}/{n_kv} x {hd}, {rows} rows after {start} ({kind}): old {old:.3f} ms, new {new:.3f} ms, "
                  f"new/old {new / old:.2f}, same bits {torch.equal(outs['old'], outs['new'])}", flush=True)


if __name__ == "__main__":
    main()
