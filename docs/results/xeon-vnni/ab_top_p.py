"""How the top-p figures were measured: the whole-vocabulary sort (the code before 4656de9) against the
likeliest candidates, alternating per prompt in one process, T = 0.7, top-p 0.9, unseeded, 128 tokens. Run
from the repository root:

    .venv/bin/python docs/results/xeon-vnni/ab_top_p.py [smollm2-135m|gemma3-270m]
"""

import statistics
import sys

import torch

import specdec.drafters.trained as trained
import specdec.engine as engine_module
import specdec.sampling as sampling
from specdec import SpecDec
from specdec.prompts import task_prompts

CANDIDATES = sampling.probs


def whole_sort(logits, params):
    scores = logits.float() / params.temperature
    if params.top_k and params.top_k < scores.shape[-1]:
        kth = torch.topk(scores, params.top_k, dim=-1).values[..., -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_scores, order = torch.sort(scores, dim=-1, descending=True)
        sorted_probs = sorted_scores.softmax(dim=-1)
        drop_sorted = sorted_probs.cumsum(dim=-1) - sorted_probs >= params.top_p
        scores = scores.masked_fill(torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted), float("-inf"))
    return scores.softmax(dim=-1)


def use(probs) -> None:
    for module in (sampling, engine_module, trained):
        module.probs = probs


def main() -> None:
    target = sys.argv[1] if len(sys.argv) > 1 else "smollm2-135m"
    engines = {d: SpecDec(target=target, drafter=d) for d in ("none", "auto")}
    prompts = [p.text for p in task_prompts("chat", 4, seed=0)] + [p.text for p in task_prompts("code", 3, seed=0)]
    for engine in engines.values():
        engine.generate(prompts[0], max_new_tokens=8, temperature=0.7, top_p=0.9)
    rates: dict = {}
    for prompt in prompts:
        for order in ((False, True), (True, False)):
            for new in order:
                use(CANDIDATES if new else whole_sort)
                for name, engine in engines.items():
                    stats = engine.generate(prompt, max_new_tokens=128, temperature=0.7, top_p=0.9).stats
                    rates.setdefault((name, new), []).append(stats.tokens_per_second)
    for name in engines:
        old, new = rates[(name, False)], rates[(name, True)]
        ratios = [b / a for a, b in zip(old, new)]
        print(f"{name}: whole sort {statistics.median(old):.0f} tok/s, candidates {statistics.median(new):.0f} tok/s, "
              f"paired median {statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})")
    for new in (False, True):
        over = statistics.median(a / b for a, b in zip(rates[("auto", new)], rates[("none", new)]))
        print(f"  auto over plain ({'candidates' if new else 'whole sort'}): {over:.2f}x")


if __name__ == "__main__":
    main()
