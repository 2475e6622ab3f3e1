"""gamma = auto on synthetic measurements: it measures what extra positions cost before trusting
speculation, and stops speculating where the measured cost and acceptance say it loses."""

import random

import pytest

from specdec.config import SpecConfig
from specdec.decoding import theory
from specdec.decoding.gamma import GammaPolicy, RoundHistory


def accepted_count(gamma: int, alpha: float, rng: random.Random) -> int:
    """Drafts accepted in a round when each is accepted with probability alpha (until one is not)."""
    n = 0
    while n < gamma and rng.random() < alpha:
        n += 1
    return n


def _run(policy: GammaPolicy, rounds: int, alpha: float, step: float, per_position: float, draft: float = 0.0,
         rng: random.Random | None = None, limit: int = 64) -> list[int]:
    """Feed the policy rounds whose target time is step + per_position * (positions - 1), whose drafts
    cost `draft` each and are accepted independently with probability alpha (seeded: `rng`, else seed 0)."""
    chosen, rng = [], rng or random.Random(0)
    for _ in range(rounds):
        gamma = policy.next(limit)
        chosen.append(gamma)
        accepted = accepted_count(gamma, alpha, rng)
        policy.observe(gamma, accepted, draft_seconds=draft * gamma, target_seconds=step + per_position * gamma)
    return chosen


def test_auto_measures_one_position_before_trusting_flat_cost():
    policy = GammaPolicy(SpecConfig(gamma="auto"), prior_c=0.0)
    chosen = _run(policy, 3, alpha=0.9, step=1.0, per_position=0.0)
    assert chosen[2] == 0 and chosen[0] > 0  # the third round is the plain calibration step


def test_auto_stops_speculating_when_extra_positions_are_expensive():
    """α 0.3 with each extra position costing a quarter step (fp32 on ATen): plain decoding wins,
    and after calibrating auto chooses 0 but for its probes."""
    policy = GammaPolicy(SpecConfig(gamma="auto"), prior_c=0.05)
    chosen = _run(policy, 60, alpha=0.3, step=1.0, per_position=0.25)
    late = chosen[20:]
    assert late.count(0) >= 0.8 * len(late), chosen


def test_auto_keeps_speculating_when_positions_are_cheap():
    policy = GammaPolicy(SpecConfig(gamma="auto"), prior_c=0.0)
    chosen = _run(policy, 60, alpha=0.8, step=1.0, per_position=0.02)
    assert min(chosen[5:]) >= 3, chosen


def test_fixed_gamma_is_left_alone():
    policy = GammaPolicy(SpecConfig(gamma=4), prior_c=0.0)
    assert _run(policy, 5, alpha=0.0, step=1.0, per_position=1.0) == [4] * 5


def test_auto_sees_the_step_from_one_position_to_several():
    """fp32 on ATen here: 1 position 57 ms, 2 to 16 positions ~100-115 ms (matrix products instead
    of matrix-vector ones). At α 0.45 with c 0.05 speculation loses; auto must see it, although a
    line through the multi-position rounds alone is nearly flat."""
    policy = GammaPolicy(SpecConfig(gamma="auto"), prior_c=0.05)
    chosen, rng = [], random.Random(0)
    for _ in range(80):
        gamma = policy.next(64)
        chosen.append(gamma)
        seconds = 0.057 if gamma == 0 else 0.096 + 0.0012 * (gamma - 1)
        policy.observe(gamma, accepted_count(gamma, 0.45, rng), draft_seconds=0.003 * gamma, target_seconds=seconds)
    assert policy.verify_cost(4) > 1.6
    assert chosen[30:].count(0) >= 0.8 * 50, chosen
    # the line fitted once per decision gives each gamma the cost the fit through the sums gives it
    step = policy.step_seconds()
    n, sx, sy, sxx, sxy = policy.multi_sums
    slope = (n * sxy - sx * sy) / (n * sxx - sx * sx)
    line = policy.verify_costs()
    assert line(0) == 1.0
    for gamma in range(1, 17):
        assert line(gamma) == max(1.0, ((sy - slope * sx) / n + slope * (gamma + 1)) / step)


