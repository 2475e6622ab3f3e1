"""One target pass of n positions (SmolLM2, GGUF blocks, int8 activations) with two builds of quant.cpp side
by side, interleaved: median ms, and new/old per n. Each source needs rowops.h and amx.h beside it.

    mkdir -p /tmp/kv/old && cp specdec/modeling/*.h /tmp/kv/old/
    git show 94c9b3a~1:specdec/modeling/quant.cpp > /tmp/kv/old/quant.cpp
    .venv/bin/python docs/results/zen2-epyc/ab_step.py /tmp/kv/old/quant.cpp specdec/modeling/quant.cpp [CONTEXT]

CONTEXT: the tokens already in the cache before each pass (200 by default).
"""

import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "scripts"))
from bench_step import step_times  # noqa: E402  (a pass of n positions after a context, timed)

from specdec.backends import LeanBackend
from specdec.modeling import quant
from specdec.modeling.extension import Extension
from specdec.models import load_model

ROWS = [1, 2, 4, 8, 16]


def main() -> None:
    loaded = load_model("smollm2-135m", "float32")
    backends = {}
    for name, path in (("old", sys.argv[1]), ("new", sys.argv[2])):
        quant._extension = Extension(Path(path), "AVX2, FMA and F16C", "SPECDEC_QUANT", "")  # the module a backend keeps
        backends[name] = LeanBackend(loaded.model, gguf=loaded.gguf, int8_activations=True)
    context = int(sys.argv[3]) if len(sys.argv) > 3 else 200
    ids = torch.tensor(loaded.tokenizer("The quick brown fox jumps over the lazy dog. " * 200)["input_ids"])[:context]
    times: dict[tuple[str, int], list[float]] = {}
    for n in ROWS:  # warm-up
        for backend in backends.values():
            step_times(backend, ids, n, 3)
    for _ in range(10):
        for n in ROWS:
            for name, backend in backends.items():
                times.setdefault((name, n), []).extend(step_times(backend, ids, n, 6))
    print("| n | old ms | new ms | new / old |\n|---|---|---|---|")
    for n in ROWS:
        old, new = (statistics.median(times[name, n]) * 1e3 for name in ("old", "new"))
        print(f"| {n} | {old:.2f} | {new:.2f} | {new / old:.3f} |")


if __name__ == "__main__":
    main()
