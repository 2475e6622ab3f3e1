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
    """Prompt lookup where the context repeats itself, the trained drafter where it does not, chosen
    by what each has been accepted for: each round asks `lookup` for a match; a match of n tokens is
    proposed when lookup's rounds on n-token matches have been accepted, on a decayed average over
    this sequence, for at least as many tokens as the trained drafter's rounds; else (and when
    nothing matches) `trained` proposes. A lone earlier token followed by something else is a match
    too, and on open chat such matches were accepted less often than the trained drafter's guesses
    (taking every match, the router's tau was 1.27 against the drafter's 1.50 on Zen 5).

    Exact: which drafter proposes a round depends on the context and on how earlier rounds went
    (tokens already emitted), never on the draws that verify it, and each round's proposal carries
    its own q (point masses for lookup), so the verifier's law holds round by round as for either
    drafter alone. The trained drafter reads the target's features at every position (its cache
    catches up over the rounds lookup drafted), so the target records them for both."""

    DECAY = 0.9  # weight of the past per round of the same route
    PRIOR = {"lookup": 2.0, "trained": 1.0}  # accepted tokens a round, one round's weight: lookup is tried first

    def __init__(self, lookup: Drafter, trained: Drafter):
        self.lookup, self.trained = lookup, trained
        self.name = f"{lookup.name}, else {trained.name}"
        self.cost_prior = trained.cost_prior
        self.reads_features = trained.reads_features
        self.feature_layers = trained.feature_layers
        self.outcomes: dict[str | int, list[float]] = {}  # route (n for lookup, "trained") -> [Σ accepted, rounds], decayed
        self.pending: tuple[str | int, int] | None = None  # the round in flight: route, context length

    def bind(self, target) -> None:
        self.lookup.bind(target)
        self.trained.bind(target)
        self.name = f"{self.lookup.name}, else {self.trained.name}"

    def fork(self) -> LookupElseTrained:
        return LookupElseTrained(self.lookup.fork(), self.trained.fork())

    def begin(self, prompt: torch.Tensor) -> None:
        self.lookup.begin(prompt)
        self.trained.begin(prompt)
        self.outcomes, self.pending = {}, None

    def expected(self, route: str | int) -> float:
        """Accepted tokens a round of this route, decayed mean with the prior as one round."""
        accepted, rounds = self.outcomes.get(route, (0.0, 0.0))
        return (accepted + self.PRIOR["trained" if route == "trained" else "lookup"]) / (rounds + 1.0)

    def route(self, context: torch.Tensor) -> str:
        """"lookup" when the context's final n-gram occurred before and n-token matches have done at
        least as well as the trained drafter, else "trained": what `propose` then drafts with. The two
        are accepted very differently, so gamma="auto" sizes each one's rounds by its own record."""
        n, hits = self.lookup.matches(context)
        return "lookup" if hits and self.expected(n) >= self.expected("trained") else "trained"

    def route_cost_prior(self, route) -> float:
        return self.lookup.cost_prior if route == "lookup" else self.trained.cost_prior

    def propose(self, context: torch.Tensor, gamma: int, sampling: SamplingParams,
                generator: torch.Generator) -> Proposal:
        if self.route(context) == "lookup":  # the engine's answer too: the record changes only in feedback
            found = self.lookup.propose(context, gamma, sampling, generator)
            self.pending = (self.lookup.matched, context.numel())
            return found
        proposal = self.trained.propose(context, gamma, sampling, generator)
        self.pending = ("trained", context.numel()) if proposal.tokens.numel() else None
        return proposal

    def feedback(self, kept: int) -> None:
        if self.pending is not None:
            route, length = self.pending
            outcome = self.outcomes.setdefault(route, [0.0, 0.0])
            outcome[0] = self.DECAY * outcome[0] + max(0, kept - length)
            outcome[1] = self.DECAY * outcome[1] + 1.0
            self.pending = None
        self.lookup.feedback(kept)
        self.trained.feedback(kept)
