"""quant.cpp's products alone on SmolLM2's GGUF blocks: the 120 layer matrices (Q4_1) and the LM head
(Q8_0) at 1..64 rows, float32 and int8 activations on the AVX2 kernels, and int8 on the blocks packed
for AVX-512 VNNI / AMX-INT8 ("packed", where the CPU has them), ms, medians (min-max). Several versions of the
kernel source can run side by side in one process, interleaved (e.g. the committed one against an
edit: `git show HEAD~1:specdec/modeling/quant.cpp > /tmp/old.cpp`).

    .venv/bin/python scripts/bench_quant_products.py [--kernel old=/tmp/old.cpp] [--kernel new=specdec/modeling/quant.cpp]
        [--rows 1,4,8,16,64] [--repeats 5]
"""

import argparse
import statistics
import time
from pathlib import Path

import torch

from specdec.backends.gguf import GGUFWeights
from specdec.modeling.extension import Extension
from specdec.models import BUILTIN_MODELS


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernel", action="append", help="NAME=PATH of a quant.cpp to build and time (repeatable)")
    parser.add_argument("--rows", default="1,4,8,16,64")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    sources = dict(k.split("=", 1) for k in args.kernel or [f"quant.cpp={Path('specdec/modeling/quant.cpp')}"])
    modules = {}
    for name, path in sources.items():
        extension = Extension(Path(path), "AVX2, FMA and F16C", "SPECDEC_QUANT", "")
        modules[name] = extension.load()
        if modules[name] is None:
            raise SystemExit(f"{path}: {extension.reason}")
    weights = GGUFWeights.read(Path(BUILTIN_MODELS["smollm2-135m"].locate_gguf()))
    layers = [weights.layer(i, part) for i in range(30) for part in ("q", "k", "v", "o", "gate", "up", "down")]
    head = weights.lm_head()
    packed = {name: {id(w): module.pack_int8(w.blocks, w.kind, w.in_features) for w in [*layers, head]}
              for name, module in modules.items() if module.packed_supported()}
    modes = ("float32", "int8", "packed")
    times: dict[tuple, list[float]] = {}
    generator = torch.Generator().manual_seed(0)
    for rows in (int(r) for r in args.rows.split(",")):
        x = {576: torch.randn(rows, 576, generator=generator), 1536: torch.randn(rows, 1536, generator=generator)}
        for _ in range(args.repeats):
            for name, module in modules.items():
                for mode in modes:
                    if mode == "packed" and name not in packed:
                        continue
                    flag = module.packed_flag() if mode == "packed" else 0

                    def blocks(w, name=name, mode=mode):
                        return packed[name][id(w)] if mode == "packed" else w.blocks

                    start = time.perf_counter()
                    for w in layers:
                        module.linear(x[w.in_features], blocks(w), w.kind | flag, w.in_features, mode != "float32")
                    middle = time.perf_counter()
                    module.linear(x[576], blocks(head), head.kind | flag, head.in_features, mode != "float32")
                    end = time.perf_counter()
                    times.setdefault((rows, name, mode, "layers"), []).append((middle - start) * 1e3)
                    times.setdefault((rows, name, mode, "head"), []).append((end - middle) * 1e3)
    print("rows | kernel | activations | matrices | ms median (min-max)")
    for (rows, name, mode, which), values in times.items():
        print(f"{rows} | {name} | {mode} | {which} | "
              f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})")


if __name__ == "__main__":
    main()
