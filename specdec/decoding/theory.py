"""The paper's formulas (Leviathan et al. 2023, section 3). alpha: expected acceptance rate;
gamma: draft tokens per round; c: cost of one draft step over one target step.

Table 1's first row, alpha=0.6, gamma=2, c=0:
>>> round(walltime_improvement(0.6, 2, 0.0), 2), round(arithmetic_factor(0.6, 2, 0.0), 2)
(1.96, 1.53)
"""

from __future__ import annotations


def expected_tokens(alpha: float, gamma: int) -> float:
    """E[tokens per target call] = (1 - alpha^(gamma+1)) / (1 - alpha), bonus token included (eq. 1)."""
    if alpha >= 1.0:
        return gamma + 1.0
    return (1.0 - alpha ** (gamma + 1)) / (1.0 - alpha)


def walltime_improvement(alpha: float, gamma: int, c: float, verify_cost: float = 1.0) -> float:
    """Theorem 3.8: (1 - alpha^(gamma+1)) / ((1 - alpha)(gamma c + 1)).

    `verify_cost` generalises the paper's assumption that scoring gamma+1 positions costs one target
    step: it is that cost in target steps (1.0 reproduces the paper)."""
    return expected_tokens(alpha, gamma) / (gamma * c + verify_cost)


def optimal_gamma(alpha: float, c: float, gamma_max: int = 16, verify_cost=lambda gamma: 1.0) -> int:
    """The gamma in 0..gamma_max that maximises the expected walltime improvement (0 = don't speculate)."""
    return max(range(gamma_max + 1), key=lambda g: (walltime_improvement(alpha, g, c, verify_cost(g)), -g))


def expected_tokens_by_depth(alphas: list[float], gamma: int) -> float:
    """E[tokens per target call] when the draft at depth d is accepted with probability alphas[d-1]
    given that the one before it was (the last value holds beyond the list):
    1 + a_1 + a_1 a_2 + ... + a_1...a_gamma. Equal to expected_tokens for a constant alpha."""
    total, reach = 1.0, 1.0
    for d in range(gamma):
        reach *= alphas[min(d, len(alphas) - 1)]
        total += reach
    return total


def optimal_gamma_by_depth(alphas: list[float], c: float, gamma_max: int = 16, verify_cost=lambda gamma: 1.0) -> int:
    """optimal_gamma with an acceptance per depth (expected_tokens_by_depth): a drafter whose later
    guesses are accepted less often than its first is given a shorter gamma than its mean suggests.
    One pass over gamma (the expected tokens grow by one product a depth; the policy asks every round)."""
    best, best_rate = 0, -1.0
    total, reach = 1.0, 1.0  # expected_tokens_by_depth(alphas, g), term by term
    for g in range(gamma_max + 1):
        if g:
            reach *= alphas[min(g - 1, len(alphas) - 1)]
            total += reach
        rate = total / (g * c + verify_cost(g))
        if rate > best_rate:  # ties keep the shorter gamma
            best, best_rate = g, rate
    return best


def arithmetic_factor(alpha: float, gamma: int, c_hat: float) -> float:
    """Theorem 3.11: the factor by which total arithmetic grows,
    (1 - alpha)(gamma c_hat + gamma + 1) / (1 - alpha^(gamma+1)); c_hat = draft/target FLOPs per token."""
    return (gamma * c_hat + gamma + 1) / expected_tokens(alpha, gamma)
