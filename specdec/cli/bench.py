"""`specdec bench`: flags -> BenchConfig, a progress bar, then rows.jsonl, table.md and plots."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..config import SpecConfig
from ..errors import SpecdecError
from ..tasks.prompts import TASKS
from .options import add_model_args, comma_list, output_directory


def peer_list(value: str) -> list[str]:
    from ..bench.runner import PEERS

    names = [] if value.strip() == "none" else [v.strip() for v in value.split(",") if v.strip()]
    unknown = [n for n in names if n not in PEERS]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown peer {unknown[0]!r}: use {', '.join(PEERS)} or none")
    return names


def run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from ..bench.runner import BenchConfig, BenchInterrupted, run_bench

    if args.report:
        from ..bench.report import cross_run_report, read_runs

        print(cross_run_report(read_runs([Path(d) for d in args.report])))
        return 0
    for task in args.tasks:
        if task not in TASKS:
            raise SpecdecError(f"unknown task {task!r}: use {', '.join(TASKS)}")
    for t in args.temperatures:
        if t < 0:
            raise SpecdecError(f"temperatures must be >= 0, got {t}")
    if args.prompts_per_task < 1 or args.max_new_tokens < 1:
        raise SpecdecError(f"--prompts-per-task and --max-new-tokens must be at least 1, got {args.prompts_per_task} "
                           f"and {args.max_new_tokens}")
    config = BenchConfig(target=args.target, drafters=args.drafter or ["prompt-lookup"], tasks=args.tasks,
                         temperatures=args.temperatures, gammas=args.gammas, prompts_per_task=args.prompts_per_task,
                         prompts_file=args.prompts, max_new_tokens=args.max_new_tokens, seed=args.seed,
                         dtype=args.dtype, backend=args.backend, weights=args.weights,
                         peers=() if args.no_peers else tuple(args.peers),
                         coupled=args.coupled)
    if args.quick:
        config.tasks = [t for t in config.tasks if t in ("translate", "code")] or config.tasks[:1]
        config.prompts_per_task, config.temperatures = 1, [0.0]
        config.gammas, config.max_new_tokens = [2, "auto"], min(config.max_new_tokens, 32)
    out = output_directory(args.out)  # before the runs: minutes of them must have somewhere to go
    bar = tqdm(total=1, desc="bench", file=sys.stderr, dynamic_ncols=True)

    def progress(done: int, total: int, what: str) -> None:
        bar.total = total
        bar.n = done
        bar.set_postfix_str(what, refresh=False)
        bar.refresh()

    try:
        rows = run_bench(config, progress, log=lambda message: tqdm.write(f"specdec: {message}", file=sys.stderr))
    except BenchInterrupted as stopped:  # write what finished, then report why it stopped
        bar.close()
        if stopped.rows:
            _write(stopped.rows, out)
        kept = f"the {len(stopped.rows)} rows it finished are in {out}" if stopped.rows else "no row had finished"
        if isinstance(stopped.cause, KeyboardInterrupt):
            print(f"\nspecdec: interrupted; {kept}", file=sys.stderr)
            return 130
        raise SpecdecError(f"{stopped.cause} (the bench stopped there; {kept})") from None
    bar.close()
    _write(rows, out)
    return 0


def _write(rows: list[dict], out: Path) -> None:
    """rows.jsonl, table.md and the plots into `out`; the table on stdout."""
    from ..bench.report import markdown_table, plot
    from ..bench.runner import write_rows

    write_rows(rows, out / "rows.jsonl")
    table = markdown_table(rows)
    (out / "table.md").write_text(table)
    plots = plot(rows, out)
    print(table)
    print(f"wrote {out / 'rows.jsonl'}, {out / 'table.md'}, " + ", ".join(str(p) for p in plots), file=sys.stderr)


def register(sub) -> None:
    bench = sub.add_parser("bench", help="reproduce the paper's experiments on this machine, with peers")
    add_model_args(bench, repeat_drafter=True)
    bench.add_argument("--tasks", type=comma_list(), default=list(TASKS), help="comma-separated (default: all)")
    bench.add_argument("--temperatures", type=comma_list(float), default=[0.0, 1.0])
    bench.add_argument("--gammas", type=comma_list(SpecConfig.parse_gamma), default=[1, 2, 4, 8, "auto"])
    bench.add_argument("--prompts-per-task", type=int, default=3)
    bench.add_argument("--prompts", default=None, metavar="FILE.jsonl", help="your own prompts instead of the task sets")
    bench.add_argument("--max-new-tokens", type=int, default=128)
    bench.add_argument("--seed", type=int, default=0)
    bench.add_argument("--peers", type=peer_list, default="hf,llama.cpp", metavar="LIST",
                       help="comma-separated peers measured beside specdec: hf (transformers' generate()), "
                            "llama.cpp (on a GGUF target's file; needs pip install -e '.[llama-cpp]'), "
                            "llama-server (llama.cpp's server on the same file, plain and its --spec-type ngram-simple "
                            "and ngram-mod, and --spec-draft-model with a model:FILE.gguf drafter; SPECDEC_LLAMA_SERVER "
                            "or PATH), or none (default: hf,llama.cpp)")
    bench.add_argument("--no-peers", action="store_true", help="the same as --peers none")
    bench.add_argument("--coupled", action="store_true",
                       help="also run each drafter at T > 0 with drafter-invariant sampling (seeded requests' rule), "
                            "to show what the coupling costs in acceptance")
    bench.add_argument("--quick", action="store_true", help="a small run CI can afford")
    bench.add_argument("--out", default="bench-out", help="output directory (default: %(default)s)")
    bench.add_argument("--report", action="append", metavar="DIR",
                       help="run nothing: print the rows of the bench runs in DIR (every rows.jsonl below it; "
                            "repeatable) as one Markdown table per CPU kind, each row naming its commit and date")
    bench.set_defaults(handler=run)
