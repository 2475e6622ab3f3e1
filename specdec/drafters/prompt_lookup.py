"""Prompt lookup: propose what followed the last occurrence of the context's final n tokens.

Answers that quote their input (rewrite this code, summarise this page, translate this message)
repeat long runs of the prompt, and a table lookup costs nothing next to a target step (c ~ 0).

Worked example, max_ngram=2, gamma=3, context ids [7, 8, 9, 4, 7, 8]:
the final bigram [7, 8] last occurred at position 0 (not counting itself), followed by [9, 4, 7],
so the proposal is [9, 4, 7]. With no match for any n >= min_ngram the proposal is empty and the
round is a plain decoding step.
"""

from __future__ import annotations

import torch

from ..config import SamplingParams
from .base import Drafter, Proposal


def occurrences(sequence: torch.Tensor, pattern: torch.Tensor) -> list[int]:
    """Where `pattern` starts in `sequence`, first to last."""
    n = pattern.numel()
    if n == 0 or sequence.numel() < n:
        return []
    return (sequence.unfold(0, n, 1) == pattern).all(dim=1).nonzero().flatten().tolist()


class PromptLookupDrafter(Drafter):
    name = "prompt-lookup"

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1):
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self.matched = 0
        """The n of the latest proposal's match (0: none)."""

    def ngram_sizes(self, context: torch.Tensor) -> range:
        """The n to try, longest first."""
        return range(min(self.max_ngram, context.shape[0] - 1), self.min_ngram - 1, -1)

    @staticmethod
    def hits(context: torch.Tensor, n: int) -> list[int]:
        """Where earlier occurrences of the context's final n-gram start, oldest first."""
        return occurrences(context[:-1], context[-n:])  # context[:-1]: the final n-gram itself excluded

    def matches(self, context: torch.Tensor) -> tuple[int, list[int]]:
        """The longest n whose final n-gram occurred before, and where each earlier occurrence
        starts, oldest first; (0, []) when none did. `matched` keeps that n (for routers)."""
        self.matched = 0
        for n in self.ngram_sizes(context):
            hits = self.hits(context, n)
            if hits:
                self.matched = n
                return n, hits
        return 0, []

    def propose(
        self, context: torch.Tensor, gamma: int, sampling: SamplingParams, generator: torch.Generator
    ) -> Proposal:
        n, hits = self.matches(context)
        if not hits:
            return Proposal.empty()
        start = hits[-1] + n  # the most recent occurrence's continuation
        return Proposal(tokens=context[start : start + gamma].clone())


class PromptLookupTreeDrafter(PromptLookupDrafter):
    """Prompt lookup with every match: the continuations of all earlier occurrences of the final
    n-gram (the most recent `max_matches`) merged into a tree, up to `max_nodes` nodes. A path
    followed by more occurrences comes first among its siblings (then the more recent one); a
    single continuation is proposed as a chain.

    Worked example, gamma=2, context [5, 1, 2, 5, 1, 3, 5, 1, 2, 9, 5, 1]: the final bigram [5, 1]
    occurred at 0, 3 and 6, followed by [2, 5], [3, 5] and [2, 9]; the tree is 2 (twice) with
    children 9 (the more recent) and 5, then 3 with child 5."""

    name = "prompt-lookup-tree"

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1, max_nodes: int = 12, max_matches: int = 32):
        super().__init__(max_ngram, min_ngram)
        if max_nodes < 1 or max_matches < 1:
            raise ValueError(f"max_nodes and max_matches must be >= 1, got {max_nodes}, {max_matches}")
        self.max_nodes, self.max_matches = max_nodes, max_matches

    def continuations(self, context: torch.Tensor, gamma: int) -> list[list[int]]:
        """What followed earlier occurrences of the context's final n-gram, most recent first."""
        n, hits = self.matches(context)
        return self.following(context, n, hits, gamma)

    def following(self, context: torch.Tensor, n: int, hits: list[int], gamma: int) -> list[list[int]]:
        """Up to gamma tokens after each of the latest max_matches hits of an n-gram, most recent first."""
        return [context[hit + n : hit + n + gamma].tolist() for hit in reversed(hits[-self.max_matches :])]

    def propose(
        self, context: torch.Tensor, gamma: int, sampling: SamplingParams, generator: torch.Generator
    ) -> Proposal:
        return self.tree_of(self.continuations(context, gamma))

    def tree_of(self, continuations: list[list[int]]) -> Proposal:
        """Continuations (most recent first) merged into a tree of at most max_nodes nodes, the
        paths more continuations share first, each scored by the share of continuations that take
        it; a single path is proposed as a chain."""
        support: dict[tuple[int, ...], list[int]] = {}  # path -> [continuations through it, recency rank]
        for rank, continuation in enumerate(continuations):
            for depth in range(1, len(continuation) + 1):
                support.setdefault(tuple(continuation[:depth]), [0, rank])[0] += 1
        if not support:
            return Proposal.empty()
        priority = sorted(support, key=lambda path: (-support[path][0], len(path), support[path][1]))
        chosen: set[tuple[int, ...]] = set()
        for path in priority:  # a parent has at least its child's support, so it is met first
            if len(path) == 1 or path[:-1] in chosen:
                chosen.add(path)
                if len(chosen) == self.max_nodes:
                    break
        rank = {path: i for i, path in enumerate(priority)}
        nodes = sorted(chosen, key=lambda path: (len(path), rank[path]))  # parents first, siblings by priority
        index = {path: i for i, path in enumerate(nodes)}
        tokens = torch.tensor([path[-1] for path in nodes], dtype=torch.long)
        parents = torch.tensor([index[path[:-1]] if len(path) > 1 else -1 for path in nodes], dtype=torch.long)
        shares = torch.tensor([support[path][0] / len(continuations) for path in nodes])  # of the matches, how many go on so
        return Proposal.tree(tokens, parents, scores=shares)  # one continuation: a chain


class AutoPromptLookup(PromptLookupTreeDrafter):
    """The default drafter's prompt lookup: every match as a token tree where rows are cheap (AMX
    tiles: a 16-node tree costs about one position) or where the target has no row-invariant fast
    path (every pass runs on ATen or oneDNN, where a tree of 12 nodes costs about what a chain of 4
    does); the most recent match as a chain where chains of up to 16 positions run on kernels.cpp's
    dot products, whose cost grows with every row. Measured on an AMD EPYC in float32
    (docs/benchmarks.md's log): the tree gives 2.0-3.2x plain on code, code editing and summaries against
    the chain's 1.3-1.7x."""

    def __init__(self):
        super().__init__()
        self.trees = True

    def bind(self, target) -> None:
        self.trees = target.fast_rows is None or target.cheap_rows
        self.name = "prompt-lookup-tree" if self.trees else "prompt-lookup"

    def propose(
        self, context: torch.Tensor, gamma: int, sampling: SamplingParams, generator: torch.Generator
    ) -> Proposal:
        if self.trees:
            return super().propose(context, gamma, sampling, generator)
        return PromptLookupDrafter.propose(self, context, gamma, sampling, generator)
