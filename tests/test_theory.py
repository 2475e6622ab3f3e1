"""The paper's formulas reproduce its Table 1 and the bigram case exactly."""

import pytest

from specdec.decoding import theory

# Table 1 (c = ĉ = 0): α, γ -> operations factor, walltime speedup, as printed in the paper.
TABLE_1 = [(0.6, 2, 1.53, 1.96), (0.7, 3, 1.58, 2.53), (0.8, 2, 1.23, 2.44), (0.8, 5, 1.63, 3.69),
           (0.9, 2, 1.11, 2.71), (0.9, 10, 1.60, 6.86)]


@pytest.mark.parametrize("alpha,gamma,ops,speed", TABLE_1)
def test_table_1(alpha, gamma, ops, speed):
    assert round(theory.walltime_improvement(alpha, gamma, 0.0), 2) == speed
    assert round(theory.arithmetic_factor(alpha, gamma, 0.0), 2) == ops


def test_bigram_case():
    assert round(theory.walltime_improvement(0.2, 3, 0.0), 2) == 1.25


def test_expected_tokens_limits():
    assert theory.expected_tokens(1.0, 7) == 8
    assert theory.expected_tokens(0.0, 7) == 1


def test_optimal_gamma():
    assert theory.optimal_gamma(0.9, 0.0, 16) == 16  # free drafts: draft as far as allowed
    assert theory.optimal_gamma(0.2, 0.3) == 0  # α < c: speculation cannot pay (Cor 3.9)
    g = theory.optimal_gamma(0.8, 0.05)
    assert all(theory.walltime_improvement(0.8, g, 0.05) >= theory.walltime_improvement(0.8, k, 0.05) for k in range(17))


def test_optimal_gamma_by_depth_is_the_best_rate_shortest_first():
    """The one-pass search picks what maximising (rate, -gamma) over every gamma picks."""
    import random

    rng = random.Random(0)
    for _ in range(300):
        alphas = [rng.random() for _ in range(rng.randint(1, 8))]
        c, top = rng.choice([0.0, 0.02, 0.2, rng.random()]), rng.randint(0, 16)
        slope = rng.choice([0.0, 0.05, 0.3])
        cost = (lambda g, slope=slope: 1.0 if g == 0 else 1.0 + slope * g)

        def rate(g, alphas=alphas, c=c, cost=cost):
            return theory.expected_tokens_by_depth(alphas, g) / (g * c + cost(g))
        expected = max(range(top + 1), key=lambda g: (rate(g), -g))
        assert theory.optimal_gamma_by_depth(alphas, c, top, cost) == expected
    assert theory.optimal_gamma_by_depth([0.5], 0.5, 4) == 0  # all rates 1 or less: ties keep gamma 0


def test_corollary_3_9_gamma_1_bound():
    for alpha, c in [(0.5, 0.1), (0.8, 0.3), (0.3, 0.2)]:
        assert theory.walltime_improvement(alpha, 1, c) >= (1 + alpha) / (1 + c) - 1e-12


def test_verify_cost_generalisation():
    # scoring γ+1 positions at twice the cost of one halves the improvement at c = 0
    assert theory.walltime_improvement(0.8, 4, 0.0, 2.0) == pytest.approx(theory.walltime_improvement(0.8, 4, 0.0) / 2)
