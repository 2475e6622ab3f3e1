"""Token trees sized by the measured cost of positions (gamma="auto", specdec/gamma.py tree_nodes)
against the same drafter's whole trees, side by side: each prompt runs plain, then the tree drafter
with trimming, then without (every node the drafter proposes scored), in turn, on one target.
Reports tokens/s over plain (medians, min-max), accepted length tau and nodes scored a round.

    .venv/bin/python scripts/bench_tree_size.py [--drafters prompt-lookup-tree,trained-tree]
        [--tasks chat,code-edit,summarise] [--temperatures 0,1] [--prompts 4] [--tokens 128]
"""

import argparse
import statistics
from unittest import mock

from specdec import SpecDec
from specdec.gamma import GammaPolicy
from specdec.prompts import task_prompts


def whole_tree(self, scores, draft_seconds):
    return len(scores)


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="smollm2-135m")
    parser.add_argument("--drafters", default="prompt-lookup-tree,trained-tree")
    parser.add_argument("--tasks", default="chat,code-edit,summarise")
    parser.add_argument("--temperatures", default="0,1")
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=128)
    args = parser.parse_args()
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
                        patch = mock.patch.object(GammaPolicy, "tree_nodes", whole_tree) if arm == "whole" else None
                        if patch:
                            patch.start()
                        try:
                            stats = sd.generate(prompt.text, **options).stats
                        finally:
                            if patch:
                                patch.stop()
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
