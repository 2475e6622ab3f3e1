"""`specdec export-drafter`: an eagle3 drafter as an EAGLE-3 checkpoint vLLM and SGLang load.

    specdec export-drafter drafters/smollm2-eagle3 --format eagle3 --out smollm2-eagle3-vllm
    vllm serve HuggingFaceTB/SmolLM2-135M-Instruct \\
        --speculative-config '{"method": "eagle3", "model": "smollm2-eagle3-vllm", "num_speculative_tokens": 3}'
    python -m sglang.launch_server --model-path HuggingFaceTB/SmolLM2-135M-Instruct \\
        --speculative-algorithm EAGLE3 --speculative-draft-model-path smollm2-eagle3-vllm

The layouts and the keys each server reads: specdec/drafters/eagle3_format.py.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..errors import SpecdecError
from .options import output_directory


def run(args: argparse.Namespace) -> int:
    from ..drafters import eagle3_format
    from ..drafters.checkpoint import is_trained_drafter
    from ..models import BUILTIN_MODELS

    if not is_trained_drafter(args.drafter):
        raise SpecdecError(f"{args.drafter} holds no drafter written by `specdec train-drafter` "
                           "(config.json and model.safetensors)")
    out = Path(args.out)
    if out.is_dir() and any(out.iterdir()) and not args.overwrite:
        raise SpecdecError(f"{out} is not empty: choose another --out or pass --overwrite")
    output_directory(args.out)
    net = eagle3_format.read_saved(args.drafter)
    target = net.config.target.get("name", "")
    verifier = args.verifier or (BUILTIN_MODELS[target].hub_id if target in BUILTIN_MODELS else target)
    eagle3_format.export(net, out, args.format, verifier)
    megabytes = sum(f.stat().st_size for f in out.iterdir()) / 1e6
    print(f"specdec: wrote {out} ({args.format} layout, {megabytes:.1f} MB) for the verifier {verifier}", file=sys.stderr)
    return 0


def register(sub) -> None:
    p = sub.add_parser("export-drafter", help="write an eagle3 drafter as an EAGLE-3 checkpoint for vLLM or SGLang")
    p.add_argument("drafter", help="the eagle3 drafter's directory (from `specdec train-drafter --kind eagle3`)")
    p.add_argument("--format", default="eagle3", choices=("eagle3", "speculators"),
                   help="eagle3: EAGLE-3's layout (vLLM and SGLang); speculators: vLLM's speculators layout "
                        "(default: %(default)s)")
    p.add_argument("--out", required=True, help="directory to write the checkpoint to")
    p.add_argument("--verifier", default=None,
                   help="the target as the server names it (default: a built-in target's hub id, "
                        "else the name it was trained for)")
    p.add_argument("--overwrite", action="store_true", help="write into a non-empty --out")
    p.set_defaults(handler=run)
