"""`specdec make-model`: write a user-scale benchmark model as a GGUF file (specdec/bench/gguf_models.py).

    specdec make-model padded --size 1.7b --out models/smollm2-padded-1.7b.gguf   # SmolLM2's text, 1.8 B's cost
    specdec make-model padded --model gemma3-270m --out models/gemma3-deep-1.7b.gguf   # Gemma-3's text, 1.7 B's
    specdec make-model random --arch llama --size 7b --type Q4_K --out models/llama-7b-q4k.gguf
    specdec bench --target models/smollm2-padded-1.7b.gguf --drafter auto --peers llama-server
"""

from __future__ import annotations

import argparse
import sys
import time

from .options import output_file


def run(args: argparse.Namespace) -> int:
    from ..bench import gguf_models

    out = output_file(args.out)
    started = time.perf_counter()
    if args.kind == "padded":
        from pathlib import Path

        from ..models import BUILTIN_MODELS

        gguf_models.write_padded(out, args.size, source=Path(BUILTIN_MODELS[args.model].locate_gguf()))
    else:
        gguf_models.write_random(out, args.arch, args.size, args.type, seed=args.seed)
    gigabytes = out.stat().st_size / 1e9
    print(f"specdec: wrote {out} ({gigabytes:.2f} GB) in {time.perf_counter() - started:.0f} s", file=sys.stderr)
    return 0


def register(sub) -> None:
    p = sub.add_parser("make-model", help="write a user-scale benchmark model (random weights, or a built-in "
                                          "embedded with zero weights) as a GGUF file")
    p.add_argument("kind", choices=("padded", "random"),
                   help="padded: a built-in model inside a bigger one of its architecture whose added weights are "
                        "zero (the same text, the cost of the bigger model); random: random weights, for cost alone")
    p.add_argument("--model", default="smollm2-135m", choices=("smollm2-135m", "gemma3-270m"),
                   help="padded: the built-in model to embed: smollm2-135m (a 4x wider, deeper Llama) or gemma3-270m "
                        "(its own width, more layers and a wider MLP) (default: %(default)s)")
    p.add_argument("--size", default="1.7b", choices=("1.7b", "7b"), help="the model's cost (default: %(default)s)")
    p.add_argument("--arch", default="llama", choices=("llama", "qwen2", "qwen3"), help="random: the architecture")
    p.add_argument("--type", default="Q8_0", help="random: every matrix's block type, e.g. Q8_0, Q4_0, Q4_K, Q6_K "
                                                   "(default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="random: the weights' seed (default: %(default)s)")
    p.add_argument("--out", required=True, help="the .gguf file to write")
    p.set_defaults(handler=run)
