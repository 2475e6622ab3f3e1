"""Medusa: K heads over the target's last feature f_{L-2}; head k proposes x_{L-1+k}, k = 1..K,
independently of the others' draws."""

from __future__ import annotations

import torch

from ..backends import Backend
from ..config import SamplingParams
from ..vocab_map import VocabMap
from .base import Drafter, Proposal
from .nets import DraftNet


class MedusaDrafter(Drafter):
    cost_prior = 0.02
    reads_features = True

    def __init__(self, net: DraftNet, label: str):
        self.net, self.name = net, f"medusa:{label}"
        self.target: Backend | None = None

    def bind(self, target: Backend) -> None:
        self.target = target
        self.vocab = VocabMap(self.net.vocab, target.vocab_size)  # the heads' rows -> the target's ids

    @property
    def vocab_share(self) -> float | None:
        return self.net.vocab.numel() / self.target.vocab_size if self.target is not None else None

    @torch.inference_mode()
    def propose(self, context: torch.Tensor, gamma: int, sampling: SamplingParams,
                generator: torch.Generator) -> Proposal:
        known = self.target.length
        if known == 0 or known + 1 != context.numel():
            return Proposal.empty()
        k = min(gamma, self.net.config.medusa_heads)
        feature = self.target.hidden(known - 1, known)  # (1, d): f_{L-2}
        logits = self.net.logits(self.net.medusa_features(feature)[:k, 0]).float()  # (k, |S|)
        tokens, dists = [], []
        for i in range(k):
            token, _, q = self.vocab.draw(logits[i : i + 1], sampling, generator, position=context.numel() + i)
            tokens.append(token)
            if q is not None:
                dists.append(q)
        return Proposal(torch.tensor(tokens, dtype=torch.long), torch.stack(dists) if dists else None)
