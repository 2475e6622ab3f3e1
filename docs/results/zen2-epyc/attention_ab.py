"""rowops.cpp's attention alone, two builds side by side (interleaved): SmolLM2's shapes (9 query heads over
3 KV heads of 64) and Gemma-3-270M's (4 over 1 of 256), one to 32 positions as a chain or tree (a random
half of the earlier new rows visible, as a token tree's ancestors) after CONTEXT cached keys, 30 layers'
caches in turn; us a layer (medians of 9), new / old, and whether the outputs are equal to the bit.

    mkdir -p /tmp/kv/old && git show 5b16ef4~1:specdec/modeling/rowops.h > /tmp/kv/old/rowops.h
    cp specdec/modeling/rowops.cpp /tmp/kv/old/
    .venv/bin/python docs/results/zen2-epyc/attention_ab.py /tmp/kv/old/rowops.cpp specdec/modeling/rowops.cpp [CONTEXT]
"""

import statistics
import sys
import time
from pathlib import Path

import torch

from specdec.modeling.extension import Extension

LAYERS = 30


def main() -> None:
    modules = {name: Extension(Path(path), "AVX2 and FMA", "SPECDEC_ROWOPS", "").load()
               for name, path in (("old", sys.argv[1]), ("new", sys.argv[2]))}
    context = int(sys.argv[3]) if len(sys.argv) > 3 else 200
    torch.manual_seed(0)
    for n_heads, n_kv, hd in ((9, 3, 64), (4, 1, 256)):
        k_caches = [torch.randn(n_kv, 4096, hd) for _ in range(LAYERS)]
        v_caches = [torch.randn(n_kv, 4096, hd) for _ in range(LAYERS)]
        for n in (1, 2, 4, 8, 16, 32):
            q, k, v = torch.randn(1, n_heads, n, hd), torch.randn(1, n_kv, n, hd), torch.randn(1, n_kv, n, hd)
            visible = torch.empty(0, dtype=torch.bool)
            if n > 1:
                visible = torch.ones(n, context + n, dtype=torch.bool)
                visible[:, context:] = (torch.rand(n, n) < 0.5) | torch.eye(n, dtype=torch.bool)
            args = (context, 0, visible, hd**-0.5)
            outs = {name: m.attend(q, k, v, k_caches[0], v_caches[0], *args) for name, m in modules.items()}
            times: dict[str, list[float]] = {name: [] for name in modules}
            for _ in range(9):
                for name, m in modules.items():
                    t = time.perf_counter()
                    for i in range(LAYERS):
                        m.attend(q, k, v, k_caches[i], v_caches[i], *args)
                    times[name].append((time.perf_counter() - t) / LAYERS * 1e6)
            old, new = (statistics.median(times[name]) for name in ("old", "new"))
            print(f"heads {n_heads}/{n_kv} x {hd}, {context} keys, {n} positions: old {old:.1f} us, new {new:.1f} us, "
                  f"new/old {new / old:.2f}, same bits {torch.equal(outs['old'], outs['new'])}")


if __name__ == "__main__":
    main()
