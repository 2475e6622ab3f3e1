"""Drafters (and fixed gammas) side by side on one task, interleaved per prompt in one process, the order
alternating: tok/s paired over plain decoding (median, min-max), tokens a target call.

    .venv/bin/python docs/results/gamma-shrink/side_by_side.py chat 0 auto trained trained@1   # DRAFTER[@GAMMA]
"""

import statistics
import sys

from specdec import SpecDec
from specdec.prompts import task_prompts


def main() -> None:
    task, temperature = sys.argv[1], float(sys.argv[2])
    names = sys.argv[3:] or ["auto", "trained"]
    runs = {}
    for name in names:
        drafter, _, gamma = name.partition("@")
        runs[name] = (SpecDec(target="smollm2-135m", drafter=drafter), int(gamma) if gamma else "auto")
    plain = SpecDec(target="smollm2-135m", drafter="none")
    prompts = [p.text for p in task_prompts(task, 5, seed=0)]
    for api, _ in [*runs.values(), (plain, 0)]:
        api.generate(prompts[0], max_new_tokens=16)  # warm-up
    rates: dict[str, list[float]] = {name: [] for name in ["plain", *names]}
    calls: dict[str, list[tuple[int, int]]] = {name: [] for name in names}
    for r in range(2):
        for i, prompt in enumerate(prompts):
            rates["plain"].append(plain.generate(prompt, max_new_tokens=128, temperature=temperature).stats.tokens_per_second)
            for name in names if (i + r) % 2 == 0 else list(reversed(names)):
                api, gamma = runs[name]
                s = api.generate(prompt, max_new_tokens=128, temperature=temperature, gamma=gamma).stats
                rates[name].append(s.tokens_per_second)
                calls[name].append((s.new_tokens, s.target_calls))
    print(f"task {task}, T = {temperature}, {len(prompts)} prompts x 2, 128 tokens; plain median "
          f"{statistics.median(rates['plain']):.1f} tok/s")
    for name in names:
        paired = [a / b for a, b in zip(rates[name], rates["plain"])]
        tokens, target_calls = (sum(x) for x in zip(*calls[name]))
        print(f"{name:20s} {statistics.median(paired):.3f}x plain ({min(paired):.2f}-{max(paired):.2f}), "
              f"{tokens / target_calls:.2f} tokens a target call")


if __name__ == "__main__":
    main()
