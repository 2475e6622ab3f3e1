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
from ..modeling.tree import chain, depths


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
    order (specdec.decoding.rejection, token trees), so the likeliest should come first."""
    scores: torch.Tensor | None = None
    """(k,) optional: the drafter's estimate of each node's chance to be accepted (the product of
    the draft probabilities along its path, or the share of matches that continue that way); never
    more than its parent's. With it, gamma="auto" trims a tree to the nodes that pay (top)."""

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
        return self._select(list(range(n)))

    def top(self, n: int, by: list[float] | None = None) -> Proposal:
        """A tree trimmed to at most n nodes by `scores` (or the values `by`, one a node, never more
        than the parent's), the likeliest first, a node only with its parent. Deterministic children
        (point masses) are kept or dropped one by one; sampled ones (q given) a whole family at a
        time, in order of their parent's score: the rule that verifies
        them assumes a node's children are all its draws from q, whatever they drew, so their own
        values must not decide which stay. Without scores, or for a chain, the first n nodes (head).
        Exact as long as n does not depend on the target's output."""
        k = self.tokens.numel()
        if k <= n or self.parents is None or self.scores is None:
            return self.head(n)
        parents, scores = self.parents.tolist(), self.scores.tolist() if by is None else list(by)
        kept: set[int] = set()
        if self.q is None:
            for node in sorted(range(k), key=lambda i: (-scores[i], i)):
                if len(kept) == n:
                    break
                if parents[node] < 0 or parents[node] in kept:
                    kept.add(node)
        else:
            families: dict[int, list[int]] = {}
            for node, parent in enumerate(parents):
                families.setdefault(parent, []).append(node)
            for parent in sorted(families, key=lambda p: (-(scores[p] if p >= 0 else 1.0), p)):
                if (parent < 0 or parent in kept) and len(kept) + len(families[parent]) <= n:
                    kept.update(families[parent])
        return self._select(sorted(kept))

    def _select(self, index: list[int]) -> Proposal:
        """The nodes at `index` (ascending, each with its parent), renumbered; a tree that is one
        path becomes a chain."""
        pick = torch.tensor(index, dtype=torch.long)
        q = None if self.q is None else self.q[pick]
        scores = None if self.scores is None else self.scores[pick]
        if self.parents is None:
            return Proposal(self.tokens[pick], q, None, scores)
        renumber = {old: new for new, old in enumerate(index)}
        parents = torch.tensor([renumber.get(int(self.parents[i]), -1) for i in index], dtype=torch.long)
        return Proposal.tree(self.tokens[pick], parents, q, scores)

    def depths(self) -> torch.Tensor:
        """(k,) each token's depth: 1..k along a chain, a tree's node depths."""
        return torch.arange(1, self.tokens.numel() + 1) if self.parents is None else depths(self.parents)

    @staticmethod
    def tree(tokens: torch.Tensor, parents: torch.Tensor, q: torch.Tensor | None = None,
             scores: torch.Tensor | None = None) -> Proposal:
        """A token tree, or the chain it is when it is one path (chains run on the fast path)."""
        if torch.equal(parents, chain(parents.numel())):
            parents = None
        return Proposal(tokens, q, parents, scores)

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

    @property
    def vocab_share(self) -> float | None:
        """The share of the target's vocabulary this drafter can propose, where it draws from a
        smaller one (a trained drafter's draft vocabulary, the intersection with another tokenizer's);
        None: all of it."""
        return None

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

    def route(self, context: torch.Tensor):
        """Which of its ways this drafter will draft after the (L,) context (asked before `propose`,
        which then keeps to it): a key for gamma="auto" to size that way's rounds by its own record
        (GammaPolicy.select). None for a drafter with one way; it must not depend on random draws."""
        return None

    def route_cost_prior(self, route) -> float:
        """A first guess of c for one of its ways (`route`), before that way's drafting is measured."""
        return self.cost_prior

    @abstractmethod
    def propose(
        self, context: torch.Tensor, gamma: int, sampling: SamplingParams, generator: torch.Generator
    ) -> Proposal:
        """Guess up to `gamma` tokens that follow the (L,) context, drawing with `generator`."""

    def feedback(self, kept: int) -> None:
        """The engine kept the first `kept` tokens of context + proposal (a new target token follows).
        Stateful drafters roll back to at most that length."""
