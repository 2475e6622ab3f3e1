"""Two trained drafters side by side in the engine: plain decoding, then each drafter (as `trained:DIR`, or
inside `auto` at T = 0, lookup-else-trained) on the same prompts, interleaved per prompt with the order
alternating; paired medians of tok/s over plain, and α, τ a round and c per drafter.

    .venv/bin/python docs/results/drafter-long/ab_drafters.py specdec/data/drafters/smollm2-135m \
        /tmp/runs/eagle-long chat 0 auto 2
    # drafter dirs A and B, task, T, gamma (auto or an integer), repeats; add "router" to run them inside auto
"""

import statistics
import sys

from specdec import SpecDec
from specdec.prompts import task_prompts


def main() -> None:
    a, b, task = sys.argv[1], sys.argv[2], sys.argv[3]
    temperature = float(sys.argv[4]) if len(sys.argv) > 4 else 0.0
    gamma = sys.argv[5] if len(sys.argv) > 5 else "auto"
    gamma = gamma if gamma == "auto" else int(gamma)
    repeats = int(sys.argv[6]) if len(sys.argv) > 6 else 2
    router = len(sys.argv) > 7 and sys.argv[7] == "router"
    plain = SpecDec(target="smollm2-135m", drafter="none")
    kind = "lookup-else-trained" if router else "trained"
    spec = {"A": SpecDec(target="smollm2-135m", drafter=f"{kind}:{a}"),
            "B": SpecDec(target="smollm2-135m", drafter=f"{kind}:{b}")}
    prompts = [p.text for p in task_prompts(task, 5, seed=0)]
    plain.generate(prompts[0], max_new_tokens=16)
    for s in spec.values():
        s.generate(prompts[0], max_new_tokens=16)
    rates: dict[str, list[float]] = {"plain": [], "A": [], "B": []}
    stats: dict[str, list] = {"A": [], "B": []}
    for r in range(repeats):
        for i, p in enumerate(prompts):
            rates["plain"].append(plain.generate(p, max_new_tokens=128, temperature=temperature).stats.tokens_per_second)
            for name in ("A", "B") if (i + r) % 2 == 0 else ("B", "A"):
                st = spec[name].generate(p, max_new_tokens=128, temperature=temperature, gamma=gamma).stats
                rates[name].append(st.tokens_per_second)
                stats[name].append(st)
    print(f"task {task}, T = {temperature}, gamma {gamma}, {kind}, {len(prompts)} prompts x {repeats}; A = {a}, B = {b}")
    for name, values in rates.items():
        print(f"{name:5s} tok/s median {statistics.median(values):6.1f}  ", [round(x) for x in values])
    for name in ("A", "B"):
        paired = [x / y for x, y in zip(rates[name], rates["plain"])]
        drafted = sum(s.drafted for s in stats[name])
        accepted = sum(s.accepted for s in stats[name])
        calls = sum(s.target_calls for s in stats[name])
        tokens = sum(s.new_tokens for s in stats[name])
        first = sum(s.position_accepted[0] for s in stats[name] if s.position_tested) / max(
            1, sum(s.position_tested[0] for s in stats[name] if s.position_tested))
        costs = [s.c for s in stats[name] if s.c is not None]
        c = statistics.median(costs) if costs else float("nan")
        print(f"{name} / plain paired median {statistics.median(paired):.3f} ({min(paired):.2f}-{max(paired):.2f}); "
              f"accepted {accepted}/{drafted} = {accepted / max(1, drafted):.3f}, first draft {first:.3f}, "
              f"tokens a call {tokens / calls:.2f}, c {c:.3f}")
    paired = [x / y for x, y in zip(rates["B"], rates["A"])]
    print(f"B / A paired median {statistics.median(paired):.3f} ({min(paired):.2f}-{max(paired):.2f})")


if __name__ == "__main__":
    main()
