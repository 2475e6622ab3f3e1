"""Suffix drafting (after SuffixDecoding, Oliaro et al. 2025): prompt lookup over the request's own
context *and* over earlier generations, proposed as a token tree.

Agentic and repetitive work asks for the same text again and again: the same tool output quoted,
the same code edited twice, the same form letter. One drafter instance keeps a bounded history of
the sequences it has seen (prompt and output, at most `max_tokens` tokens, the oldest dropped
first); each round the final n-gram is looked up in the context and in that history, and every
continuation found (the context's first, then the history's, most recent first) is merged into one
tree (PromptLookupTreeDrafter.tree_of). In the server one drafter serves every request, so the
history spans requests. Drafts never change what is emitted (verification keeps the target's
law), but how fast an answer comes can depend on text earlier requests contained.

Worked example: a first request generated [..., 7, 8, 9, 4]; a later context ending in [7, 8]
with no earlier [7, 8] of its own proposes 9, 4 from the history.
"""

from __future__ import annotations

from collections import deque

import torch

from ..config import SamplingParams
from .base import Proposal
from .prompt_lookup import PromptLookupTreeDrafter, occurrences

SEPARATOR = -1  # between sequences in the history, so no match or continuation crosses two of them


class SequenceHistory:
    """Earlier token sequences, at most `max_tokens` in all, oldest dropped first."""

    def __init__(self, max_tokens: int = 1 << 16):
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        self.max_tokens = max_tokens
        self.sequences: deque[list[int]] = deque()
        self.tokens = 0
        self._corpus = torch.zeros(0, dtype=torch.long)

    def add(self, ids: list[int]) -> None:
        ids = ids[-self.max_tokens :]
        if not ids:
            return
        self.sequences.append(ids)
        self.tokens += len(ids)
        while self.tokens > self.max_tokens:
            self.tokens -= len(self.sequences.popleft())
        joined: list[int] = []
        for sequence in self.sequences:
            joined += sequence + [SEPARATOR]
        self._corpus = torch.tensor(joined, dtype=torch.long)

    def continuations(self, pattern: list[int], length: int, limit: int) -> list[list[int]]:
        """Up to `limit` continuations (at most `length` tokens, within one sequence) of the
        occurrences of `pattern`, the most recent first."""
        n = len(pattern)
        out: list[list[int]] = []
        if limit <= 0:
            return out
        for hit in reversed(occurrences(self._corpus, torch.tensor(pattern, dtype=torch.long))):
            continuation = self._corpus[hit + n : hit + n + length].tolist()
            if SEPARATOR in continuation:
                continuation = continuation[: continuation.index(SEPARATOR)]
            if continuation:
                out.append(continuation)
                if len(out) == limit:
                    break
        return out


class SuffixDrafter(PromptLookupTreeDrafter):
    name = "suffix"

    def __init__(self, history: SequenceHistory | None = None, max_ngram: int = 3, min_ngram: int = 1,
                 max_nodes: int = 12, max_matches: int = 32):
        super().__init__(max_ngram, min_ngram, max_nodes, max_matches)
        self.history = history if history is not None else SequenceHistory()
        self._last: torch.Tensor | None = None  # the latest context of the sequence in progress

    def fork(self) -> SuffixDrafter:
        twin = super().fork()  # the history is shared: every sequence learns from every other
        twin._last = None
        return twin

    def begin(self, prompt: torch.Tensor) -> None:
        """A new sequence: the one before it (as far as it was drafted for) joins the history."""
        if self._last is not None:
            self.history.add(self._last.tolist())
        self._last = None

    def continuations(self, context: torch.Tensor, gamma: int) -> list[list[int]]:
        for n in self.ngram_sizes(context):
            own = self.following(context, n, self.hits(context, n), gamma)
            earlier = self.history.continuations(context[-n:].tolist(), gamma, self.max_matches - len(own))
            if own or earlier:
                return own + earlier
        return []

    def propose(
        self, context: torch.Tensor, gamma: int, sampling: SamplingParams, generator: torch.Generator
    ) -> Proposal:
        self._last = context
        return super().propose(context, gamma, sampling, generator)
