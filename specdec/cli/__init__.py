"""The `specdec` command: one module per subcommand, shared options in `options`.

    specdec generate "Rewrite this code ..." --drafter prompt-lookup --compare
    specdec bench | verify | serve | train-drafter | export-drafter | ngram fit | make-model
"""

from __future__ import annotations

import argparse
import os
import sys

from ..errors import SpecdecError
from . import bench, export, generate, make_model, ngram, serve, train, verify

SUBCOMMANDS = (generate, bench, verify, serve, train, export, ngram, make_model)
"""Each module registers its subcommand(s) and sets `handler` to the function that runs them."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specdec", description="Lossless speculative decoding for Hugging Face causal LMs.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in SUBCOMMANDS:
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    args = build_parser().parse_args(argv)
    try:
        return args.handler(args)
    except SpecdecError as exc:
        print(f"specdec: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\nspecdec: interrupted", file=sys.stderr)
        return 130
