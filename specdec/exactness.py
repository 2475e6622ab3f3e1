"""Statistics for checking that speculative sampling follows the target's law.

Distances are total variation, TV(a, b) = ½ Σ |a(x) - b(x)|. Thresholds are derived, not tuned:

- one sample of N draws from a known law P: E[TV(P̂, P)] ≤ ½ Σ_x sqrt(P(x)(1 - P(x)) / N)
  (Jensen on each |P̂(x) - P(x)|), and TV moves by at most 1/N when one draw changes, so by
  McDiarmid TV(P̂, P) exceeds its mean by t with probability ≤ exp(-2 N t²). The check fails when
  TV > mean bound + sqrt(ln(1/δ) / (2N)): a false alarm has probability ≤ δ.
- two samples of N1 and N2 draws from one unknown law: the same argument with the triangle
  inequality through the common law, estimated by the pooled sample; McDiarmid with 1/N1 and 1/N2.

Power: a law at TV distance D from the reference is caught (with probability ≥ 1 - δ) once
D > threshold + mean bound, which `detectable_tv` reports.

Example: a fair coin sampled N = 10,000 times: the mean bound is ½·2·sqrt(0.25/10⁴) = 0.005 and
with δ = 10⁻³ the slack is sqrt(ln 1000 / 20000) = 0.0186, so TV above 0.0236 fails.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import asdict, dataclass

import torch


def tv_distance(a: dict, b: dict) -> float:
    """½ Σ |a(x) - b(x)| for laws given as {outcome: probability}."""
    return 0.5 * sum(abs(a.get(x, 0.0) - b.get(x, 0.0)) for x in set(a) | set(b))


def empirical(counts: Counter) -> dict:
    total = sum(counts.values())
    return {x: c / total for x, c in counts.items()}


def mean_tv_bound(law: dict, n: int) -> float:
    """Upper bound on E[TV(P̂_n, P)] for n draws from P."""
    return 0.5 * sum(math.sqrt(p * (1 - p) / n) for p in law.values())


@dataclass
class TVCheck:
    name: str
    distance: float
    threshold: float
    detectable_tv: float
    samples: int
    support: int
    delta: float

    @property
    def passed(self) -> bool:
        return self.distance <= self.threshold

    def to_dict(self) -> dict:
        return {**asdict(self), "passed": self.passed}


OTHER = ("<other>",)
"""The bucket rare outcomes are merged into: testing a coarser partition keeps a true null true,
and without it the thousands of tail tokens of a real vocabulary would swamp the bound."""


def coarsen(law: dict, keep: set) -> dict:
    out = {x: v for x, v in law.items() if x in keep}
    rest = sum(v for x, v in law.items() if x not in keep)
    if rest > 0:
        out[OTHER] = out.get(OTHER, 0) + rest
    return out


def one_sample_check(name: str, counts: Counter, law: dict, delta: float = 1e-3, min_expected: float = 5.0) -> TVCheck:
    """Draws `counts` against the exact law P (outcomes with N·P < min_expected merged)."""
    n = sum(counts.values())
    keep = {x for x, p in law.items() if n * p >= min_expected}
    law_c, emp_c = coarsen(law, keep), coarsen(empirical(counts), keep)
    bound = mean_tv_bound(law_c, n)
    threshold = bound + math.sqrt(math.log(1 / delta) / (2 * n))
    return TVCheck(name, tv_distance(emp_c, law_c), threshold, threshold + bound, n, len(law_c), delta)


def two_sample_check(name: str, counts_a: Counter, counts_b: Counter, delta: float = 1e-3, min_count: int = 10) -> TVCheck:
    """Two samples that should come from the same law (outcomes seen < min_count times in the
    pooled sample merged)."""
    n_a, n_b = sum(counts_a.values()), sum(counts_b.values())
    pooled_counts = counts_a + counts_b
    keep = {x for x, c in pooled_counts.items() if c >= min_count}
    pooled = coarsen(empirical(pooled_counts), keep)
    bound = mean_tv_bound(pooled, n_a) + mean_tv_bound(pooled, n_b)
    threshold = bound + math.sqrt(math.log(1 / delta) * (1 / n_a + 1 / n_b) / 2)
    distance = tv_distance(coarsen(empirical(counts_a), keep), coarsen(empirical(counts_b), keep))
    return TVCheck(name, distance, threshold, threshold + bound, n_a + n_b, len(pooled), delta)


def sample_continuations(engine, prompt_ids: list[int], k: int, sampling, gamma, n: int, seed: int,
                         stats_sink: list | None = None) -> Counter:
    """Counts of the first k tokens (fewer if EOS comes first) of n generations with seeds seed,
    seed+1, ... Each generation may run past k (max_new_tokens = k + gamma) so that the verifier
    really decides on drafts even for k = 1; a truncated exact sample path is still exact."""
    from dataclasses import replace

    from .config import SpecConfig

    extra = gamma if isinstance(gamma, int) else 16
    spec = SpecConfig(gamma=gamma, max_new_tokens=k + extra)
    counts: Counter = Counter()
    for i in range(n):
        run = engine.generate(prompt_ids, replace(sampling, seed=seed + i), spec)
        tokens: list[int] = []
        for chunk in run:
            tokens.extend(chunk)
            if len(tokens) >= k:
                break
        run.close()
        counts[tuple(tokens[:k])] += 1
        if stats_sink is not None:
            stats_sink.append(run.stats)
    return counts


@torch.inference_mode()
def exact_continuation_law(model, prompt_ids: list[int], k: int, sampling, vocab_limit: int = 4096) -> dict:
    """The target's exact law of its k-token continuation, by enumeration (small vocabularies only:
    vocab^(k-1) sequences are scored)."""
    from .sampling import probs

    vocab = model.get_output_embeddings().weight.shape[0]
    if vocab ** (k - 1) > vocab_limit:
        raise ValueError(f"enumerating {vocab}^{k - 1} prefixes is too much; use k = 1 or a smaller model")
    prefixes = torch.cartesian_prod(*[torch.arange(vocab)] * (k - 1)).reshape(-1, k - 1) if k > 1 else torch.zeros(1, 0, dtype=torch.long)
    inputs = torch.cat([torch.tensor(prompt_ids).expand(len(prefixes), -1), prefixes], dim=1)  # (M, P+k-1)
    logits = model(input_ids=inputs).logits[:, len(prompt_ids) - 1 :].float()  # (M, k, V)
    dist = probs(logits.reshape(-1, vocab), sampling).reshape(len(prefixes), k, vocab).double()
    law = {}
    for row, prefix in enumerate(prefixes.tolist()):
        head = 1.0
        for i, token in enumerate(prefix):
            head *= float(dist[row, i, token])
        if head == 0:
            continue
        for token, p in enumerate(dist[row, k - 1].tolist()):
            if p > 0:
                law[tuple(prefix) + (token,)] = head * p
    return law