def test_probes_back_off_while_speculation_keeps_losing():
    """Where speculation loses, each probe costs; the wait between probes doubles (8, 16, 32, 64),
    so 300 rounds hold a handful of probes (two drafting rounds each), not one every 8 rounds."""
    policy = GammaPolicy(SpecConfig(gamma="auto"), prior_c=0.05)
    chosen = _run(policy, 300, alpha=0.2, step=1.0, per_position=0.5)
    probes = sum(1 for i in range(40, 300) if chosen[i] > 0 and chosen[i - 1] == 0)  # each probe's first round
    assert 1 <= probes <= 6, chosen


def test_tree_size_follows_the_cost_of_positions():
    """A scored tree is trimmed to what pays: all of it where positions cost what one does, only
    its likeliest nodes where each costs a quarter step, fewer still once rounds show the drafter
    promising more at depth 2 than it delivers (a chain of 8 nodes here, one a depth)."""
    scores = [0.9, 0.8, 0.5, 0.3, 0.2, 0.1, 0.05, 0.05]
    depths, parents = list(range(1, 9)), list(range(-1, 7))
    flat = GammaPolicy(SpecConfig(gamma="auto"), prior_c=0.0)
    assert flat.expected(scores, depths, parents) == scores  # nothing measured: the scores as they are
    assert flat.tree_nodes(scores, draft_seconds=0.0) == len(scores)  # nor the cost: flat, as the paper
    steep = GammaPolicy(SpecConfig(gamma="auto"), prior_c=0.0)
    steep.observe(0, 0, 0.0, 1.0)  # one position: 1 s; n positions: 0.75 + 0.25 n
    for positions in (3, 5, 9):
        steep.observe(positions - 1, 0, 0.0, 0.75 + 0.25 * positions)
    # (1 + Σs) / (1 + 0.25 n) peaks at 3 nodes: 3.2 / 1.75 against 2.7 / 1.5 and 3.5 / 2.0
    assert steep.tree_nodes(steep.expected(scores, depths, parents), draft_seconds=0.0) == 3
    for _ in range(30):  # every round accepts the first node and never the second
        steep.observe_tree(scores[:3], depths[:3], accepted=1)
    value = steep.expected(scores, depths, parents)
    assert value[0] == pytest.approx(1.0, abs=0.05) and value[1] < 0.1  # depth 1 delivers more, 2 less
    assert all(later <= earlier for earlier, later in zip(value, value[1:]))  # never above the parent
    assert steep.tree_nodes(value, draft_seconds=0.0) < 3


