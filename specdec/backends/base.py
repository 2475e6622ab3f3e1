"""The interface the engine and the model drafter use to run a causal LM with a KV cache.

A backend holds the state of one sequence: the cache covers tokens [0, length). `forward` appends
tokens and returns their next-token logits; `rollback` forgets everything from a position on, so a
rejected draft costs nothing to undo.

>>> # backend.forward(torch.tensor([5, 6, 7])) -> (3, V) logits; backend.length == 3
>>> # backend.rollback(1)                       -> the cache holds token 5 only
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch


class Backend(ABC):
    path: str
    """Which implementation runs the forward passes (reported in the stats)."""
    vocab_size: int
    """Width of the logits (may exceed the tokenizer's size when the embedding is padded)."""
    max_length: int | None
    """The longest sequence the model supports (None: unknown)."""
    device: torch.device

    @property
    @abstractmethod
    def length(self) -> int:
        """Tokens currently in the cache."""

    @abstractmethod
    def reset(self) -> None:
        """Start a new sequence with an empty cache."""

    @abstractmethod
    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """Append (n,) token ids at positions length..length+n-1; return their (n, V) float32 logits,
        row i being the distribution of the token after ids[i]."""

    @abstractmethod
    def rollback(self, length: int) -> None:
        """Keep only the first `length` cached tokens."""
