"""The law the verifier emits, built from its own acceptance and residual code, equals p."""

import pytest
import torch

from specdec.config import SamplingParams
from specdec.sampling import probs
from specdec.verify import acceptance_probability, point_mass, residual, verify, verify_greedy

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


def test_verify_greedy():
    argmax = torch.tensor([3, 4, 5, 6])
    assert (verify_greedy(argmax, torch.tensor([3, 4, 5])).accepted, verify_greedy(argmax, torch.tensor([3, 4, 5])).token) == (3, 6)
    v = verify_greedy(argmax, torch.tensor([3, 9, 5]))
    assert (v.accepted, v.token) == (1, 4)
    v = verify_greedy(argmax[:1], torch.zeros(0, dtype=torch.long))
    assert (v.accepted, v.token) == (0, 3)
