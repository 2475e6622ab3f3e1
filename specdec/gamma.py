"""Choosing gamma, the number of draft tokens per round: fixed, or "auto".

"auto" maximises the paper's expected walltime improvement (Theorem 3.8) each round, from running
estimates of alpha (acceptance, recent rounds weigh more) and c (draft token time over one target
step), both measured during the generation. It also measures what the paper assumes away: the cost
of scoring gamma+1 positions in one target pass, against the cost of one (a plain step, or a round
whose drafter had nothing to say). If no such round has come by the third, that round is a plain
step, so the cost is measured rather than assumed flat: on a CPU without fast bf16, scoring 2 to
16 positions costs about twice one. gamma = 0 (plain decoding) is chosen when speculation would
not pay; then one-token probes keep the estimates alive, after 8 plain rounds, then 16, 32, up to
64 while they keep saying no.

Example: alpha ~ 0.8, c ~ 0 and flat verification cost give gamma = gamma_max; alpha ~ 0.2 with
c ~ 0.3 gives 0.

A token tree whose drafter scores its nodes (Proposal.scores) is then trimmed to the size that
pays (`tree_nodes`): of its nodes taken likeliest first, the n that maximise expected tokens a round,
1 + e_1 + ... + e_n, over the round's time, draft + the measured cost of scoring n + 1 positions.
The accepted length is the sum over nodes of their chance to be accepted; a node's expected value
e = r_d s is its score s (the drafter's estimate) times r_d, the ratio, in recent tree rounds, of
rounds whose accepted path reached depth d to what the kept nodes at depth d promised
(`expected`): drafters are over-confident deep in a tree (prompt lookup's matches agree on a long
continuation the answer then leaves), and r_d learns by how much. Where positions cost what one
does (flat), the whole tree is kept; where they cost more, only nodes likely enough to pay for their
row (Sequoia and EAGLE-2 fit the tree to the hardware the same way).
"""

from __future__ import annotations

from . import theory
from .config import SpecConfig


