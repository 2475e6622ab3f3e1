"""The interface the engine and the model drafter use to run a causal LM with a KV cache.

A backend holds the state of one sequence: the cache covers the token ids in `held`.
`forward` appends tokens and returns their next-token logits; `rollback` forgets everything from a
position on, so a rejected draft costs nothing to undo; `prefill` reuses the longest prefix the
cache already holds (the same prompt sampled again, a chat that grows turn by turn).

>>> # backend.forward(torch.tensor([5, 6, 7])) -> (3, V) logits; backend.held == [5, 6, 7]
>>> # backend.rollback(1)                       -> the cache holds token 5 only
>>> # backend.prefill(torch.tensor([5, 8]))     -> runs only token 8
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

    def __init__(self) -> None:
        self.held: list[int] = []

    @property
    def length(self) -> int:
        """Tokens currently in the cache."""
        return len(self.held)

    def reset(self) -> None:
        """Start a new sequence with an empty cache."""
        self.held = []
        self._reset()

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """Append (n,) token ids at positions length..length+n-1; return their (n, V) float32 logits,
        row i being the distribution of the token after ids[i]."""
        logits = self._forward(ids, self.length)
        self.held.extend(ids.tolist())
        return logits

    def rollback(self, length: int) -> None:
        """Keep only the first `length` cached tokens."""
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot roll back to {length}: the cache holds {self.length} tokens")
        self._rollback(length)
        del self.held[length:]

    def prefill(self, ids: torch.Tensor) -> None:
        """Make the cache hold exactly `ids`, reusing the longest prefix it already holds."""
        wanted = ids.tolist()
        common = 0
        for mine, theirs in zip(self.held, wanted):
            if mine != theirs:
                break
            common += 1
        if common < self.oldest_reachable():
            self.reset()
            common = 0
        self.rollback(common)
        if common < len(wanted):
            self.forward(ids[common:])

    def oldest_reachable(self) -> int:
        """The shortest length `rollback` can still reach exactly (caches that forget, such as
        sliding windows, cannot go back far)."""
        return 0

    @abstractmethod
    def _reset(self) -> None: ...

    @abstractmethod
    def _forward(self, ids: torch.Tensor, start: int) -> torch.Tensor: ...

    @abstractmethod
    def _rollback(self, length: int) -> None: ...
