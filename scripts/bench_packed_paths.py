"""quant.cpp's packed int8 products, matrix by matrix of SmolLM2's GGUF blocks: vpdpbusd at every row
count, AMX-INT8 beside it where the CPU has it (both paths give the same numbers, so any count may take
either); with --against, a second quant.cpp (an earlier version, say) built and timed interleaved with
the first, so two kernels compare on one host in one run. Prints ms a product (median of 5 timings of
`--repeats` calls) and core cycles per 16 rows x 16 columns x 32 weights at an assumed --ghz. A matrix
repeated stays in cache; with --stream, the products of a whole pass instead (every layer's seven matrices
and the LM head, the weights streaming from memory as in a real pass), ms a pass, median of 7, both
kernels interleaved. scripts/bench_step.py --gguf times whole passes with everything else in them.

    .venv/bin/python scripts/bench_packed_paths.py [--rows 1,4,8,12,16,20,32,64] [--threads 2]
        [--kernel PATH] [--against PATH] [--ghz 3] [--stream]
"""

import argparse
import statistics
import time
from pathlib import Path

import torch

from specdec.backends.gguf import GGUFWeights
from specdec.modeling.extension import Extension
from specdec.models import BUILTIN_MODELS


def build(path: str):
    extension = Extension(Path(path), "AVX2, FMA and F16C", "SPECDEC_QUANT", "")
    module = extension.load()
    if module is None or not module.packed_supported():
        raise SystemExit(f"{path}: needs the packed kernels (AVX-512 VNNI): {extension.reason or 'not on this CPU'}")
    return module


def stream(kernels: dict, weights: GGUFWeights, rows: list[int]) -> None:
    """Every product of a pass (30 layers x 7 matrices, then the LM head) at each row count, per kernel."""
    first = kernels["kernel"]
    layers = 0
    while weights.layer(layers, "q") is not None:
        layers += 1
    parts = [weights.layer(i, part) for i in range(layers) for part in ("q", "k", "v", "o", "gate", "up", "down")]
    matrices = [(first.pack_int8(w.blocks, w.kind, w.in_features), w.kind, w.in_features)
                for w in [*parts, weights.lm_head()]]
    print("rows | " + " | ".join(f"{name} ms a pass" for name in kernels) + (" | against / kernel" if len(kernels) > 1 else ""))
    for n in rows:
        xs = {k: torch.randn(n, k) for k in {m[2] for m in matrices}}
        times: dict[str, list[float]] = {name: [] for name in kernels}
        for _ in range(7):
            for name, module in kernels.items():  # interleaved: both see the same host
                start = time.perf_counter()
                for packed, kind, k in matrices:
                    module.linear(xs[k], packed, kind | module.packed_flag(), k, True)
                times[name].append(time.perf_counter() - start)
        medians = {name: statistics.median(t) * 1e3 for name, t in times.items()}
        ratio = f" | {medians['against'] / medians['kernel']:.2f}" if len(kernels) > 1 else ""
        print(f"{n} | " + " | ".join(f"{m:.2f}" for m in medians.values()) + ratio, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="1,4,8,12,16,20,32,64")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--kernel", default="specdec/modeling/quant.cpp", help="the quant.cpp to build and time")
    parser.add_argument("--against", help="a second quant.cpp, timed beside the first (its folder needs amx.h and rowops.h)")
    parser.add_argument("--ghz", type=float, default=3.0, help="the clock the cycle column assumes")
    parser.add_argument("--stream", action="store_true", help="a whole pass's products, weights from memory")
    args = parser.parse_args()
    kernels = {"kernel": build(args.kernel)}
    if args.against:
        kernels["against"] = build(args.against)
    torch.set_num_threads(args.threads)
    weights = GGUFWeights.read(Path(BUILTIN_MODELS["smollm2-135m"].locate_gguf()))
    if args.stream:
        stream(kernels, weights, [int(r) for r in args.rows.split(",")])
        return
    matrices = {"lm head": weights.lm_head(), **{part: weights.layer(0, part) for part in ("q", "k", "up", "down")}}
    paths = [("vpdpbusd", 10**6)] + ([("amx", 0)] if kernels["kernel"].amx_int8() else [])
    defaults = {name: module.set_packed_rows(0) for name, module in kernels.items()}
    print("matrix | rows | path | " + " | ".join(f"{name} ms | cycles per 16x16x32" for name in kernels)
          + (" | against / kernel" if args.against else ""))
    for name, w in matrices.items():
        packed = kernels["kernel"].pack_int8(w.blocks, w.kind, w.in_features)
        tiles = w.out_features // 16 * (w.in_features // 32)
        repeats = 20 if name == "lm head" else 200
        for rows in (int(r) for r in args.rows.split(",")):
            x = torch.randn(rows, w.in_features)
            for path, limit in paths:
                if path == "amx" and rows == 1:
                    continue
                times: dict[str, list[float]] = {k: [] for k in kernels}
                for _ in range(5):
                    for label, module in kernels.items():  # interleaved: both see the same host
                        module.set_packed_rows(limit)
                        start = time.perf_counter()
                        for _ in range(repeats):
                            module.linear(x, packed, w.kind | module.packed_flag(), w.in_features, True)
                        times[label].append((time.perf_counter() - start) / repeats)
                cells = []
                for label in kernels:
                    t = statistics.median(times[label])
                    per_tile = t * args.ghz * 1e9 * args.threads / tiles / max(1.0, rows / 16)
                    cells.append(f"{t * 1e3:.3f} | {per_tile:.0f}")
                ratio = (f" | {statistics.median(times['against']) / statistics.median(times['kernel']):.2f}"
                         if args.against else "")
                print(f"{name} | {rows} | {path} | " + " | ".join(cells) + ratio, flush=True)
    for name, module in kernels.items():
        module.set_packed_rows(defaults[name])


if __name__ == "__main__":
    main()