class GammaPolicy:
    DECAY = 0.9  # weight of the past per round in the alpha estimate
    PROBE_EVERY = 8  # rounds of plain decoding before the first probe when auto chose 0
    MAX_PROBE_EVERY = 64  # each probe that changes nothing doubles the wait, up to this
    CALIBRATE_AT = 2  # rounds seen before a plain step measures one position's cost, if none has

    def __init__(self, spec: SpecConfig, prior_c: float, fast_rows: int | None = None):
        self.spec = spec
        self.gamma_max = spec.gamma_max if fast_rows is None else max(1, min(spec.gamma_max, fast_rows - 1))
        """auto's upper bound: gamma + 1 positions stay on the target's fast path, whose numbers do
        not depend on the row count (a longer pass would round differently, and greedy output could
        differ from plain decoding's)."""
        self.prior_c = prior_c
        self.accepted = 1.0  # a weak Beta(1, 1)-style prior on alpha
        self.tested = 2.0
        self.c = prior_c
        self.idle_rounds = 0
        self.probe_every = self.PROBE_EVERY
        self.one_position = [0, 0.0]  # rounds that scored one position, their total target seconds
        self.multi_sums = [0.0, 0.0, 0.0, 0.0, 0.0]  # n, Σx, Σy, Σxx, Σxy of target seconds vs positions (>= 2)
        self.reached: list[float] = []  # by depth - 1: decayed count of tree rounds accepted that deep,
        self.promised: list[float] = []  # and the decayed sum of the kept nodes' scores at that depth
        self.route = None
        self.routes: dict = {}  # route -> its ROUTE_STATE while another route is selected

    ROUTE_STATE = ("accepted", "tested", "c", "idle_rounds", "probe_every", "reached", "promised")
    """What a drafter's rounds have shown (acceptance, draft cost, probing, how deep its trees are
    accepted), kept per route (`select`); what scoring positions costs is the target's, shared."""

    def select(self, route, prior_c: float | None = None) -> None:
        """Size the coming rounds for `route` (Drafter.route: which of its ways a drafter will draft the
        next round), each route with its own acceptance, draft cost and probing. A router whose ways
        are accepted very differently (prompt lookup's matches ~0.9 a token, a trained drafter's
        guesses ~0.45) otherwise sized every round by their mixed average: on man-page summaries the
        lookup rounds got gamma ~4 under the router against ~10 alone (docs/results.md). A route not seen
        yet starts from the priors, c from `prior_c` (that way's own guess; the policy's if None)."""
        if route == self.route:
            return
        self.routes[self.route] = {name: getattr(self, name) for name in self.ROUTE_STATE}
        state = self.routes.pop(route, None)
        if state is None:
            state = dict(accepted=1.0, tested=2.0, c=self.prior_c if prior_c is None else prior_c, idle_rounds=0,
                         probe_every=self.PROBE_EVERY, reached=[], promised=[])
        for name, value in state.items():
            setattr(self, name, value)
        self.route = route

    def next(self, limit: int) -> int:
        """Gamma for the coming round, at most `limit`."""
        if self.spec.gamma != "auto":
            return min(self.spec.gamma, limit)
        if not self.one_position[0] and self.multi_sums[0] >= self.CALIBRATE_AT:
            return 0
        alpha = self.accepted / self.tested
        gamma = theory.optimal_gamma(alpha, self.c, min(self.gamma_max, limit), self.verify_cost)
        if gamma == 0 and limit > 0:
            self.idle_rounds += 1
            if self.idle_rounds >= self.probe_every:  # a one-token probe keeps alpha and c measured
                self.idle_rounds = 0
                self.probe_every = min(2 * self.probe_every, self.MAX_PROBE_EVERY)
                return 1
        elif gamma > 0:
            self.idle_rounds, self.probe_every = 0, self.PROBE_EVERY
        return gamma

    def verify_cost(self, gamma: int) -> float:
        """Measured cost of scoring gamma+1 positions, in units of scoring one (>= 1): a line
        through the multi-position rounds (their mean while they all had one size), over the mean
        one-position round. A pass of two or more rows is its own regime (a matrix product instead
        of matrix-vector ones on most CPU paths), hence the line leaves one position out. Until
        both are measured, scoring is assumed to cost one step, as the paper assumes."""
        step = self.step_seconds()
        n, sx, sy, sxx, sxy = self.multi_sums
        if gamma == 0 or step is None or not n:
            return 1.0
        spread = n * sxx - sx * sx
        if n >= 3 and spread > 0:
            slope = (n * sxy - sx * sy) / spread
            seconds = (sy - slope * sx) / n + slope * (gamma + 1)
        else:
            seconds = sy / n
        return max(1.0, seconds / step)

    def step_seconds(self) -> float | None:
        """The mean time of a round that scored one position; None until one has."""
        rounds, total = self.one_position
        return total / rounds if rounds and total > 0 else None

    def expected(self, scores: list[float], depths: list[int], parents: list[int]) -> list[float]:
        """Each node's expected contribution to the accepted length: its score times the measured
        ratio at its depth (1 until measured), never more than its parent's."""
        out: list[float] = []
        for score, depth, parent in zip(scores, depths, parents):
            ratio = (self.reached[depth - 1] + 1.0) / (self.promised[depth - 1] + 1.0) if depth <= len(self.reached) else 1.0
            value = min(1.0, ratio * score)
            out.append(value if parent < 0 else min(value, out[parent]))
        return out

    def tree_nodes(self, expected: list[float], draft_seconds: float) -> int:
        """How many of a scored tree's nodes to score (Proposal.top), from their expected values, the
        time its drafting took and the measured cost of positions (module docstring); at least one."""
        step = self.step_seconds()
        draft = draft_seconds / step if step else self.c * len(expected)
        best, best_rate, tokens = 1, 0.0, 1.0
        for n, value in enumerate(sorted(expected, reverse=True), start=1):
            tokens += value
            rate = tokens / (draft + self.verify_cost(n))
            if rate > best_rate:
                best, best_rate = n, rate
        return best

    def observe_tree(self, scores: list[float], depths: list[int], accepted: int) -> None:
        """A scored tree round: its kept nodes' scores and depths; the accepted path's length."""
        deepest = max(depths, default=0)
        while len(self.reached) < deepest:
            self.reached.append(0.0)
            self.promised.append(0.0)
        for d in range(deepest):
            self.reached[d] = self.DECAY * self.reached[d] + (1.0 if accepted > d else 0.0)
            self.promised[d] = self.DECAY * self.promised[d]
        for score, depth in zip(scores, depths):
            self.promised[depth - 1] += score

    def observe(self, drafted: int, accepted: int, draft_seconds: float, target_seconds: float) -> None:
        positions = drafted + 1
        if positions == 1:
            self.one_position[0] += 1
            self.one_position[1] += target_seconds
        else:
            for i, value in enumerate((1.0, positions, target_seconds, positions * positions, positions * target_seconds)):
                self.multi_sums[i] += value
        if drafted == 0:
            return
        tested = min(accepted + 1, drafted)
        self.accepted = self.DECAY * self.accepted + accepted
        self.tested = self.DECAY * self.tested + tested
        step = self.step_seconds() or target_seconds  # c is per target *step*
        if step > 0:
            self.c = 0.8 * self.c + 0.2 * (draft_seconds / drafted) / step
