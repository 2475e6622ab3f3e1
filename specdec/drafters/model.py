"""A draft model: a smaller causal LM that shares the target's tokenizer (the paper's "Intern").

It drafts autoregressively from its own KV cache and returns the warped distributions q its tokens
were drawn from, which exact verification needs. After each round it rolls its cache back to the
tokens the target kept.

Worked example, gamma=3: the cache holds the context up to the last kept token; the drafter feeds
the tokens it has not seen (at least the target's newest token), draws d1 from q1, feeds d1, draws
d2 from q2, feeds d2, draws d3 from q3: three forward passes, proposal [d1, d2, d3] with q (3, V).
"""

from __future__ import annotations

import torch

from ..backends import Backend
from ..config import SamplingParams
from ..decoding.sampling import argmax_rows, draw, probs
from ..errors import SpecdecError
from .base import Drafter, Proposal


class ModelDrafter(Drafter):
    name = "model"
    cost_prior = 0.1

    def __init__(self, backend: Backend, target_vocab_size: int, label: str | None = None):
        if backend.vocab_size < target_vocab_size:
            raise SpecdecError(
                f"the draft model{' ' + repr(label) if label else ''} knows {backend.vocab_size} token ids but the target "
                f"can emit {target_vocab_size}: the draft would have to read ids it has no embedding for. Use a "
                "draft model with the target's full vocabulary, or a drafter that needs no model: prompt-lookup or ngram")
        self.backend = backend
        self.target_vocab_size = target_vocab_size
        if label:
            self.name = f"model:{label}"

    def _fit_vocab(self, logits: torch.Tensor) -> torch.Tensor:
        """Draft logits over the target's logit width: padded rows cut off, or missing ones at -inf."""
        width = self.target_vocab_size
        if logits.shape[-1] >= width:
            return logits[..., :width]
        pad = logits.new_full((*logits.shape[:-1], width - logits.shape[-1]), float("-inf"))
        return torch.cat([logits, pad], dim=-1)

    def fork(self) -> ModelDrafter:
        twin = super().fork()
        twin.backend = self.backend.fork()  # its own cache on the same weights
        return twin

    def begin(self, prompt: torch.Tensor) -> None:
        self.backend.prefill(prompt[:-1])

    def propose(
        self, context: torch.Tensor, gamma: int, sampling: SamplingParams, generator: torch.Generator
    ) -> Proposal:
        unseen = context[self.backend.length :]  # (>= 1,) at least the target's newest token
        tokens, dists = [], []
        for i in range(gamma):
            logits = self._fit_vocab(self.backend.forward(unseen)[-1:])  # (1, V)
            if sampling.greedy:
                token = int(argmax_rows(logits)[0])
            else:
                q = probs(logits, sampling)[0]  # (V,)
                token = draw(q, sampling, generator, position=context.numel() + i)
                dists.append(q)
            tokens.append(token)
            unseen = torch.tensor([token])
        return Proposal(tokens=torch.tensor(tokens, dtype=torch.long), q=torch.stack(dists) if dists else None)

    def feedback(self, kept: int) -> None:
        if kept < self.backend.length:
            self.backend.rollback(kept)
        else:
            self.backend.rollback(self.backend.length)  # lets sliding-window caches trim themselves
