"""Drafters that route to others: by temperature (one drafter for greedy decoding, another for
sampling), and round by round (prompt lookup where the context repeats, a trained drafter elsewhere).

A point-mass guess (prompt lookup) is accepted with probability p(x) when sampling, so it shines at
T = 0 and fades at T > 0, where a drafter whose q tracks p (a trained one) keeps being accepted.
Measured on smollm2-135m (README, "Speculative decoding on the kernel path"): prompt lookup is the
faster of the two on all four task types at T = 0, the shipped EAGLE drafter on all four at T = 1.
"""

from __future__ import annotations

import torch

from ..config import SamplingParams
from .base import Drafter, Proposal


class ByTemperature(Drafter):
    def __init__(self, greedy: Drafter, sampled: Drafter):
        self.greedy, self.sampled = greedy, sampled
        self.name = f"{greedy.name} at T=0, {sampled.name} at T>0"
        self.cost_prior = sampled.cost_prior

    def bind(self, target) -> None:
        self.greedy.bind(target)
        self.sampled.bind(target)
        self.name = f"{self.greedy.name} at T=0, {self.sampled.name} at T>0"  # binding may settle a name

    def fork(self) -> ByTemperature:
        return ByTemperature(self.greedy.fork(), self.sampled.fork())

    def for_sampling(self, sampling: SamplingParams) -> Drafter:
        return self.greedy if sampling.greedy else self.sampled

    # Called directly (without for_sampling), it still routes; both hear of every sequence.
    def begin(self, prompt: torch.Tensor) -> None:
        self.greedy.begin(prompt)
        self.sampled.begin(prompt)

    def propose(self, context: torch.Tensor, gamma: int, sampling: SamplingParams,
                generator: torch.Generator) -> Proposal:
        return self.for_sampling(sampling).propose(context, gamma, sampling, generator)

    def feedback(self, kept: int) -> None:
        self.greedy.feedback(kept)
        self.sampled.feedback(kept)


class LookupElseTrained(Drafter):
    """Prompt lookup where the context repeats itself, the trained drafter where it does not: each
    round asks `lookup` first and, when it finds no match, `trained`.

    Exact: which drafter proposes a round depends on the context alone (tokens already emitted),
    never on the draws that verify it, and each round's proposal carries its own q (point masses for
    lookup), so the verifier's law holds round by round as for either drafter alone. The trained
    drafter reads the target's features at every position (its cache catches up over the rounds
    lookup drafted), so the target records them for both."""

    def __init__(self, lookup: Drafter, trained: Drafter):
        self.lookup, self.trained = lookup, trained
        self.name = f"{lookup.name}, else {trained.name}"
        self.cost_prior = trained.cost_prior
        self.reads_features = trained.reads_features
        self.feature_layers = trained.feature_layers

    def bind(self, target) -> None:
        self.lookup.bind(target)
        self.trained.bind(target)
        self.name = f"{self.lookup.name}, else {self.trained.name}"

    def fork(self) -> LookupElseTrained:
        return LookupElseTrained(self.lookup.fork(), self.trained.fork())

    def begin(self, prompt: torch.Tensor) -> None:
        self.lookup.begin(prompt)
        self.trained.begin(prompt)

    def propose(self, context: torch.Tensor, gamma: int, sampling: SamplingParams,
                generator: torch.Generator) -> Proposal:
        found = self.lookup.propose(context, gamma, sampling, generator)
        if found.tokens.numel():
            return found
        return self.trained.propose(context, gamma, sampling, generator)

    def feedback(self, kept: int) -> None:
        self.lookup.feedback(kept)
        self.trained.feedback(kept)
