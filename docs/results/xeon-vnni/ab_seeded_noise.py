"""How the seeded-sampling figures were measured: torch's exponential noise (the code before 8b439f8) against
NumPy's, alternating per prompt in one process, T = 1, 128 tokens. Run from the repository root:

    .venv/bin/python docs/results/xeon-vnni/ab_seeded_noise.py
"""

import statistics

import torch

import specdec.sampling as sampling
from specdec import SpecDec
from specdec.prompts import task_prompts

NUMPY_NOISE = sampling._noise


def torch_noise(seed: int, position: int, vocab: int):
    key = (seed * 0x9E3779B97F4A7C15 + (position + 1) * 0xBF58476D1CE4E5B9) & sampling._MASK
    key ^= key >> 31
    generator = torch.Generator().manual_seed(key)
    return torch.empty(vocab, dtype=torch.float64).exponential_(generator=generator).numpy()


def main() -> None:
    engines = {d: SpecDec(target="smollm2-135m", drafter=d) for d in ("none", "auto", "trained")}
    prompts = [p.text for p in task_prompts("chat", 5, seed=0)] + [p.text for p in task_prompts("code", 3, seed=0)]
    for engine in engines.values():
        engine.generate(prompts[0], max_new_tokens=8, temperature=1.0, seed=0)
    rates: dict = {}
    for prompt in prompts:
        for rep, order in enumerate(((False, True), (True, False))):
            for new in order:
                sampling._noise = NUMPY_NOISE if new else torch_noise
                for name, engine in engines.items():
                    stats = engine.generate(prompt, max_new_tokens=128, temperature=1.0, seed=7 + rep).stats
                    rates.setdefault((name, new), []).append(stats.tokens_per_second)
    for name in engines:
        old, new = rates[(name, False)], rates[(name, True)]
        ratios = [b / a for a, b in zip(old, new)]
        print(f"{name}: torch noise {statistics.median(old):.0f} tok/s, numpy noise {statistics.median(new):.0f} tok/s, "
              f"paired median {statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})")


if __name__ == "__main__":
    main()
