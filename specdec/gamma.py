"""Choosing gamma, the number of draft tokens per round: fixed, or "auto".

"auto" maximises the paper's expected walltime improvement (Theorem 3.8) each round, from running
estimates of alpha (acceptance, recent rounds weigh more) and c (draft token time over target call
time), both measured during the generation. It also measures what the paper assumes away: the
cost of scoring gamma+1 positions in one target pass, fitted as a line a + b*positions over the
rounds seen so far. gamma = 0 (plain decoding) is chosen when speculation would not pay; then a
one-token probe every few rounds keeps the estimates alive.

Example: alpha ~ 0.8, c ~ 0 and flat verification cost give gamma = gamma_max; alpha ~ 0.2 with
c ~ 0.3 gives 0.
"""

from __future__ import annotations

from . import theory
from .config import SpecConfig


class GammaPolicy:
    DECAY = 0.9  # weight of the past per round in the alpha estimate
    PROBE_EVERY = 8  # rounds of plain decoding between probes when auto chose 0

    def __init__(self, spec: SpecConfig, prior_c: float, fast_rows: int | None = None):
        self.spec = spec
        self.gamma_max = spec.gamma_max if fast_rows is None else max(1, min(spec.gamma_max, fast_rows - 1))
        """auto's upper bound: gamma + 1 positions stay on the target's fast path, whose numbers do
        not depend on the row count (a longer pass would round differently, and greedy output could
        differ from plain decoding's)."""
        self.accepted = 1.0  # a weak Beta(1, 1)-style prior on alpha
        self.tested = 2.0
        self.c = prior_c
        self.idle_rounds = 0
        self.cost_sums = [0.0, 0.0, 0.0, 0.0, 0.0]  # n, Σx, Σy, Σxx, Σxy for target time vs positions

    def next(self, limit: int) -> int:
        """Gamma for the coming round, at most `limit`."""
        if self.spec.gamma != "auto":
            return min(self.spec.gamma, limit)
        alpha = self.accepted / self.tested
        gamma = theory.optimal_gamma(alpha, self.c, min(self.gamma_max, limit), self.verify_cost)
        if gamma == 0 and limit > 0:
            self.idle_rounds += 1
            if self.idle_rounds % self.PROBE_EVERY == 0:
                return 1
        return gamma

    def verify_cost(self, gamma: int) -> float:
        """Measured cost of scoring gamma+1 positions, in units of scoring one (>= 1)."""
        n, sx, sy, sxx, sxy = self.cost_sums
        spread = n * sxx - sx * sx
        if n < 3 or spread <= 0:
            return 1.0
        slope = (n * sxy - sx * sy) / spread
        intercept = (sy - slope * sx) / n
        one = intercept + slope
        return max(1.0, (intercept + slope * (gamma + 1)) / one) if one > 0 else 1.0

    def observe(self, drafted: int, accepted: int, draft_seconds: float, target_seconds: float) -> None:
        positions = drafted + 1
        for i, value in enumerate((1.0, positions, target_seconds, positions * positions, positions * target_seconds)):
            self.cost_sums[i] += value
        if drafted == 0:
            return
        tested = min(accepted + 1, drafted)
        self.accepted = self.DECAY * self.accepted + accepted
        self.tested = self.DECAY * self.tested + tested
        if target_seconds > 0:
            c_now = (draft_seconds / drafted) / target_seconds
            self.c = 0.8 * self.c + 0.2 * c_now
