"""Medusa: K heads over the target's last feature f_{L-2}; head k proposes x_{L-1+k}, k = 1..K,
independently of the others' draws."""

from __future__ import annotations

import torch

from ..config import SamplingParams
from .base import Proposal
from .feature_heads import FeatureHeadsDrafter
from .nets import DraftNet


class MedusaDrafter(FeatureHeadsDrafter):
    cost_prior = 0.02

    def __init__(self, net: DraftNet, label: str):
        super().__init__(net, f"medusa:{label}")

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
