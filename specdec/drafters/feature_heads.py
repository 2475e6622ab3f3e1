"""What the drafters over the target's features share (EAGLE, EAGLE-3, Medusa): a trained net whose heads
score a draft vocabulary, bound to the target backend whose features it reads, its rows mapped to the
target's token ids."""

from __future__ import annotations

from ..backends import Backend
from .base import Drafter
from .nets import DraftNet
from .vocab_map import VocabMap


class FeatureHeadsDrafter(Drafter):
    reads_features = True

    def __init__(self, net: DraftNet, name: str):
        self.net, self.name = net, name
        self.target: Backend | None = None

    def bind(self, target: Backend) -> None:
        self.target = target
        self.vocab = VocabMap(self.net.vocab, target.vocab_size)  # the heads' rows -> the target's ids

    @property
    def vocab_share(self) -> float | None:
        """The share of the target's vocabulary the heads can propose (None until bound)."""
        return self.net.vocab.numel() / self.target.vocab_size if self.target is not None else None
