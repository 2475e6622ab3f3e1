"""quant.cpp's packed int8 products on vpdpbusd against AMX-INT8, matrix by matrix of SmolLM2's GGUF
blocks, at the same row counts (both paths give the same numbers, so any count may take either):
ms a product (median of 5 timings of `--repeats` calls) and core cycles per 16 rows x 16 columns x 32
weights at an assumed 3 GHz. A matrix repeated stays in cache; scripts/bench_step.py --gguf times whole
passes, where the weights stream from memory.

    .venv/bin/python scripts/bench_packed_paths.py [--rows 1,12,16,20,32,64] [--threads 2] [--kernel PATH]
"""

import argparse
import statistics
import time
from pathlib import Path

import torch

from specdec.backends.gguf import GGUFWeights
from specdec.modeling.extension import Extension
from specdec.models import _smollm2_gguf


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="1,12,16,20,32,64")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--kernel", default="specdec/modeling/quant.cpp", help="the quant.cpp to build and time")
    args = parser.parse_args()
    extension = Extension(Path(args.kernel), "AVX2, FMA and F16C", "SPECDEC_QUANT", "")
    module = extension.load()
    if module is None or not module.packed_supported() or not module.amx_int8():
        raise SystemExit(f"needs the packed kernels and AMX-INT8: {extension.reason or 'not on this CPU'}")
    torch.set_num_threads(args.threads)
    weights = GGUFWeights.read(_smollm2_gguf())
    matrices = {"lm head": weights.lm_head(), **{part: weights.layer(0, part) for part in ("q", "k", "up", "down")}}
    default = module.set_packed_rows(0)
    print("matrix | rows | path | ms | cycles per 16x16x32 tile")
    for name, w in matrices.items():
        packed = module.pack_int8(w.blocks, w.kind, w.in_features)
        tiles = w.out_features // 16 * (w.in_features // 32)
        repeats = 20 if name == "lm head" else 200
        for rows in (int(r) for r in args.rows.split(",")):
            x = torch.randn(rows, w.in_features)
            for path, limit in (("vpdpbusd", 10**6), ("amx", 0)):
                if path == "amx" and rows == 1:
                    continue
                module.set_packed_rows(limit)
                times = []
                for _ in range(5):
                    start = time.perf_counter()
                    for _ in range(repeats):
                        module.linear(x, packed, w.kind | module.packed_flag(), w.in_features, True)
                    times.append((time.perf_counter() - start) / repeats)
                t = statistics.median(times)
                per_tile = t * 3e9 * args.threads / tiles / max(1.0, rows / 16)
                print(f"{name} | {rows} | {path} | {t * 1e3:.3f} | {per_tile:.0f}")
    module.set_packed_rows(default)


if __name__ == "__main__":
    main()
