"""Two trained drafters' acceptance in the engine (no timing): each drafter at a fixed gamma = 3 on the same
prompts, 128 new tokens; at T = 0 the accepted share by draft position (the target's greedy path decides, so
runs are deterministic), at T = 1 the mean Σmin(p, q) at each drafted position (each draw's chance of being
accepted, less noisy than the draws).

    .venv/bin/python docs/results/drafter-long/engine_acceptance_ab.py specdec/data/drafters/smollm2-135m \\
        /tmp/runs/eagle-long chat 30
"""

import sys

from specdec import SpecDec
from specdec.prompts import task_prompts


def main() -> None:
    dirs, task, count = sys.argv[1:3], sys.argv[3], int(sys.argv[4]) if len(sys.argv) > 4 else 20
    prompts = [p.text for p in task_prompts(task, count, seed=0)]
    print(f"task {task}, {len(prompts)} prompts, gamma 3, 128 new tokens")
    for directory in dirs:
        spec = SpecDec(target="smollm2-135m", drafter=f"trained:{directory}")
        for temperature in (0.0, 1.0):
            tested, accepted, beta = [0] * 3, [0] * 3, [0.0] * 3
            for prompt in prompts:
                s = spec.generate(prompt, max_new_tokens=128, temperature=temperature, gamma=3).stats
                for d in range(min(3, len(s.position_tested))):
                    tested[d] += s.position_tested[d]
                    accepted[d] += s.position_accepted[d]
                    if d < len(s.position_beta_sum):
                        beta[d] += s.position_beta_sum[d]
            if temperature == 0.0:
                shown = [round(a / max(1, t), 4) for a, t in zip(accepted, tested)]
                print(f"{directory}: T = 0 accepted by position {shown} (tested {tested})")
            else:
                shown = [round(b / max(1, t), 4) for b, t in zip(beta, tested)]
                print(f"{directory}: T = 1 mean Σmin(p, q) by position {shown} (tested {tested})")


if __name__ == "__main__":
    main()
