"""What a round costs on the shipped drafter, measured directly: plain decoding and the drafter at fixed
gamma 0, 1, 2, 3, interleaved per prompt; per variant the paired tok/s over plain, the target seconds
per call (over plain's), the draft seconds per drafted token (over plain's step) and what the decode
loop spent outside both.

    .venv/bin/python docs/results/gamma-shrink/round_costs.py chat 0   # task, temperature
"""

import statistics
import sys

from specdec import SpecDec
from specdec.prompts import task_prompts


def main() -> None:
    task = sys.argv[1] if len(sys.argv) > 1 else "chat"
    temperature = float(sys.argv[2]) if len(sys.argv) > 2 else 0.0
    plain = SpecDec(target="smollm2-135m", drafter="none")
    spec = SpecDec(target="smollm2-135m", drafter="trained")
    prompts = [p.text for p in task_prompts(task, 5, seed=0)]
    plain.generate(prompts[0], max_new_tokens=16)
    spec.generate(prompts[0], max_new_tokens=16)
    gammas = (0, 1, 2, 3)
    rows: dict = {name: [] for name in ["plain", *gammas]}
    for r in range(2):
        for p in prompts:
            rows["plain"].append(plain.generate(p, max_new_tokens=128, temperature=temperature).stats)
            for g in gammas if r % 2 == 0 else reversed(gammas):
                rows[g].append(spec.generate(p, max_new_tokens=128, temperature=temperature, gamma=g).stats)
    base = rows["plain"]
    step = [s.target_seconds / s.target_calls for s in base]
    print(f"task {task}, T = {temperature}, {len(prompts)} prompts x 2; plain step median {1e3 * statistics.median(step):.2f} ms")
    for name in gammas:
        stats = rows[name]
        speed = statistics.median(s.tokens_per_second / b.tokens_per_second for s, b in zip(stats, base))
        per_call = statistics.median(s.target_seconds / s.target_calls / st for s, st in zip(stats, step))
        c = statistics.median(s.draft_seconds / s.drafted / st for s, st in zip(stats, step)) if name else 0.0
        other = statistics.median((s.decode_seconds - s.target_seconds - s.draft_seconds) / s.target_calls / st
                                  for s, st in zip(stats, step))
        tau = sum(s.new_tokens for s in stats) / sum(s.target_calls for s in stats)
        print(f"gamma {name}: {speed:.3f}x plain, tokens a call {tau:.2f}, target call {per_call:.2f} steps, "
              f"draft {c:.3f} steps a token, outside both {other:.3f} steps a call")
    other = statistics.median((s.decode_seconds - s.target_seconds) / s.target_calls / st for s, st in zip(base, step))
    print(f"plain: outside the target {other:.3f} steps a call")


if __name__ == "__main__":
    main()
