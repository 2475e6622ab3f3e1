"""The law the verifier emits equals p: from its acceptance and residual pieces for one token, and
from `accept_prefix` (the decisions `verify` makes, with the uniforms forced) for whole
multi-round sequences of 2 and 3 tokens, with a negative control that the same computation sees a
broken residual."""

import pytest
import torch

import specdec.decoding.rejection
from specdec.config import SamplingParams
from specdec.decoding.rejection import accept_prefix, acceptance_probability, point_mass, residual, verify, verify_greedy
from specdec.decoding.sampling import probs, sample

V = 12


def emitted_law(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """P(first emitted token = t) when the draft x ~ q is verified against p, computed exactly from
    the implementation's pieces: Σ_x q(x) [a(x) 1{t=x} + (1 - a(x)) residual(p, q)(t)]."""
    every_x = torch.arange(p.shape[0])
    a = acceptance_probability(p.expand(len(every_x), -1), q.expand(len(every_x), -1), every_x)  # (V,)
    accepted = q * a  # mass that arrives by accepting x itself
    rejected_mass = (q * (1 - a)).sum()
    return accepted + rejected_mass * residual(p, q)


def random_dist(generator, zeros: int = 0) -> torch.Tensor:
    d = torch.rand(V, generator=generator, dtype=torch.float64) ** 3
    if zeros:
        d[torch.randperm(V, generator=generator)[:zeros]] = 0
    return d / d.sum()


@pytest.mark.parametrize("seed", range(20))
def test_law_equals_p_for_random_p_q(seed):
    g = torch.Generator().manual_seed(seed)
    p, q = random_dist(g, zeros=seed % 4), random_dist(g, zeros=(seed // 4) % 4)
    assert torch.allclose(emitted_law(p, q), p, atol=1e-6)


def test_law_when_q_equals_p():
    p = random_dist(torch.Generator().manual_seed(1))
    assert torch.allclose(emitted_law(p, p.clone()), p, atol=1e-6)


def test_law_with_disjoint_supports():
    p = torch.zeros(V, dtype=torch.float64)
    p[:4] = torch.tensor([0.1, 0.2, 0.3, 0.4])
    q = torch.zeros(V, dtype=torch.float64)
    q[6:] = 1 / 6
    assert torch.allclose(emitted_law(p, q), p, atol=1e-6)
    # and nothing q proposes is ever accepted
    assert acceptance_probability(p.expand(6, -1), q.expand(6, -1), torch.arange(6, 12)).sum() == 0


@pytest.mark.parametrize("x", [0, 3, 11])
def test_law_with_point_mass_q(x):
    p = random_dist(torch.Generator().manual_seed(x), zeros=2)
    q = point_mass(torch.tensor([x]), V)[0].double()
    assert torch.allclose(emitted_law(p, q), p, atol=1e-6)
    # a point mass is accepted with probability p(x) and the residual is p without x
    assert torch.isclose(acceptance_probability(p[None], q[None], torch.tensor([x]))[0], p[x])
    if p[x] < 1:
        expected = p.clone()
        expected[x] = 0
        assert torch.allclose(residual(p, q), expected / expected.sum())


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=0.7), SamplingParams(temperature=1.3, top_k=4),
    SamplingParams(temperature=1.0, top_p=0.8), SamplingParams(temperature=0.5, top_k=6, top_p=0.9),
])
def test_law_equals_warped_p_with_temperature_top_k_top_p(params):
    g = torch.Generator().manual_seed(7)
    p = probs(torch.randn(1, V, generator=g) * 3, params)[0].double()
    q = probs(torch.randn(1, V, generator=g) * 3, params)[0].double()
    assert torch.allclose(emitted_law(p, q), p, atol=1e-6)


def test_zero_residual_falls_back_to_p():
    p = torch.tensor([0.25, 0.75])
    assert torch.equal(residual(p, p.clone()), p)


def test_q_zero_rejects_and_no_nan():
    p = torch.tensor([[0.5, 0.5, 0.0], [0.2, 0.3, 0.5]])
    q = torch.tensor([[1.0, 0.0, 0.0]])
    a = acceptance_probability(p[:1], q, torch.tensor([1]))
    assert a.item() == 0 and not torch.isnan(a).any()


