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


class PromptLookupDrafter(Drafter):
    name = "prompt-lookup"

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1):
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        self.max_ngram, self.min_ngram = max_ngram, min_ngram

    def propose(
        self, context: torch.Tensor, gamma: int, sampling: SamplingParams, generator: torch.Generator
    ) -> Proposal:
        length = context.shape[0]
        for n in range(min(self.max_ngram, length - 1), self.min_ngram - 1, -1):
            # Windows that start at 0..length-n-1: every earlier occurrence, the final n tokens excluded.
            windows = context[:-1].unfold(0, n, 1)  # (length - n, n)
            hits = (windows == context[-n:]).all(dim=1).nonzero()
            if hits.numel():
                start = int(hits[-1]) + n  # the most recent occurrence's continuation
                return Proposal(tokens=context[start : start + gamma].clone())
        return Proposal.empty()
