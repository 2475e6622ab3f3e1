"""A trained draft LM (kind draft-lm) behind the backend interface, so ModelDrafter drafts with it as
with any draft model, on its own KV cache."""

from __future__ import annotations

import torch

from ..backends import Backend
from .nets import DraftNet
from .vocab_map import VocabMap


class DraftLMBackend(Backend):
    """A trained draft LM behind the backend interface, so ModelDrafter drafts with it."""

    path = "draft-lm"

    def __init__(self, net: DraftNet, vocab_width: int):
        super().__init__()
        self.net, self.vocab_size, self.max_length = net, vocab_width, None
        self.vocab = VocabMap(net.vocab, vocab_width)
        self.device = net.vocab.device
        self.cache = net.new_cache()

    def _reset(self) -> None:
        self.cache = self.net.new_cache()

    def _rollback(self, length: int) -> None:
        self.cache.length = length

    can_fork = True

    def fork(self) -> DraftLMBackend:
        return DraftLMBackend(self.net, self.vocab_size)

    @torch.inference_mode()
    def _forward(self, ids: torch.Tensor, start: int) -> torch.Tensor:
        logits = self.net.lm(ids.to(self.device)[None], self.cache, start)[0].float()  # (n, |S|)
        return self.vocab.full(logits, float("-inf"))