def test_verify_accepts_everything_when_q_equals_p():
    g = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(5, V, generator=g), -1)
    draft = torch.multinomial(p[:4], 1, generator=g).flatten()
    verdict = verify(p, p[:4].clone(), draft, g)
    assert verdict.accepted == 4
    assert torch.allclose(verdict.beta, torch.ones(4))


def test_verify_rejects_at_first_position_for_disjoint_supports():
    p = torch.zeros(3, V)
    p[:, 0] = 1.0
    q = torch.zeros(2, V)
    q[:, 5] = 1.0
    verdict = verify(p, q, torch.tensor([5, 5]), torch.Generator().manual_seed(0))
    assert verdict.accepted == 0 and verdict.token == 0
    assert verdict.beta.tolist() == [0.0]


def test_verify_with_no_draft_samples_from_p():
    p = torch.zeros(1, V)
    p[0, 9] = 1.0
    verdict = verify(p, None, torch.zeros(0, dtype=torch.long), torch.Generator().manual_seed(0))
    assert (verdict.accepted, verdict.token) == (0, 9)


def test_verify_with_no_draft_draws_as_the_general_rule_does():
    """Plain decoding's rounds skip the empty tests, but draw the same token with the same generator."""
    p = probs(torch.randn(1, V), SamplingParams(temperature=1.0))
    fast, general = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    for _ in range(20):
        verdict = verify(p, None, torch.zeros(0, dtype=torch.long), fast)
        n, dist = accept_prefix(p, point_mass(torch.zeros(0, dtype=torch.long), V), torch.zeros(0, dtype=torch.long),
                                torch.rand(0, generator=general))
        assert (verdict.accepted, verdict.token) == (n, sample(dist, general))
        assert verdict.beta.shape == (0,)


def test_verify_greedy():
    argmax = torch.tensor([3, 4, 5, 6])
    verdict = verify_greedy(argmax, torch.tensor([3, 4, 5]))
    assert (verdict.accepted, verdict.token) == (3, 6)
    v = verify_greedy(argmax, torch.tensor([3, 9, 5]))
    assert (v.accepted, v.token) == (1, 4)
    v = verify_greedy(argmax[:1], torch.zeros(0, dtype=torch.long))
    assert (v.accepted, v.token) == (0, 3)


# -- whole sequences, through the verifier's own decisions -------------------------------------------

SMALL_V = 4


def chain(generator, zeros: int = 0):
    """A random law over token sequences: next(prefix) -> (V,) distribution, fixed per prefix."""
    table = {}

    def next_law(prefix: tuple) -> torch.Tensor:
        if prefix not in table:
            d = torch.rand(SMALL_V, generator=generator, dtype=torch.float64) ** 2
            if zeros:
                d[torch.randperm(SMALL_V, generator=generator)[:zeros]] = 0
            table[prefix] = d / d.sum()
        return table[prefix]

    return next_law


def true_law(p_next, depth: int, prefix: tuple = ()) -> dict:
    if depth == 0:
        return {(): 1.0}
    out = {}
    for t, pt in enumerate(p_next(prefix).tolist()):
        if pt > 0:
            for rest, pr in true_law(p_next, depth - 1, prefix + (t,)).items():
                out[(t,) + rest] = pt * pr
    return out


def emitted_law_of_rounds(p_next, q_next, k: int, depth: int, prefix: tuple = ()) -> dict:
    """The law of the first `depth` tokens emitted by rounds of k drafts from q, verified by
    `accept_prefix` with its uniforms forced to each accept/reject pattern (whose probability the
    test computes from the definition min(1, p/q)); later rounds start from the emitted prefix."""
    if depth == 0:
        return {(): 1.0}
    out: dict = {}

    def add(seq: tuple, mass: float) -> None:
        if len(seq) >= depth:
            out[seq[:depth]] = out.get(seq[:depth], 0.0) + mass
            return
        for rest, pr in emitted_law_of_rounds(p_next, q_next, k, depth - len(seq), prefix + seq).items():
            out[seq + rest] = out.get(seq + rest, 0.0) + mass * pr

    for drafts in torch.cartesian_prod(*[torch.arange(SMALL_V)] * k).reshape(-1, k).tolist():
        q_rows = [q_next(prefix + tuple(drafts[:i])) for i in range(k)]
        weight = 1.0
        for i, x in enumerate(drafts):
            weight *= float(q_rows[i][x])
        if weight == 0:
            continue
        p_rows = torch.stack([p_next(prefix + tuple(drafts[:i])) for i in range(k + 1)])
        q = torch.stack(q_rows)
        a = [min(1.0, float(p_rows[i, x] / q[i, x])) for i, x in enumerate(drafts)]
        for n in range(k + 1):
            pattern = 1.0
            for i in range(n):
                pattern *= a[i]
            if n < k:
                pattern *= 1 - a[n]
            if pattern == 0:
                continue
            uniforms = torch.tensor([a[i] / 2 for i in range(n)] + ([(1 + a[n]) / 2] if n < k else [])
                                    + [0.5] * max(0, k - n - 1), dtype=torch.float64)
            accepted, dist = accept_prefix(p_rows, q, torch.tensor(drafts), uniforms)
            assert accepted == n, f"uniforms {uniforms.tolist()} against min(1, p/q) = {a} should accept {n}"
            for t, pt in enumerate(dist.tolist()):
                if pt > 0:
                    add(tuple(drafts[:n]) + (t,), weight * pattern * pt)
    return out


