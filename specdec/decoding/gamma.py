"""Choosing gamma, the number of draft tokens per round: fixed, or "auto".

"auto" maximises the paper's expected walltime improvement (Theorem 3.8) each round, from running
estimates of alpha (acceptance) and c (draft token time over one target step), both measured during the
generation. Alpha is estimated per depth, the chance that the d-th draft is accepted once the one
before it was: a trained drafter's later guesses run on its own features, not the target's, and are
accepted less often (shipped EAGLE drafter on open chat, T = 0: 0.51 at depth 1, ~0.39 at depth 2), so
one mean alpha drafted too far; prompt lookup's are accepted more often deep in a copy. It also
measures what the paper assumes away: the cost of scoring gamma+1 positions in one target pass, against
the cost of one (a plain step, or a round whose drafter had nothing to say). If no such round has come
by the third, that round is a plain step, so the cost is measured rather than assumed flat: on a CPU
without fast bf16, scoring 2 to 16 positions costs about twice one. gamma = 0 (plain decoding) is chosen
when speculation would not pay; then one-token probes keep the estimates alive, after 8 plain rounds,
then 16, 32, up to 64 while they keep saying no (a probe is two rounds of one draft token, so that the
second times the draft cost: see drafted_last).

Each depth's estimate weighs recent rounds more (DECAY) and is shrunk toward that depth's long-run
acceptance: alpha_d = (recent accepted + K m_d) / (recent tested + K), m_d the acceptance over this
generation's rounds and, carried over by the engine, earlier generations' with the same drafter, way and
sampling settings (`RoundHistory`; so are the draft cost c and the target's cost of positions, weighted
as 8 rounds at most, while one plain step a generation re-measures one position). The recent estimate
alone is noisy: at the drafter's ~0.4 at T = 1 it dipped to 0.1-0.3 in stretches, auto stopped drafting
and only sparse probes brought it back (a fixed gamma = 1 ran 3-5 % faster, docs/benchmarks.md's log). A real
change (a quote's copy ending) still moves alpha within a few rounds.

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

from collections.abc import Callable

from ..config import SpecConfig
from . import theory

Acceptance = list  # per depth - 1: [accepted, tested] (floats)


def _scaled(record: Acceptance, limit: float) -> Acceptance:
    """The record with every depth scaled by one factor so that depth 1 holds at most `limit` tests."""
    tested = record[0][1] if record else 0.0
    factor = min(1.0, limit / tested) if tested > 0 else 1.0
    return [[a * factor, t * factor] for a, t in record]


def _add(total: Acceptance, record: Acceptance) -> None:
    while len(total) < len(record):
        total.append([0.0, 0.0])
    for d, (a, t) in enumerate(record):
        total[d][0] += a
        total[d][1] += t


class RoundHistory:
    """What earlier generations' rounds showed, kept by the engine across its generations: acceptance
    by depth and the draft cost c per (regime, route), and the target's cost of scoring one and several
    positions. A new generation starts from it (module docstring) instead of from priors: its first
    rounds were sized with c = the drafter's guess and positions assumed free (gamma 3-4 where 1 pays),
    and its estimates were noisiest when they decided most. Old rounds fade by volume: past MAX_TESTED
    tests at depth 1, or MAX_ROUNDS timed rounds, the sums are scaled down."""

    MAX_TESTED = 2048.0
    MAX_ROUNDS = 256.0
    MAX_KEYS = 256
    """(regime, route) records kept; the least recently written go first (a server sees a regime per
    distinct temperature and top-p its requests ask for)."""

    def __init__(self) -> None:
        self.acceptance: dict = {}
        self.draft_cost: dict = {}
        self.one_position = [0.0, 0.0]  # rounds, their total target seconds
        self.multi_sums = [0.0] * 5  # n, Σx, Σy, Σxx, Σxy (GammaPolicy.multi_sums)

    def get(self, key) -> Acceptance:
        return [list(x) for x in self.acceptance.get(key, [])]

    def add(self, key, record: Acceptance) -> None:
        if not record or record[0][1] <= 0:
            return
        total = self.get(key)
        _add(total, record)
        self._put(self.acceptance, key, _scaled(total, self.MAX_TESTED))

    def set_draft_cost(self, key, c: float) -> None:
        self._put(self.draft_cost, key, c)

    def _put(self, records: dict, key, value) -> None:
        records.pop(key, None)  # re-inserted last: dicts keep insertion order
        records[key] = value
        while len(records) > self.MAX_KEYS:
            del records[next(iter(records))]

    def add_costs(self, one_position: list[float], multi_sums: list[float]) -> None:
        self.one_position = _sums_scaled([a + b for a, b in zip(self.one_position, one_position)], self.MAX_ROUNDS)
        self.multi_sums = _sums_scaled([a + b for a, b in zip(self.multi_sums, multi_sums)], self.MAX_ROUNDS)


def _sums_scaled(sums: list[float], limit: float) -> list[float]:
    """Sums over rounds (the first is their count) scaled so the count is at most `limit`: the same
    mean and the same line through them, with less weight."""
    factor = min(1.0, limit / sums[0]) if sums[0] > 0 else 1.0
    return [x * factor for x in sums]


def _one_step(gamma: int) -> float:
    return 1.0  # scoring costs one step until measured (the paper's assumption)


_NONE = object()  # GammaPolicy.drafted_last when the last round did not draft (None is a route)


class GammaPolicy:
    DECAY = 0.9  # weight of the past per round in the alpha estimate
    SHRINK = 10.0  # K: pseudo-tests at a depth's long-run acceptance mixed into its recent estimate
    CARRIED = 64.0  # at most this many tests at depth 1 of earlier generations in the long-run means
    CARRIED_ROUNDS = 8.0  # at most this many earlier rounds' weight in each cost estimate
    FIRST_PRIOR = 0.5  # the long-run mean at depth 1 before any test (Beta(1, 1)); deeper: the depth above
    PROBE_EVERY = 8  # rounds of plain decoding before the first probe when auto chose 0
    MAX_PROBE_EVERY = 64  # each probe that changes nothing doubles the wait, up to this
    CALIBRATE_AT = 2  # rounds seen before a plain step measures one position's cost, if none has

    def __init__(self, spec: SpecConfig, prior_c: float, fast_rows: int | None = None,
                 history: RoundHistory | None = None, regime=None):
        """`history` and `regime` (what makes rounds comparable across generations: the drafter and
        the sampling settings): what earlier generations showed, and where this one's rounds go
        (`commit`)."""
        self.spec = spec
        self.history = history
        self.regime = regime
        self.gamma_max = spec.gamma_max if fast_rows is None else max(1, min(spec.gamma_max, fast_rows - 1))
        """auto's upper bound: gamma + 1 positions stay on the target's fast path, whose numbers do
        not depend on the row count (a longer pass would round differently, and greedy output could
        differ from plain decoding's)."""
        self.prior_c = prior_c
        self.recent: Acceptance = []  # by depth - 1: decayed [accepted, tested]
        self.fresh: Acceptance = []  # by depth - 1: this generation's, undecayed
        self.carried: Acceptance = self._carried(None)  # earlier generations' (scaled, CARRIED)
        self.c = self._carried_c(None, prior_c)
        self.idle_rounds = 0
        self.probe_every = self.PROBE_EVERY
        self.fresh_one = [0.0, 0.0]  # this generation's rounds that scored one position, their target seconds
        self.fresh_multi = [0.0] * 5  # n, Σx, Σy, Σxx, Σxy of this generation's target seconds vs positions (>= 2)
        earlier = history if history is not None else RoundHistory()  # earlier generations' costs, as <= 8 rounds
        self.carried_one = _sums_scaled(list(earlier.one_position), self.CARRIED_ROUNDS)
        self.carried_multi = _sums_scaled(list(earlier.multi_sums), self.CARRIED_ROUNDS)
        self.reached: list[float] = []  # by depth - 1: decayed count of tree rounds accepted that deep,
        self.promised: list[float] = []  # and the decayed sum of the kept nodes' scores at that depth
        self.route = None
        self.probe_left = 0
        """Rounds left of a probe: two drafting rounds, so that the second times c (see drafted_last;
        a c measured high, on a slow moment, was otherwise never measured again once auto had stopped
        drafting because of it, and with c carried across generations it held every later one too)."""
        self.drafted_last = _NONE
        """The route of the last round if it drafted: c is measured on rounds that follow one of their
        route's, as a draft token costs in a run of drafting rounds. A drafter that reads the
        target's features catches up on every token it has not seen before it drafts: after plain
        rounds (probes, or the generation's first round: the whole prompt) that is several tokens
        of its network, and counted in c it grew 0.2 -> 0.5 of a step over probes 8-64 rounds apart,
        which made auto wait longer still (open chat, T = 1)."""
        self.routes: dict = {}  # route -> its ROUTE_STATE while another route is selected

    ROUTE_STATE = ("recent", "fresh", "carried", "c", "idle_rounds", "probe_every", "probe_left", "reached",
                   "promised")
    """What a drafter's rounds have shown (acceptance, draft cost, probing, how deep its trees are
    accepted), kept per route (`select`); what scoring positions costs is the target's, shared."""

    def select(self, route, prior_c: float | None = None) -> None:
        """Size the coming rounds for `route` (Drafter.route: which of its ways a drafter will draft the
        next round), each route with its own acceptance, draft cost and probing. A router whose ways
        are accepted very differently (prompt lookup's matches ~0.9 a token, a trained drafter's
        guesses ~0.45) otherwise sized every round by their mixed average: on man-page summaries the
        lookup rounds got gamma ~4 under the router against ~10 alone (docs/benchmarks.md's log). A route not seen
        yet starts from the priors, c from `prior_c` (that way's own guess; the policy's if None)."""
        if route == self.route:
            return
        self.routes[self.route] = {name: getattr(self, name) for name in self.ROUTE_STATE}
        state = self.routes.pop(route, None)
        if state is None:
            state = dict(recent=[], fresh=[], carried=self._carried(route),
                         c=self._carried_c(route, self.prior_c if prior_c is None else prior_c), idle_rounds=0,
                         probe_every=self.PROBE_EVERY, probe_left=0, reached=[], promised=[])
        for name, value in state.items():
            setattr(self, name, value)
        self.route = route

    def next(self, limit: int) -> int:
        """Gamma for the coming round, at most `limit`."""
        if self.spec.gamma != "auto":
            return min(self.spec.gamma, limit)
        if not self.fresh_one[0] and self.fresh_multi[0] >= self.CALIBRATE_AT:
            return 0  # one plain step a generation keeps the cost of one position measured here and now
        top = min(self.gamma_max, limit)
        gamma = theory.optimal_gamma_by_depth(self.alphas(max(1, top)), self.c, top, self.verify_costs())
        if gamma == 0 and limit > 0:
            if self.probe_left:  # the probe's second round: c is timed on it (drafted_last)
                self.probe_left -= 1
                return 1
            self.idle_rounds += 1
            if self.idle_rounds >= self.probe_every:  # one-token probes keep alpha and c measured
                self.idle_rounds = 0
                self.probe_every = min(2 * self.probe_every, self.MAX_PROBE_EVERY)
                self.probe_left = 1
                return 1
        elif gamma > 0:
            self.idle_rounds, self.probe_every = 0, self.PROBE_EVERY
        return gamma

    def alphas(self, depth: int) -> list[float]:
        """The acceptance at depths 1..`depth` the coming round is sized by: each depth's recent
        estimate shrunk toward its long-run mean (module docstring); a depth never tested takes the
        mean of the depth above."""
        out, prior = [], self.FIRST_PRIOR
        for d in range(depth):
            a = t = 0.0
            for record in (self.fresh, self.carried):
                if d < len(record):
                    a, t = a + record[d][0], t + record[d][1]
            mean = (a + 2.0 * prior) / (t + 2.0)
            recent_a, recent_t = self.recent[d] if d < len(self.recent) else (0.0, 0.0)
            weight = recent_t + self.SHRINK
            out.append((recent_a + self.SHRINK * mean) / weight if weight > 0 else mean)
            prior = mean
        return out

    def _carried(self, route) -> Acceptance:
        return _scaled(self.history.get((self.regime, route)), self.CARRIED) if self.history is not None else []

    def _carried_c(self, route, prior: float) -> float:
        return self.history.draft_cost.get((self.regime, route), prior) if self.history is not None else prior

    def commit(self) -> None:
        """Hand this generation's rounds to the history, for the next generations: each way's acceptance
        and draft cost, and the target's cost of positions."""
        if self.history is None:
            return
        states = {**self.routes, self.route: {name: getattr(self, name) for name in self.ROUTE_STATE}}
        for route, state in states.items():
            self.history.add((self.regime, route), state["fresh"])
            if state["fresh"]:  # the way drafted: its c was measured
                self.history.set_draft_cost((self.regime, route), state["c"])
        self.fresh = []
        for state in self.routes.values():
            state["fresh"] = []
        self.history.add_costs(self.fresh_one, self.fresh_multi)
        self.fresh_one, self.fresh_multi = [0.0, 0.0], [0.0] * 5

    @property
    def one_position(self) -> list[float]:
        """Rounds that scored one position and their total target seconds, earlier generations' included."""
        return [a + b for a, b in zip(self.carried_one, self.fresh_one)]

    @property
    def multi_sums(self) -> list[float]:
        """n, Σx, Σy, Σxx, Σxy of target seconds against positions (>= 2), earlier generations' included."""
        return [a + b for a, b in zip(self.carried_multi, self.fresh_multi)]

    def verify_cost(self, gamma: int) -> float:
        """Measured cost of scoring gamma+1 positions, in units of scoring one (>= 1): a line
        through the multi-position rounds (their mean while they all had one size), over the mean
        one-position round. A pass of two or more rows is its own regime (a matrix product instead
        of matrix-vector ones on most CPU paths), hence the line leaves one position out. Until
        both are measured, scoring is assumed to cost one step, as the paper assumes."""
        return self.verify_costs()(gamma)

    def verify_costs(self) -> Callable[[int], float]:
        """verify_cost with the line fitted once, for the many gammas one decision weighs."""
        step = self.step_seconds()
        n, sx, sy, sxx, sxy = self.multi_sums
        if step is None or not n:
            return _one_step
        spread = n * sxx - sx * sx
        if n >= 3 and spread > 0:
            slope = (n * sxy - sx * sy) / spread
            intercept = (sy - slope * sx) / n
        else:
            slope, intercept = 0.0, sy / n

        def cost(gamma: int) -> float:
            if gamma == 0:
                return 1.0
            return max(1.0, (intercept + slope * (gamma + 1)) / step)
        return cost

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
        verify_cost = self.verify_costs()
        for n, value in enumerate(sorted(expected, reverse=True), start=1):
            tokens += value
            rate = tokens / (draft + verify_cost(n))
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

    def observe(self, drafted: int, accepted: int, draft_seconds: float, target_seconds: float,
                depth: int | None = None) -> None:
        """A round: `drafted` tokens (a tree's nodes) of which the first `accepted` (the accepted path)
        were kept; `depth` the proposal's depth (a chain's: `drafted`, the default)."""
        positions = drafted + 1
        if positions == 1:
            self.fresh_one[0] += 1
            self.fresh_one[1] += target_seconds
        else:
            for i, value in enumerate((1.0, positions, target_seconds, positions * positions, positions * target_seconds)):
                self.fresh_multi[i] += value
        if drafted == 0:
            self.drafted_last = _NONE
            return
        reached = min(accepted + 1, drafted if depth is None else depth)  # depths whose draft was tested
        while len(self.recent) < reached:
            self.recent.append([0.0, 0.0])
        while len(self.fresh) < reached:
            self.fresh.append([0.0, 0.0])
        for d in range(reached):
            hit = 1.0 if d < accepted else 0.0
            self.recent[d] = [self.DECAY * self.recent[d][0] + hit, self.DECAY * self.recent[d][1] + 1.0]
            self.fresh[d][0] += hit
            self.fresh[d][1] += 1.0
        warm, self.drafted_last = self.drafted_last == self.route, self.route
        step = self.step_seconds() or target_seconds  # c is per target *step*
        if step > 0 and warm:
            self.c = 0.8 * self.c + 0.2 * (draft_seconds / drafted) / step
