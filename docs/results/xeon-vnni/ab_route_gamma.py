"""How the per-route gamma figures were measured: `auto` (prompt lookup else the trained drafter) with
gamma="auto" sizing each route's rounds by its own record (GammaPolicy.select) against one record for
both (select made a no-op: the code before it), alternating per prompt in one process, T = 0, 128
tokens. Run from the repository root:

    .venv/bin/python docs/results/xeon-vnni/ab_route_gamma.py [tasks]
"""

import statistics
import sys

from specdec import SpecDec
from specdec.gamma import GammaPolicy
from specdec.prompts import task_prompts

PER_ROUTE = GammaPolicy.select


def shared(self, route, prior_c=None) -> None:
    """One record for every route."""


def main() -> None:
    tasks = (sys.argv[1] if len(sys.argv) > 1 else "summarise,code-edit,translate,code,chat").split(",")
    auto = SpecDec(target="smollm2-135m", drafter="auto")
    auto.generate("Say hello.", max_new_tokens=8)
    for task in tasks:
        rates: dict = {True: [], False: []}
        calls: dict = {True: 0, False: 0}
        for prompt in task_prompts(task, 5, seed=0):
            texts = {}
            for order in ((False, True), (True, False)):
                for routed in order:
                    GammaPolicy.select = PER_ROUTE if routed else shared
                    result = auto.generate(prompt.text, max_new_tokens=128)
                    rates[routed].append(result.stats.tokens_per_second)
                    calls[routed] += result.stats.target_calls
                    texts[routed] = result.text
            assert texts[True] == texts[False]  # greedy: the same text either way
        ratios = [b / a for a, b in zip(rates[False], rates[True])]
        print(f"{task}: one record {statistics.median(rates[False]):.0f} tok/s ({calls[False] // 2} target calls), "
              f"per route {statistics.median(rates[True]):.0f} tok/s ({calls[True] // 2} calls), "
              f"paired median {statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})", flush=True)


if __name__ == "__main__":
    main()
