"""The `specdec` command. Flags map one to one onto SamplingParams / SpecConfig fields.

    specdec generate "Rewrite this code ..." --drafter prompt-lookup --gamma auto --compare
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from .config import SpecConfig
from .errors import SpecdecError


def _gamma(text: str):
    try:
        return SpecConfig.parse_gamma(text)
    except SpecdecError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_model_args(parser: argparse.ArgumentParser) -> None:
    """--target, --drafter, --draft, --dtype, --device: shared by every subcommand that runs a model."""
    from .drafters import DRAFTER_KINDS

    parser.add_argument("--target", default="smollm2-135m",
                        help="target model p: smollm2-135m, gemma3-270m, a local directory or a hub id (default: %(default)s)")
    parser.add_argument("--drafter", default="auto", metavar="KIND_OR_DIR",
                        help=f"how drafts are made: {', '.join(DRAFTER_KINDS)}, or a trained drafter's directory "
                             "(default: %(default)s)")
    parser.add_argument("--draft", default=None, metavar="MODEL_OR_FILE",
                        help="the draft model (--drafter model), n-gram table file (--drafter ngram) or trained "
                             "drafter directory (--drafter trained; default: the one shipped for the target)")
    parser.add_argument("--dtype", default="auto",
                        help="auto (bfloat16 where the CPU has fast bf16, else float32), bfloat16, float32, float16")
    parser.add_argument("--device", default="cpu", help="torch device (default: %(default)s)")
    parser.add_argument("--backend", default="auto", choices=("auto", "lean", "transformers"),
                        help="forward pass: auto (lean where the architecture is known), lean, transformers")


def add_sampling_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default: %(default)s)")
    parser.add_argument("--top-k", type=int, default=0, help="keep the k most likely tokens; 0 = off")
    parser.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass in (0, 1]")
    parser.add_argument("--seed", type=int, default=None,
                        help="seed of the request's random generator; a seeded sampled generation draws every token "
                             "by noise keyed by (seed, position), so its output does not depend on the drafter or gamma")
    parser.add_argument("--gamma", type=_gamma, default="auto",
                        help="draft tokens per round: an integer (0 = plain decoding) or auto (default: %(default)s)")
    parser.add_argument("--max-new-tokens", type=int, default=128, help="default: %(default)s")


def check_sampling_args(args: argparse.Namespace) -> None:
    """Fail on bad sampling flags before any model is loaded."""
    from .config import SamplingParams

    SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed)
    SpecConfig(gamma=args.gamma, max_new_tokens=args.max_new_tokens)


def _generate(args: argparse.Namespace) -> int:
    from .api import SpecDec, TextStream

    prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
    if not prompt.strip():
        raise SpecdecError("the prompt is empty: give some text, or '-' to read it from standard input")
    check_sampling_args(args)
    sd = SpecDec(target=args.target, drafter=args.drafter, draft=args.draft, dtype=args.dtype, device=args.device,
                 backend=args.backend)
    kwargs = dict(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
                  top_p=args.top_p, seed=args.seed, chat=args.chat)
    if args.compare:  # one short warm-up so neither run pays for first-call set-up
        sd.generate(prompt, **{**kwargs, "max_new_tokens": 4}, gamma=0)
    prompt_ids, run = sd.start(prompt, gamma=args.gamma, **kwargs)
    text = TextStream(sd.tokenizer)
    for chunk in run:
        piece = text.push(chunk)
        if piece and not args.json:
            print(piece, end="", flush=True)
    result = sd.result(prompt_ids, run)
    if args.json:
        out = result.to_dict()
    else:
        print()
        print(result.stats.summary(), file=sys.stderr)
    if args.compare:
        baseline = sd.generate(prompt, gamma=0, **kwargs)
        spec_tps, plain_tps = result.stats.tokens_per_second, baseline.stats.tokens_per_second
        speedup = spec_tps / plain_tps if spec_tps and plain_tps else None
        identical = baseline.token_ids == result.token_ids
        if args.json:
            out["baseline"] = baseline.to_dict()
            out["speedup"] = speedup
            out["identical"] = identical
        else:
            note = ("" if args.temperature == 0 or args.seed is not None else
                    " (sampled without --seed: outputs differ by chance, the distribution is the same)")
            print(f"plain decoding: {baseline.stats.summary()}", file=sys.stderr)
            print(f"speedup {speedup:.2f}x over plain decoding; outputs identical: {'yes' if identical else 'no'}{note}",
                  file=sys.stderr)
    if args.json:
        print(json.dumps(out, indent=None))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specdec", description="Lossless speculative decoding for Hugging Face causal LMs.")
    sub = parser.add_subparsers(dest="command", required=True)

    gen = sub.add_parser("generate", help="generate text speculatively (streams it)")
    gen.add_argument("prompt", help="the prompt text, or - to read it from standard input")
    add_model_args(gen)
    add_sampling_args(gen)
    gen.add_argument("--chat", action=argparse.BooleanOptionalAction, default=None,
                     help="wrap the prompt in the model's chat template (default: on when the model has one)")
    gen.add_argument("--compare", action="store_true", help="also run plain decoding and report the speedup")
    gen.add_argument("--json", action="store_true", help="print one JSON object instead of streaming text")
    gen.set_defaults(handler=_generate)

    from . import subcommands

    subcommands.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.handler(args)
    except SpecdecError as exc:
        print(f"specdec: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\nspecdec: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