def law_distance(a: dict, b: dict) -> float:
    return max(abs(a.get(x, 0.0) - b.get(x, 0.0)) for x in set(a) | set(b))


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("k,depth", [(1, 2), (2, 2), (2, 3)])
def test_sequence_law_through_accept_prefix(seed, k, depth):
    g = torch.Generator().manual_seed(100 + seed)
    p_next, q_next = chain(g, zeros=seed % 2), chain(g, zeros=(seed // 2) % 2)
    assert law_distance(emitted_law_of_rounds(p_next, q_next, k, depth), true_law(p_next, depth)) < 1e-9


@pytest.mark.parametrize("k", [1, 2])
def test_sequence_law_with_point_mass_drafts(k):
    g = torch.Generator().manual_seed(7)
    p_next = chain(g, zeros=1)
    q_next = lambda prefix: point_mass(torch.tensor([(len(prefix) * 3 + 1) % SMALL_V]), SMALL_V)[0].double()  # noqa: E731
    assert law_distance(emitted_law_of_rounds(p_next, q_next, k, 3), true_law(p_next, 3)) < 1e-9


@pytest.mark.parametrize("broken", ["residual = p", "residual not renormalised"])
def test_sequence_law_sees_a_broken_residual(broken, monkeypatch):
    """Negative control: the same computation, with the residual broken, is far from p."""
    wrong = (lambda p, q: p) if broken == "residual = p" else (lambda p, q: (p - q).clamp_min(0))
    monkeypatch.setattr(specdec.decoding.rejection, "residual", wrong)
    g = torch.Generator().manual_seed(3)
    p_next, q_next = chain(g), chain(g)
    assert law_distance(emitted_law_of_rounds(p_next, q_next, 2, 2), true_law(p_next, 2)) > 1e-3


def rejects_impossible_draft_at_u_zero(accept) -> bool:
    p = torch.tensor([[0.0, 1.0], [0.5, 0.5]])
    q = torch.tensor([[1.0, 0.0]])
    n, dist = accept(p, q, torch.tensor([0]), torch.tensor([0.0]))
    return n == 0 and dist.tolist() == [0.0, 1.0]


def accept_prefix_with_less_or_equal(p, q, draft, uniforms):
    """The mutant: u <= a instead of u < a."""
    k = draft.shape[0]
    accept = uniforms <= acceptance_probability(p[:k], q, draft)
    rejected = (~accept).nonzero()
    n = int(rejected[0]) if rejected.numel() else k
    return n, (p[k] if n == k else residual(p[n], q[n]))


def test_zero_acceptance_rejects_even_at_u_zero():
    """torch.rand can return exactly 0: a draft the target gives no mass must still be rejected
    (accepting with u <= a instead of u < a would emit a token p cannot produce)."""
    assert rejects_impossible_draft_at_u_zero(accept_prefix)
    assert not rejects_impossible_draft_at_u_zero(accept_prefix_with_less_or_equal)  # negative control


def test_certain_acceptance_accepts_at_u_near_one():
    p = torch.tensor([[0.0, 1.0], [0.5, 0.5]])
    q = torch.tensor([[0.0, 1.0]])
    n, dist = accept_prefix(p, q, torch.tensor([1]), torch.tensor([1.0 - 2 ** -24]))
    assert n == 1 and dist.tolist() == [0.5, 0.5]
