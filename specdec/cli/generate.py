"""`specdec generate`: stream a speculative generation; --compare also runs plain decoding."""

from __future__ import annotations

import argparse
import json
import sys

from ..errors import SpecdecError
from .options import add_model_args, add_sampling_args, check_sampling_args


def run(args: argparse.Namespace) -> int:
    from ..api import SpecDec
    from ..text import TextStream

    prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
    if not prompt.strip():
        raise SpecdecError("the prompt is empty: give some text, or '-' to read it from standard input")
    check_sampling_args(args)
    sd = SpecDec(target=args.target, drafter=args.drafter, dtype=args.dtype, device=args.device, backend=args.backend,
                 weights=args.weights)
    kwargs = dict(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
                  top_p=args.top_p, seed=args.seed, chat=args.chat)
    if args.compare:  # short warm-ups of both kinds of pass, so neither run pays for first-call set-up
        sd.generate(prompt, **{**kwargs, "max_new_tokens": 8}, gamma=args.gamma)
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


def register(sub) -> None:
    gen = sub.add_parser("generate", help="generate text speculatively (streams it)")
    gen.add_argument("prompt", help="the prompt text, or - to read it from standard input")
    add_model_args(gen)
    add_sampling_args(gen)
    gen.add_argument("--chat", action=argparse.BooleanOptionalAction, default=None,
                     help="wrap the prompt in the model's chat template (default: on when the model has one)")
    gen.add_argument("--compare", action="store_true", help="also run plain decoding and report the speedup")
    gen.add_argument("--json", action="store_true", help="print one JSON object instead of streaming text")
    gen.set_defaults(handler=run)
