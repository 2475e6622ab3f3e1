"""Token trees sized by the measured cost of positions (gamma="auto", specdec/gamma.py tree_nodes)
against the same drafter's whole trees, side by side: each prompt runs plain, then the tree drafter
with trimming, then without (every node the drafter proposes scored), in turn, on one target.
Reports tokens/s over plain (medians, min-max), accepted length tau and nodes scored a round.

With --sweep 1,2,4,8,12 it instead caps every tree at each size in turn (the likeliest nodes, as
trimming keeps them) and plots accepted length and speedup against the tree size (--plot FILE.png).

    .venv/bin/python scripts/bench_tree_size.py [--drafters prompt-lookup-tree,trained-tree]
        [--tasks chat,code-edit,summarise] [--temperatures 0,1] [--prompts 4] [--tokens 128]
        [--sweep 1,2,4,8,12 --plot tree-size.png]
"""

import argparse
import contextlib
import statistics
from unittest import mock

from specdec import SpecDec
from specdec.gamma import GammaPolicy
from specdec.prompts import task_prompts


def whole_tree(self, expected, draft_seconds):
    return len(expected)


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def sweep(args, sizes: list[int]) -> None:
    """Every tree capped at each size in turn: median speedup and tau per (drafter, task, T, size)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    print("| drafter | task | T | " + " | ".join(f"{n} nodes: speedup, tau" for n in sizes) + " |")
    print("|---|---|---|" + "---|" * len(sizes))
    figure, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for name in args.drafters.split(","):
        sd = SpecDec(args.target, drafter=name)
        sd.generate("hi", max_new_tokens=8)
        for task in args.tasks.split(","):
            for temperature in (float(t) for t in args.temperatures.split(",")):
                results: dict[int, list[tuple[float, float]]] = {n: [] for n in sizes}
                for i, prompt in enumerate(task_prompts(task, args.prompts)):
                    options = dict(max_new_tokens=args.tokens, temperature=temperature, seed=None)
                    plain = sd.generate(prompt.text, gamma=0, **options).stats.tokens_per_second
                    for n in sizes if i % 2 == 0 else list(reversed(sizes)):
                        with mock.patch.object(GammaPolicy, "tree_nodes", lambda self, s, d, n=n: min(n, len(s))):
                            stats = sd.generate(prompt.text, **options).stats
                        results[n].append((stats.tokens_per_second / plain, stats.tau or 1.0))
                speedups = [statistics.median(r[0] for r in results[n]) for n in sizes]
                taus = [statistics.median(r[1] for r in results[n]) for n in sizes]
                print(f"| {name} | {task} | {temperature:g} | "
                      + " | ".join(f"{a:.2f}x, {t:.2f}" for a, t in zip(speedups, taus)) + " |", flush=True)
                label = f"{name} {task} T={temperature:g}"
                left.plot(sizes, taus, marker="o", label=label)
                right.plot(sizes, speedups, marker="o", label=label)
    left.set(xlabel="tree nodes scored (at most)", ylabel="accepted length tau (tokens a round)")
    right.set(xlabel="tree nodes scored (at most)", ylabel="speedup over plain")
    right.axhline(1.0, color="grey", linewidth=0.8)
    left.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(args.plot, dpi=120)
    print(f"wrote {args.plot}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="smollm2-135m")
    parser.add_argument("--drafters", default="prompt-lookup-tree,trained-tree")
    parser.add_argument("--tasks", default="chat,code-edit,summarise")
    parser.add_argument("--temperatures", default="0,1")
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--sweep", help="comma-separated tree sizes: cap every tree at each (see above)")
    parser.add_argument("--plot", default="tree-size.png", help="with --sweep: the figure to write")
    args = parser.parse_args()
    if args.sweep:
        sweep(args, [int(n) for n in args.sweep.split(",")])
        return
    print("| drafter | task | T | trimmed: speedup | tau | nodes | whole trees: speedup | tau | nodes |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name in args.drafters.split(","):
        sd = SpecDec(args.target, drafter=name)
        sd.generate("hi", max_new_tokens=8)  # warm up (kernels built, caches touched)
        for task in args.tasks.split(","):
            for temperature in (float(t) for t in args.temperatures.split(",")):
                arms: dict[str, list[tuple[float, float, float]]] = {"trimmed": [], "whole": []}
                for i, prompt in enumerate(task_prompts(task, args.prompts)):
                    options = dict(max_new_tokens=args.tokens, temperature=temperature, seed=None)
                    plain = sd.generate(prompt.text, gamma=0, **options).stats.tokens_per_second
                    for arm in ("trimmed", "whole") if i % 2 == 0 else ("whole", "trimmed"):
                        whole = mock.patch.object(GammaPolicy, "tree_nodes", whole_tree)
                        with whole if arm == "whole" else contextlib.nullcontext():
                            stats = sd.generate(prompt.text, **options).stats
                        rounds = stats.rounds_with_draft or 1
                        arms[arm].append((stats.tokens_per_second / plain, stats.tau or 1.0, stats.drafted / rounds))
                cells = []
                for arm in ("trimmed", "whole"):
                    rows = arms[arm]
                    cells += [spread([r[0] for r in rows]), f"{statistics.median(r[1] for r in rows):.2f}",
                              f"{statistics.median(r[2] for r in rows):.1f}"]
                print(f"| {name} | {task} | {temperature:g} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
