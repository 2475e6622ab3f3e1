"""`specdec verify`: run the exactness conformance check on a target and drafter, print PASS/FAIL."""

from __future__ import annotations

import argparse
import json
from dataclasses import replace

from ..errors import SpecdecError
from .options import add_model_args, add_sampling_args, check_sampling_args


def run(args: argparse.Namespace) -> int:
    from ..api import SpecDec
    from ..config import SamplingParams
    from ..conformance.check import Settings, run_conformance
    from ..decoding.engine import SpeculativeEngine
    from ..tasks.prompts import load_prompts_file, task_prompts

    check_sampling_args(args)
    base = Settings.quick() if args.quick else Settings()
    settings = replace(base, samples=args.samples or base.samples,
                       plain_samples=base.plain_samples if args.plain_samples is None else args.plain_samples,
                       k=args.k, long_runs=base.long_runs if args.long_runs is None else args.long_runs,
                       parity_tokens=args.max_new_tokens)
    if settings.samples < 100 or 0 < settings.plain_samples < 100:
        raise SpecdecError(f"--samples must be at least 100 and --plain-samples 0 or at least 100 for the "
                           f"distribution tests to mean anything, got {settings.samples} and {settings.plain_samples}")
    if settings.long_runs < 0:
        raise SpecdecError(f"--long-runs must be >= 0, got {settings.long_runs}")
    if args.num_prompts < 1:
        raise SpecdecError(f"--num-prompts must be >= 1, got {args.num_prompts}")
    if not 1 <= args.k <= 3:
        raise SpecdecError(f"--k must be 1, 2 or 3, got {args.k}")
    if args.drafter_invariant and args.temperature == 0:
        raise SpecdecError("--drafter-invariant is for sampling: give --temperature > 0")
    if args.gamma == 0:
        raise SpecdecError("--gamma 0 is plain decoding: there is nothing speculative to verify")
    sd = SpecDec(target=args.target, drafter=args.drafter, dtype=args.dtype, device=args.device, backend=args.backend,
                 weights=args.weights)
    if sd.drafter is None:
        raise SpecdecError("--drafter none: there is nothing speculative to verify")
    texts = ([p.text for p in load_prompts_file(args.prompts)] if args.prompts else
             [p.text for task, count in (("code", (args.num_prompts + 1) // 2), ("translate", args.num_prompts // 2))
              for p in task_prompts(task, count, args.seed)])
    prompts = [sd.encode(t) for t in texts]
    plain = SpeculativeEngine(sd.engine.target, None, sd.target.eos_token_ids)
    sampling = SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                              seed=0 if args.drafter_invariant else None, drafter_invariant=args.drafter_invariant)
    report = run_conformance(args.target, sd.target.dtype, plain, sd.engine, sd.engine.target, prompts, sampling,
                             args.gamma, settings, seed=args.seed or 0, drafter_name=sd.drafter.for_sampling(sampling).name)
    print(json.dumps(report.to_dict(), indent=1) if args.json else report.to_text())
    return 0 if report.passed else 1


def register(sub) -> None:
    from ..conformance.check import Settings

    verify = sub.add_parser("verify", help="check that speculative sampling follows the target's law (exit 1 on FAIL)")
    add_model_args(verify)
    add_sampling_args(verify)
    verify.set_defaults(temperature=1.0, max_new_tokens=Settings().parity_tokens)
    verify.add_argument("--samples", type=int, default=None,
                        help=f"speculative continuations per prompt (default: {Settings().samples}; "
                             f"--quick {Settings.quick().samples})")
    verify.add_argument("--plain-samples", type=int, default=None,
                        help="plain continuations per prompt for a k-token test against plain decoding (default: "
                             f"{Settings().plain_samples}: the PIT of long runs tests the later tokens instead)")
    verify.add_argument("--long-runs", type=int, default=None,
                        help=f"long speculative runs per prompt whose every token is tested (default: {Settings().long_runs})")
    verify.add_argument("--k", type=int, default=1,
                        help="continuation length of the short runs compared with plain, 1-3 (default: %(default)s)")
    verify.add_argument("--drafter-invariant", action="store_true",
                        help="check drafter-invariant sampling (what seeded requests use) instead of rejection sampling")
    verify.add_argument("--quick", action="store_true", help="fewer samples (for CI): catches larger deviations only")
    verify.add_argument("--prompts", default=None, metavar="FILE.jsonl", help="your own prompts")
    verify.add_argument("--num-prompts", type=int, default=1,
                        help="built-in prompts, code and translation in turn (default: %(default)s: one prompt and "
                             "more samples see more than more prompts and fewer samples)")
    verify.add_argument("--json", action="store_true", help="print the report as JSON")
    verify.set_defaults(handler=run)
