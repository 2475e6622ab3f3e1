"""T = 1 on the shipped drafter, interleaved in one process: plain (no drafter), the drafter attached with
gamma = 0, and gamma = auto; tok/s per generation and paired medians over plain.

    .venv/bin/python docs/results/drafter-vnni/t1_overhead.py chat   # or code
"""

import statistics
import sys

from specdec import SpecDec
from specdec.prompts import task_prompts


def main() -> None:
    task = sys.argv[1] if len(sys.argv) > 1 else "chat"
    plain = SpecDec(target="smollm2-135m", drafter="none")
    spec = SpecDec(target="smollm2-135m", drafter="trained")
    prompts = [p.text for p in task_prompts(task, 5, seed=0)]
    plain.generate(prompts[0], max_new_tokens=16)  # warm-up
    spec.generate(prompts[0], max_new_tokens=16)
    rates = {"plain": [], "gamma0": [], "auto": []}
    rounds = []
    for _ in range(2):
        for p in prompts:
            rates["plain"].append(plain.generate(p, max_new_tokens=128, temperature=1.0).stats.tokens_per_second)
            rates["gamma0"].append(spec.generate(p, max_new_tokens=128, temperature=1.0, gamma=0).stats.tokens_per_second)
            s = spec.generate(p, max_new_tokens=128, temperature=1.0).stats
            rates["auto"].append(s.tokens_per_second)
            rounds.append((s.new_tokens, s.target_calls, s.drafted, round(s.draft_seconds, 3), round(s.target_seconds, 3),
                           round(s.decode_seconds, 3)))
    for name, values in rates.items():
        print(name, f"median {statistics.median(values):.1f}", [round(x) for x in values])
    for name in ("gamma0", "auto"):
        paired = statistics.median(a / b for a, b in zip(rates[name], rates["plain"]))
        print(name, "/ plain paired median", round(paired, 3))
    print("auto: (new tokens, target calls, drafted, draft s, target s, decode s)", rounds)


if __name__ == "__main__":
    main()
