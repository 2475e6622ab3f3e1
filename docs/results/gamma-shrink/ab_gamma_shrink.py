"""gamma=auto as it is (acceptance per depth, shrunk toward the long-run mean carried across generations)
against the policy before (one recent-weighted alpha, commit eb62742's specdec/gamma.py, loaded from git),
interleaved per prompt in one process, the order alternating; a fixed gamma = 1 beside them. (Until commit
1b95e85 the fixed gamma ran at T > 0 only.) Paired
medians of tok/s over plain decoding, target calls and the share of rounds without a draft.

    .venv/bin/python docs/results/gamma-shrink/ab_gamma_shrink.py chat 1.0 auto 2   # task, T, drafter, repeats
"""

import importlib.util
import statistics
import subprocess
import sys

import specdec.engine
from specdec import SpecDec
from specdec.gamma import GammaPolicy
from specdec.prompts import task_prompts

BEFORE = "eb62742"


def policy_before() -> type:
    source = subprocess.run(["git", "show", f"{BEFORE}:specdec/gamma.py"], capture_output=True, text=True,
                            check=True).stdout
    spec = importlib.util.spec_from_loader("specdec.gamma_before", loader=None)
    module = importlib.util.module_from_spec(spec)
    module.__package__ = "specdec"
    exec(compile(source, "gamma_before.py", "exec"), module.__dict__)

    class Before(module.GammaPolicy):
        def __init__(self, spec, prior_c, fast_rows=None, history=None, regime=None):
            super().__init__(spec, prior_c, fast_rows)

        def observe(self, drafted, accepted, draft_seconds, target_seconds, depth=None):
            super().observe(drafted, accepted, draft_seconds, target_seconds)

        def commit(self):
            pass

    return Before


def main() -> None:
    task = sys.argv[1] if len(sys.argv) > 1 else "chat"
    temperature = float(sys.argv[2]) if len(sys.argv) > 2 else 1.0
    drafter = sys.argv[3] if len(sys.argv) > 3 else "auto"
    repeats = int(sys.argv[4]) if len(sys.argv) > 4 else 2
    plain = SpecDec(target="smollm2-135m", drafter="none")
    spec = SpecDec(target="smollm2-135m", drafter=drafter)
    prompts = [p.text for p in task_prompts(task, 5, seed=0)]
    plain.generate(prompts[0], max_new_tokens=16)  # warm-up
    spec.generate(prompts[0], max_new_tokens=16)
    variants = {"before": (policy_before(), "auto"), "now": (GammaPolicy, "auto"), "gamma1": (GammaPolicy, 1)}
    rates: dict[str, list[float]] = {"plain": [], **{name: [] for name in variants}}
    calls: dict[str, list[int]] = {name: [] for name in variants}
    zeros: dict[str, list[float]] = {name: [] for name in variants}
    for r in range(repeats):
        for i, p in enumerate(prompts):
            rates["plain"].append(plain.generate(p, max_new_tokens=128, temperature=temperature).stats.tokens_per_second)
            order = list(variants) if (i + r) % 2 == 0 else list(reversed(variants))
            for name in order:
                policy, gamma = variants[name]
                specdec.engine.GammaPolicy = policy
                s = spec.generate(p, max_new_tokens=128, temperature=temperature, gamma=gamma).stats
                rates[name].append(s.tokens_per_second)
                calls[name].append(s.target_calls)
                zeros[name].append(1.0 - s.rounds_with_draft / max(1, s.target_calls))
    specdec.engine.GammaPolicy = GammaPolicy
    print(f"task {task}, T = {temperature}, drafter {drafter}, {len(prompts)} prompts x {repeats}")
    for name, values in rates.items():
        print(f"{name:7s} tok/s median {statistics.median(values):6.1f}  ", [round(x) for x in values])
    for name in variants:
        paired = [a / b for a, b in zip(rates[name], rates["plain"])]
        print(f"{name:7s} / plain paired median {statistics.median(paired):.3f} ({min(paired):.2f}-{max(paired):.2f}),"
              f" target calls {sum(calls[name])}, rounds without a draft {statistics.mean(zeros[name]):.2f}")
    paired = [a / b for a, b in zip(rates["now"], rates["before"])]
    print(f"now / before paired median {statistics.median(paired):.3f} ({min(paired):.2f}-{max(paired):.2f})")


if __name__ == "__main__":
    main()
