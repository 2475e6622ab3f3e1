"""A shipped drafter's acceptance in the engine at T > 0 against its own drafting temperature
(DraftConfig.draft_temperature, which exists at commit 2370c64 only: the experiment was reverted after this
measurement; run it there): fixed gamma = 1, the same seeded requests for each temperature; accepted
drafts over drafted ones, the mean Σmin(p, q) of the drafted positions (the acceptance each draw had, less
noisy than the draws), and tok/s paired over the untempered drafter (temperatures interleaved per prompt).

    .venv/bin/python docs/results/draft-temperature/engine_acceptance.py smollm2-135m chat 1.0 1.0 0.8 0.7 0.6
    # target, task, request temperature, then the drafting temperatures
"""

import statistics
import sys

from specdec import SpecDec
from specdec.prompts import task_prompts


def main() -> None:
    target, task, temperature = sys.argv[1], sys.argv[2], float(sys.argv[3])
    grid = [float(t) for t in sys.argv[4:]] or [1.0, 0.7]
    top_p = 0.9 if temperature < 1.0 else 1.0
    spec = SpecDec(target=target, drafter="trained")
    config = spec.engine.drafter.net.config
    prompts = [p.text for p in task_prompts(task, 20, seed=0)]
    spec.generate(prompts[0], max_new_tokens=16)
    counts = {t: [0, 0, 0.0, 0] for t in grid}
    rates: dict[float, list[float]] = {t: [] for t in grid}
    for i, prompt in enumerate(prompts):
        for t in grid if i % 2 == 0 else reversed(grid):
            config.draft_temperature = t
            s = spec.generate(prompt, max_new_tokens=128, temperature=temperature, top_p=top_p, seed=i, gamma=1,
                              drafter_invariant=False).stats
            counts[t][0] += s.accepted
            counts[t][1] += s.drafted
            counts[t][2] += s.beta_sum
            counts[t][3] += s.beta_count
            rates[t].append(s.tokens_per_second)
    print(f"{target}, {task}, T = {temperature}, top-p {top_p}, gamma = 1, {len(prompts)} prompts x 128 tokens")
    for t in grid:
        paired = [a / b for a, b in zip(rates[t], rates[grid[0]])]
        print(f"draft temperature {t}: accepted {counts[t][0]} / {counts[t][1]} = {counts[t][0] / counts[t][1]:.3f}, "
              f"Σmin(p,q) {counts[t][2] / max(1, counts[t][3]):.3f}, "
              f"tok/s over {grid[0]}: {statistics.median(paired):.3f} ({min(paired):.2f}-{max(paired):.2f})")


if __name__ == "__main__":
    main()
