"""Statistics for checking that speculative sampling follows the target's law.

Every check is a hypothesis test with a p-value, and one run's tests form one family whose
false-alarm rate is held at α (default 10⁻³) by Holm's step-down correction. The tests:

- `goodness_of_fit`: counts against an exactly known law (the first token against the target's
  warped next-token distribution): Pearson's χ² with cells of expected count < 5 pooled.
- `homogeneity`: two samples that should share an unknown law (k-token continuations, speculative
  vs plain): χ² on the 2 × C table, cells seen < 10 times in the pooled sample pooled. Both pooling
  rules are fixed before looking and read only what is the same under the null (the law, or the
  pooled counts), so they keep a true null true.
- `uniformity`: randomised probability integral transforms, u = P(Y before x) + U·p(x) with the
  target's tokens ordered by probability, are i.i.d. uniform when every emitted token follows the
  target's law given its prefix (Rosenblatt). This looks at every token of long continuations:
  later rounds, bonus tokens, rollback, a drafter's catch-up. χ² on equal-width bins.
- `acceptance_z`: accepted drafts at one draft position against Σβ, β = Σ min(p, q), the
  acceptance probability the verifier itself reports; (A − Σβ) / sqrt(Σβ(1 − β)) is normal where
  Σβ(1 − β) is large enough, and bounded by Freedman's inequality where it is not.

Power is measured, not bounded: `detectable_tv` simulates the test on laws at total-variation
distance d from the measured one, in the direction that is hardest for χ² (mass moved between the
two halves of the law in proportion to it, which also is what a wrong temperature or an
unwarped q does), and returns the smallest d caught with 90 % probability at the test's share
α/m of the family's error rate.

Example: a fair coin sampled N = 10,000 times, 5,100 heads: χ² = 4.0 on 1 degree of freedom,
p = 0.046; at α = 10⁻³ it passes, and the test catches TV ≥ 0.023 with 90 % power.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import torch


def chi2_sf(statistic, df: int):
    """P(χ²_df ≥ statistic), the regularised upper incomplete gamma Q(df/2, statistic/2); works on
    floats and on numpy arrays."""
    if df <= 0:
        return np.ones_like(statistic, dtype=float) if isinstance(statistic, np.ndarray) else 1.0
    x = torch.as_tensor(np.asarray(statistic, dtype=np.float64) / 2)
    out = torch.special.gammaincc(torch.full_like(x, df / 2), x).numpy()
    return out if isinstance(statistic, np.ndarray) else float(out)


def normal_sf_two_sided(z: float) -> float:
    return math.erfc(abs(z) / math.sqrt(2))


POWER = 0.9
"""The power at which `detectable_tv` is reported."""


@dataclass
class StatTest:
    """One hypothesis test of the family; `rejected` and `adjusted_p` are set by `holm`."""

    name: str
    statistic: float
    df: int
    p_value: float
    samples: int
    kind: str = "chi2"  # chi2 or z
    cells: list[float] = field(default_factory=list, repr=False)
    """The law the power simulation starts from (goodness of fit: the null law over the pooled
    cells; homogeneity: the pooled empirical law); empty where power is not simulated."""
    sizes: tuple[int, ...] = ()
    adjusted_p: float | None = None
    rejected: bool = False
    detectable_tv: float | None = None

    def describe(self) -> str:
        stat = f"χ² {self.statistic:.1f} on {self.df} df" if self.kind == "chi2" else f"z {self.statistic:+.2f}"
        power = (f", detects TV ≥ {self.detectable_tv:.3f} with {POWER:.0%} power" if self.detectable_tv is not None
                 and math.isfinite(self.detectable_tv) else "")
        adjusted = f" (Holm-adjusted {self.adjusted_p:.2g})" if self.adjusted_p is not None else ""
        return (f"{self.name}: {stat}, p = {self.p_value:.3g}{adjusted}, N = {self.samples}{power} -> "
                f"{'REJECTED' if self.rejected else 'ok'}")

    def to_dict(self) -> dict:
        return {"name": self.name, "kind": self.kind, "statistic": self.statistic, "df": self.df,
                "p_value": self.p_value, "adjusted_p": self.adjusted_p, "samples": self.samples,
                "rejected": self.rejected, "detectable_tv": self.detectable_tv}


MAX_CELLS = 10
"""At most this many cells per χ² test: the most likely outcomes and one pooled cell. Fewer degrees
of freedom give more power against spread-out deviations (the hardest kind, see detectable_tv):
on the built-in model's first token, 3000 samples caught TV 0.069 with its ~30 cells of expected
count >= 5, 3500 samples TV 0.056 with 10."""


def _pool(cells: dict, size: dict, floor: float, other: object, max_cells: int = MAX_CELLS) -> dict:
    """Keep the outcomes whose `size` reaches `floor`, at most max_cells - 1 of them (the largest),
    and pool the others into `other`; a pooled cell still below the floor joins the smallest kept
    one. Returns {outcome or other: [members]}."""
    ranked = sorted((x for x in cells if size[x] >= floor), key=lambda x: -size[x])
    kept = {x: [x] for x in ranked[: max_cells - 1]}
    rest = [x for x in cells if x not in kept]
    if rest:
        if sum(size[x] for x in rest) >= floor or not kept:
            kept[other] = rest
        else:
            smallest = min(kept, key=lambda x: size[x])
            kept[smallest] = kept[smallest] + rest
    return kept


OTHER = ("<other>",)


def goodness_of_fit(name: str, counts: Counter, law: dict, min_expected: float = 5.0) -> StatTest:
    """Pearson's χ² of `counts` against the exact law {outcome: probability}. An outcome the law
    gives no mass (a token the target cannot emit) makes the test reject outright."""
    n = sum(counts.values())
    impossible = sum(c for x, c in counts.items() if law.get(x, 0.0) <= 0.0)
    if impossible:
        return StatTest(name, math.inf, 0, 0.0, n)
    groups = _pool({x: p for x, p in law.items() if p > 0}, {x: n * p for x, p in law.items()}, min_expected, OTHER)
    expected = np.array([n * sum(law[x] for x in members) for members in groups.values()])
    observed = np.array([sum(counts.get(x, 0) for x in members) for members in groups.values()], dtype=float)
    statistic = float(((observed - expected) ** 2 / expected).sum())
    df = len(groups) - 1
    return StatTest(name, statistic, df, chi2_sf(statistic, df), n, cells=list(expected / n), sizes=(n,))


def _homogeneity_statistic(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """χ² of 2 × C tables given as rows (..., C) of counts."""
    n_a, n_b = a.sum(-1, keepdims=True), b.sum(-1, keepdims=True)
    column = a + b
    total = n_a + n_b
    e_a, e_b = column * n_a / total, column * n_b / total
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(column > 0, (a - e_a) ** 2 / e_a + (b - e_b) ** 2 / e_b, 0.0)
    return terms.sum(-1)


def homogeneity(name: str, counts_a: Counter, counts_b: Counter, min_count: int = 10) -> StatTest:
    """χ² test that two samples come from one law."""
    pooled = counts_a + counts_b
    groups = _pool(pooled, pooled, min_count, OTHER)
    a = np.array([sum(counts_a.get(x, 0) for x in m) for m in groups.values()], dtype=float)
    b = np.array([sum(counts_b.get(x, 0) for x in m) for m in groups.values()], dtype=float)
    statistic = float(_homogeneity_statistic(a, b))
    df = len(groups) - 1
    law = (a + b) / (a + b).sum()
    return StatTest(name, statistic, df, chi2_sf(statistic, df), int(a.sum() + b.sum()), cells=list(law),
                    sizes=(int(a.sum()), int(b.sum())))


def uniformity(name: str, values: list[float], bins: int | None = None) -> StatTest:
    """χ² test that values in [0, 1] are uniform, on equal-width bins (≥ 10 expected per bin)."""
    n = len(values)
    if n < 20:
        return StatTest(name, 0.0, 0, 1.0, n)
    bins = bins or max(2, min(20, n // 10))
    observed = np.bincount(np.minimum((np.asarray(values) * bins).astype(int), bins - 1), minlength=bins)
    expected = n / bins
    statistic = float(((observed - expected) ** 2 / expected).sum())
    return StatTest(name, statistic, bins - 1, chi2_sf(statistic, bins - 1), n)


NORMAL_VARIANCE = 9.0
"""The variance Σβ(1 − β) from which acceptance_z takes the normal tail (a standard deviation of 3 counts)."""


def acceptance_z(name: str, accepted: int, beta_sum: float, beta_sq_sum: float, tested: int) -> StatTest:
    """Accepted count against Σβ: z = (A − Σβ) / sqrt(Σβ(1 − β)), its p-value from the normal tail where the
    variance v = Σβ(1 − β) is at least NORMAL_VARIANCE. Below, a handful of draws is far from normal (one draft
    at β = 0.94 rejected is z = −4.1, normal p 4e-5, though it happens one time in 17), so the p-value is
    Freedman's bound for a martingale of steps within [−1, 1]: P(|A − Σβ| ≥ t) ≤ 2 exp(−t² / (2 (v + t/3))),
    valid at any count (conservative: it seldom rejects few draws, which carry little evidence anyway)."""
    variance = beta_sum - beta_sq_sum
    deviation = accepted - beta_sum
    if variance > 1e-12:
        z = deviation / math.sqrt(variance)
        if variance >= NORMAL_VARIANCE:
            p = normal_sf_two_sided(z)
        else:
            p = min(1.0, 2.0 * math.exp(-deviation**2 / (2.0 * (variance + abs(deviation) / 3.0))))
    else:  # every β was 0 or 1: the count is determined
        z = 0.0 if abs(deviation) < 0.5 else math.copysign(math.inf, deviation)
        p = 1.0 if z == 0.0 else 0.0
    return StatTest(name, z, 0, p, tested, kind="z")


def randomized_pit(dist: torch.Tensor, token: int, u: float) -> float:
    """P(Y ranks before `token`) + u·p(token) for Y ~ dist, tokens ranked by descending probability
    (ties by id). Uniform on [0, 1] when `token` ~ dist and u ~ U(0, 1) independently."""
    p_x = float(dist[token])
    before = float(dist[(dist > p_x) | ((dist == p_x) & (torch.arange(dist.numel()) < token))].sum())
    return min(max(before + u * p_x, 0.0), 1.0)


def holm(tests: list[StatTest], alpha: float) -> None:
    """Holm's step-down correction: sets adjusted_p and rejected on each test, so that the chance
    of rejecting any true null in the family is at most alpha."""
    order = sorted(range(len(tests)), key=lambda i: tests[i].p_value)
    m, running = len(tests), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * tests[i].p_value))
        tests[i].adjusted_p = running
        tests[i].rejected = running <= alpha


def _split_direction(law: np.ndarray) -> np.ndarray:
    """The unit-TV perturbation that is hardest for χ²: mass taken from the most likely cells
    (about half the law) and given to the rest, each in proportion to its probability."""
    order = np.argsort(-law, kind="stable")
    top = np.zeros(law.shape, dtype=bool)
    mass = 0.0
    for i in order[:-1]:
        top[i] = True
        mass += law[i]
        if mass >= 0.5:
            break
    direction = np.where(top, -law / law[top].sum(), law / law[~top].sum())
    return direction


def detectable_tv(test: StatTest, level: float, power: float = POWER, simulations: int = 300,
                  seed: int = 0) -> float | None:
    """The smallest TV distance from the measured law that `test` rejects at `level` with
    probability `power`, by simulation (None where the test has no law to simulate from;
    inf where even the largest shift in the hardest direction is not caught)."""
    law = np.asarray(test.cells, dtype=float)
    if law.size < 2 or not test.sizes:
        return None
    direction = _split_direction(law)
    limit = float(min(law[direction < 0].sum(), law[direction > 0].sum()))  # the largest d that stays a law
    rng = np.random.default_rng(seed)

    def caught(d: float) -> float:
        shifted = np.clip(law + d * direction, 0, None)
        shifted /= shifted.sum()
        if len(test.sizes) == 1:  # goodness of fit against `law`
            n = test.sizes[0]
            observed = rng.multinomial(n, shifted, size=simulations)
            statistic = ((observed - n * law) ** 2 / (n * law)).sum(-1)
        else:
            a = rng.multinomial(test.sizes[0], law, size=simulations).astype(float)
            b = rng.multinomial(test.sizes[1], shifted, size=simulations).astype(float)
            statistic = _homogeneity_statistic(a, b)
        return float((chi2_sf(statistic, test.df) <= level).mean())

    if caught(limit) < power:
        return math.inf
    low, high = 0.0, limit
    for _ in range(12):
        middle = (low + high) / 2
        low, high = (low, middle) if caught(middle) >= power else (middle, high)
    return high


def sample_continuations(engine, prompt_ids: list[int], k: int, sampling, gamma, n: int, seed: int,
                         stats_sink: list | None = None, runs_sink: list | None = None) -> Counter:
    """Counts of the first k tokens (fewer if EOS comes first) of n generations with seeds seed,
    seed+1, ... Each generation may run past k (max_new_tokens = k + gamma) so that the verifier
    really decides on drafts even for k = 1; a truncated exact sample path is still exact.
    `runs_sink` receives (tokens of the finished rounds, stats) of each generation."""
    from dataclasses import replace

    from ..config import SpecConfig

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
        if runs_sink is not None:
            runs_sink.append((tokens, run.stats))
    return counts


@torch.inference_mode()
def exact_continuation_law(model, prompt_ids: list[int], k: int, sampling, vocab_limit: int = 4096) -> dict:
    """The target's exact law of its k-token continuation, by enumeration (small vocabularies only:
    vocab^(k-1) sequences are scored)."""
    from ..decoding.sampling import probs

    vocab = model.get_output_embeddings().weight.shape[0]
    if vocab ** (k - 1) > vocab_limit:
        raise ValueError(f"enumerating {vocab}^{k - 1} prefixes is too much; use k = 1 or a smaller model")
    if k > 1:
        prefixes = torch.cartesian_prod(*[torch.arange(vocab)] * (k - 1)).reshape(-1, k - 1)
    else:
        prefixes = torch.zeros(1, 0, dtype=torch.long)
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