def test_each_route_is_sized_by_its_own_acceptance():
    """A router's two ways (prompt lookup's matches accepted ~0.95 a token, a trained drafter's guesses
    ~0.3) alternate round by round, each extra position costing 0.15 of a step: with a route per way,
    lookup's rounds keep a long gamma and the trained drafter's rounds a short one (or none), where one
    shared estimate sized both by their mix."""
    def alternate(routed: bool) -> dict[str, list[int]]:
        policy, rng = GammaPolicy(SpecConfig(gamma="auto"), prior_c=0.0), random.Random(0)
        chosen: dict[str, list[int]] = {"lookup": [], "trained": []}
        for i in range(120):
            way = "lookup" if i % 2 else "trained"
            policy.select(way if routed else None)
            gamma = policy.next(64)
            chosen[way].append(gamma)
            accepted = accepted_count(gamma, 0.95 if way == "lookup" else 0.3, rng)
            policy.observe(gamma, accepted, draft_seconds=0.0, target_seconds=1.0 + 0.15 * gamma)
        return {way: sorted(gammas[20:])[len(gammas[20:]) // 2] for way, gammas in chosen.items()}  # medians

    routed, shared = alternate(True), alternate(False)
    assert routed["lookup"] >= 8 and routed["trained"] <= 2, routed
    # the negative control, one estimate for both: the lookup rounds' acceptances size the trained rounds too
    assert shared["trained"] >= 4 * max(1, routed["trained"]), (routed, shared)


def test_a_route_comes_back_to_its_own_record():
    policy = GammaPolicy(SpecConfig(gamma="auto"), prior_c=0.1)
    policy.select("a")
    policy.observe(4, 4, draft_seconds=0.0, target_seconds=1.0)
    a = (policy.alphas(4), policy.c)
    policy.select("b")
    assert (policy.alphas(4), policy.c) == ([0.5] * 4, 0.1)  # b starts from the priors
    policy.observe(4, 0, draft_seconds=0.4, target_seconds=1.0)
    policy.select("a")
    assert (policy.alphas(4), policy.c) == a


def accepted_by_depth(gamma: int, alphas: list[float], rng: random.Random) -> int:
    """Drafts accepted when the d-th is accepted with probability alphas[d - 1] (the last beyond)."""
    n = 0
    while n < gamma and rng.random() < alphas[min(n, len(alphas) - 1)]:
        n += 1
    return n


def test_a_drafter_accepted_less_deep_is_given_a_shorter_gamma():
    """First guesses accepted 0.9, later ones 0.3 (a trained drafter drafting on its own features),
    each extra position 0.05 of a step: 1 + 0.9 + 0.27 + 0.08 tokens for 1.1, 1.2, 1.3 steps puts the
    best gamma at 2, where one mean alpha over the same rounds (~0.6) drafts 4 or more."""
    alphas, per_position = [0.9, 0.3], 0.05
    cost = lambda g: 1.0 + per_position * g  # noqa: E731
    assert theory.optimal_gamma_by_depth(alphas, 0.0, 16, cost) == 2
    assert theory.expected_tokens_by_depth([0.6], 5) == pytest.approx(theory.expected_tokens(0.6, 5))
    policy, rng, chosen = GammaPolicy(SpecConfig(gamma="auto"), prior_c=0.0), random.Random(0), []
    tested = accepted = 0
    for _ in range(200):
        gamma = policy.next(16)
        chosen.append(gamma)
        n = accepted_by_depth(gamma, alphas, rng)
        tested, accepted = tested + min(n + 1, gamma), accepted + n
        policy.observe(gamma, n, draft_seconds=0.0, target_seconds=cost(gamma))
    late = sorted(chosen[50:])
    assert late[len(late) // 2] == 2, chosen
    pooled = accepted / tested  # the negative control: one alpha for every depth
    assert theory.optimal_gamma(pooled, 0.0, 16, cost) >= 4, pooled


def _zero_share(shrink: float, generations: int = 30) -> float:
    """Rounds without a draft, over 128-token generations at acceptance 0.4 a depth, two positions costing
    1.15 steps and each draft 0.05: drafting one token pays (1.4 tokens for 1.2 steps)."""
    history, rng, zeros, rounds = RoundHistory(), random.Random(1), 0, 0
    for _ in range(generations):
        policy = GammaPolicy(SpecConfig(gamma="auto"), prior_c=0.05, history=history, regime="chat")
        policy.SHRINK = shrink
        emitted = 0
        while emitted < 128:
            gamma = policy.next(127 - emitted)
            n = accepted_count(gamma, 0.4, rng)
            seconds = 1.0 if gamma == 0 else 1.15 + 0.1 * (gamma - 1)
            policy.observe(gamma, n, draft_seconds=0.05 * gamma, target_seconds=seconds)
            zeros, rounds, emitted = zeros + (gamma == 0), rounds + 1, emitted + n + 1
        policy.commit()
    return zeros / rounds


def test_noise_in_the_recent_acceptance_does_not_turn_speculation_off():
    """At a steady 0.4 the recent-weighted estimate alone dips below what pays in stretches and auto stops
    drafting (a negative control, SHRINK = 0); shrunk toward the long-run mean it keeps drafting."""
    assert _zero_share(GammaPolicy.SHRINK) < 0.1
    assert _zero_share(0.0) > 0.2


def test_a_generation_starts_from_the_acceptance_of_the_ones_before():
    history = RoundHistory()
    first = GammaPolicy(SpecConfig(gamma="auto"), prior_c=0.0, history=history, regime=("eagle", 0.0))
    for i in range(40):
        first.observe(4, 4 if i % 10 else 1, draft_seconds=0.0, target_seconds=1.0)
    first.commit()
    same = GammaPolicy(SpecConfig(gamma="auto"), prior_c=0.0, history=history, regime=("eagle", 0.0))
    assert same.alphas(1)[0] > 0.85  # ~0.97 at depth 1 over 40 rounds, carried as 64 tests at most
    other = GammaPolicy(SpecConfig(gamma="auto"), prior_c=0.0, history=history, regime=("eagle", 1.0))
    assert other.alphas(1) == [0.5]  # another temperature starts from the prior
    assert history.get((("eagle", 0.0), None))[0][1] == 40  # every round tested depth 1


def test_a_generation_starts_from_the_costs_the_ones_before_measured():
    """Positions costing 0.3 of a step each and drafts 0.2: a generation without history drafts 3+ in its
    first round (c from the drafter's guess, positions assumed free: the negative control); one after
    such a generation drafts what pays (at most 1), and still measures one position once, by its third round."""
    def generation(history: RoundHistory | None) -> list[int]:
        policy = GammaPolicy(SpecConfig(gamma="auto"), prior_c=0.05, history=history, regime="chat")
        chosen = _run(policy, 40, alpha=0.5, step=1.0, per_position=0.3, draft=0.2, rng=random.Random(2), limit=16)
        policy.commit()
        return chosen

    history = RoundHistory()
    first = generation(history)
    assert first[0] >= 3, first
    second = generation(history)
    assert second[0] <= 1 and 0 in second[:3], second
    assert generation(None)[0] >= 3


def test_the_history_keeps_a_bounded_number_of_regimes():
    """A server sees a regime per temperature its requests ask for: the oldest records go first."""
    history = RoundHistory()
    for i in range(history.MAX_KEYS + 50):
        history.add((("eagle", i / 1000), None), [[1.0, 2.0]])
        history.set_draft_cost((("eagle", i / 1000), None), 0.1)
    assert len(history.acceptance) == len(history.draft_cost) == history.MAX_KEYS
    assert (("eagle", 0.0), None) not in history.acceptance
    assert history.get((("eagle", (history.MAX_KEYS + 49) / 1000), None)) == [[1.0, 2.0]]


def test_a_draft_cost_measured_high_is_measured_again():
    """A generation that starts from a draft cost measured high (0.8 of a step, a slow moment) stops
    drafting; its probes must time c again, or it would never draft again, nor would the generations
    after it. Here drafts really cost 0.05 and are accepted 0.6 with positions nearly free: it comes back."""
    history = RoundHistory()
    history.set_draft_cost(("chat", None), 0.8)
    rng, chosen = random.Random(3), []
    for _ in range(3):
        policy = GammaPolicy(SpecConfig(gamma="auto"), prior_c=0.05, history=history, regime="chat")
        chosen += _run(policy, 100, alpha=0.6, step=1.0, per_position=0.05, draft=0.05, rng=rng, limit=16)
        policy.commit()
    assert chosen[0] == 0 or chosen[:3].count(0) >= 1, chosen[:10]  # c = 0.8 does not pay at first
    assert sum(g > 0 for g in chosen[-100:]) >= 90, chosen[-100:]
    assert history.draft_cost[("chat", None)] < 0.2
