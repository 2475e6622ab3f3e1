"""`specdec verify`: run the exactness conformance check on a target and drafter, print PASS/FAIL."""

from __future__ import annotations

import argparse
import json

from .errors import SpecdecError


def _run(args: argparse.Namespace) -> int:
    from .api import SpecDec
    from .bench.prompts import load_prompts_file, task_prompts
    from .cli import check_sampling_args
    from .config import SamplingParams
    from .conformance import run_conformance
    from .engine import SpeculativeEngine

    check_sampling_args(args)
    if args.samples < 20:
        raise SpecdecError(f"--samples must be at least 20 for the distribution check to mean anything, got {args.samples}")
    if not 1 <= args.k <= 3:
        raise SpecdecError(f"--k must be 1, 2 or 3, got {args.k}")
    if args.gamma == 0:
        raise SpecdecError("--gamma 0 is plain decoding: there is nothing speculative to verify")
    sd = SpecDec(target=args.target, drafter=args.drafter, draft=args.draft, dtype=args.dtype, device=args.device,
                 backend=args.backend)
    if sd.drafter is None:
        raise SpecdecError("--drafter none: there is nothing speculative to verify")
    texts = ([p.text for p in load_prompts_file(args.prompts)] if args.prompts else
             [p.text for task in ("translate", "code") for p in task_prompts(task, args.num_prompts, args.seed)])
    prompts = [sd.encode(t) for t in texts]
    plain = SpeculativeEngine(sd.engine.target, None, sd.target.eos_token_ids)
    sampling = SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p)
    report = run_conformance(args.target, sd.target.model, plain, sd.engine, sd.engine.target, prompts, sampling,
                             args.gamma, k=args.k, samples=args.samples, seed=args.seed or 0,
                             parity_tokens=args.max_new_tokens, drafter_name=sd.drafter.name)
    print(json.dumps(report.to_dict(), indent=1) if args.json else report.to_text())
    return 0 if report.passed else 1


def register(sub) -> None:
    from .cli import add_model_args, add_sampling_args

    verify = sub.add_parser("verify", help="check that speculative sampling follows the target's law (exit 1 on FAIL)")
    add_model_args(verify)
    add_sampling_args(verify)
    verify.set_defaults(temperature=1.0, max_new_tokens=96)
    verify.add_argument("--samples", type=int, default=600, help="continuations per method and prompt (default: %(default)s)")
    verify.add_argument("--k", type=int, default=2, help="continuation length compared, 1-3 (default: %(default)s)")
    verify.add_argument("--prompts", default=None, metavar="FILE.jsonl", help="your own prompts")
    verify.add_argument("--num-prompts", type=int, default=1, help="prompts per built-in task (default: %(default)s)")
    verify.add_argument("--json", action="store_true", help="print the report as JSON")
    verify.set_defaults(handler=_run)
