"""The drafter interface: propose up to gamma tokens, then hear how many the target kept.

Two calls, after transformers' CandidateGenerator: `propose` (with the distributions q the tokens
were drawn from, or None for a deterministic drafter, whose q is a point mass) and `feedback`
(the context the engine kept, so a drafter with state can roll back).
"""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch

from ..config import SamplingParams


@dataclass
class Proposal:
    tokens: torch.Tensor
    """(k,) draft token ids, 0 <= k <= gamma (a drafter may have nothing to say)."""
    q: torch.Tensor | None = None
    """(k, V) the warped distributions the tokens were drawn from; None for a point-mass drafter
    (and on the greedy path, where only the tokens matter)."""
    parents: torch.Tensor | None = None
    """(k,) for a token tree: each token's parent (-1 = the context's last token; parents come
    first). None for a chain, where token i follows token i - 1. Children of one node are tried in
    order (specdec.rejection, token trees), so the likeliest should come first."""

    @property
    def is_tree(self) -> bool:
        return self.parents is not None

    def first_chain(self) -> Proposal:
        """The chain that follows every node's first child: what a backend without tree passes
        verifies of a tree."""
        if self.parents is None:
            return self
        path, node = [], -1
        for i, parent in enumerate(self.parents.tolist()):
            if parent == node:
                path.append(i)
                node = i
        index = torch.tensor(path, dtype=torch.long)
        return Proposal(self.tokens[index], None if self.q is None else self.q[index])

    def head(self, n: int) -> Proposal:
        """The first n tokens: a chain's first n drafts, or the tree of its first n nodes (parents
        come first, so any such prefix is a tree). Verifying it is exact as long as n does not
        depend on the target's output."""
        if self.tokens.numel() <= n:
            return self
        return Proposal(self.tokens[:n], None if self.q is None else self.q[:n],
                        None if self.parents is None else self.parents[:n])

    @staticmethod
    def empty() -> Proposal:
        return Proposal(tokens=torch.zeros(0, dtype=torch.long))


class Drafter(ABC):
    name: str
    """Short name for stats and tables, e.g. "prompt-lookup"."""
    cost_prior: float = 0.0
    """A first guess of c (time of one draft token / one target step) before any is measured."""
    reads_features: bool = False
    """Whether it reads the target's features (eagle, eagle3, medusa): the engine then has the
    target record them for the generations this drafter serves, and only for those."""
    feature_layers: tuple[int, ...] = ()
    """Which: () the last layer's (after the final norm); else the hidden states entering these
    layers, concatenated (eagle3)."""

    def bind(self, target) -> None:
        """The engine's target Backend; drafters that read its features (eagle, medusa) keep it."""

    def fork(self) -> Drafter:
        """A drafter for another sequence (a batch runs one per sequence): it shares this one's
        weights and any cross-request state (the suffix drafter's history), and none of the state
        of the sequence it drafts for (a cache). Bind it to its own target sequence. Drafters with
        per-sequence state copy it here; NotImplementedError where that cannot be done."""
        return copy.copy(self)

    def for_sampling(self, sampling: SamplingParams) -> Drafter:
        """The drafter that serves a generation with these sampling settings: itself, unless it
        routes (routed.ByTemperature picks one of its own per generation)."""
        return self

    def begin(self, prompt: torch.Tensor) -> None:
        """A new sequence starts with this (P,) prompt. Stateful drafters prefill here."""

    @abstractmethod
    def propose(
        self, context: torch.Tensor, gamma: int, sampling: SamplingParams, generator: torch.Generator
    ) -> Proposal:
        """Guess up to `gamma` tokens that follow the (L,) context, drawing with `generator`."""

    def feedback(self, kept: int) -> None:
        """The engine kept the first `kept` tokens of context + proposal (a new target token follows).
        Stateful drafters roll back to at most that length."""
