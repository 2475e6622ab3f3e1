"""The interface the engine and the model drafter use to run a causal LM with a KV cache.

A backend holds the state of one sequence: the cache covers the token ids in `held`.
`forward` appends tokens and returns their next-token logits; `rollback` forgets everything from a
position on, so a rejected draft costs nothing to undo; `prefill` reuses the longest prefix the
cache already holds (the same prompt sampled again, a chat that grows turn by turn).

>>> # backend.forward(torch.tensor([5, 6, 7])) -> (3, V) logits; backend.held == [5, 6, 7]
>>> # backend.rollback(1)                       -> the cache holds token 5 only
>>> # backend.prefill(torch.tensor([5, 8]))     -> runs only token 8

Backends that can (`supports_trees`) also score a token tree in one pass (`forward_tree`: each
node sees the context and its ancestors) and keep just the accepted path (`keep_path`).

A backend that can (`can_fork`) makes more sequences on the same weights (`fork`), and
`forward_many` runs one step of several of them in one pass: continuous batching in the server.

For drafters that read the target's features (EAGLE, Medusa) the engine turns on `record_hidden`:
the backend then also keeps the last layer's output (after the final norm, the vector the LM head
reads) of every position it holds, and `hidden(start, end)` returns them; with `hidden_layers`
(EAGLE-3) it keeps the hidden states entering those layers instead, concatenated.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch


@dataclass
class Step:
    """What one sequence adds in a pass: token ids, a tree's parents (None: a chain), and whether
    its logits are wanted (a prompt being prefilled needs none)."""

    ids: torch.Tensor
    parents: torch.Tensor | None = None
    wants_logits: bool = True

    @property
    def rows(self) -> int:
        return self.ids.numel()


class Backend(ABC):
    path: str
    """Which implementation runs the forward passes (reported in the stats)."""
    vocab_size: int
    """Width of the logits (may exceed the tokenizer's size when the embedding is padded)."""
    max_length: int | None
    """The longest sequence the model supports (None: unknown)."""
    device: torch.device
    fast_rows: int | None = None
    """The most positions one pass scores on the fast path, whose numbers do not depend on how
    many positions are scored together; None where there is no such path. gamma="auto" stays
    within it (fast_rows - 1 drafts), so speculative greedy output equals plain greedy output."""
    cheap_rows: bool = False
    """Whether a pass of 16-32 positions costs about what one does (matrix tiles): token trees and
    long chains are then nearly free to verify."""
    gguf = None
    """The GGUF blocks the linear layers run on (backends/gguf.GGUFWeights; the lean backend's
    --weights gguf), None for float weights."""

    def __init__(self) -> None:
        self.held: list[int] = []
        self.in_use_by: object | None = None
        """The live generation whose sequence the cache holds (one at a time: see the engine)."""
        self._record_hidden = False
        self._hidden_layers: tuple[int, ...] = ()
        self._hidden: torch.Tensor | None = None  # (capacity, d) features by position

    @property
    def record_hidden(self) -> bool:
        return self._record_hidden

    @record_hidden.setter
    def record_hidden(self, on: bool) -> None:
        """Turning recording on starts a new sequence: positions already cached have no features."""
        if on and not self._record_hidden:
            self.reset()
        self._record_hidden = on

    @property
    def hidden_layers(self) -> tuple[int, ...]:
        """What record_hidden keeps: () the final-norm features; else the hidden states entering these
        layers (0 = the embeddings), concatenated, as EAGLE-3 reads them; layer N (the number of
        layers) is the final-norm output, as in transformers' `hidden_states`."""
        return self._hidden_layers

    @hidden_layers.setter
    def hidden_layers(self, layers: tuple[int, ...]) -> None:
        """A change starts a new sequence: positions already cached have none of the new features."""
        layers = tuple(int(i) for i in layers)
        if layers != self._hidden_layers:
            self.reset()
            self._hidden = None
        self._hidden_layers = layers

    def record_features(self, on: bool, layers: tuple[int, ...] = ()) -> None:
        """Record (or stop recording) the features `layers` names (see hidden_layers)."""
        self.hidden_layers = layers if on else ()
        self.record_hidden = on

    def hidden(self, start: int = 0, end: int | None = None) -> torch.Tensor:
        """(end - start, d) last-layer features of held positions, (end - start, k*d) with k
        hidden_layers (needs record_hidden)."""
        end = self.length if end is None else end
        if not self._record_hidden or self._hidden is None:
            raise RuntimeError("hidden states are not recorded: set record_hidden = True before the sequence starts")
        if not 0 <= start <= end <= self.length:
            raise ValueError(f"positions {start}..{end} are not all held (the cache holds {self.length})")
        return self._hidden[start:end]

    def _store_hidden(self, start: int, features: torch.Tensor) -> None:
        """Subclasses call this from _forward with the (n, d) final-norm features of positions start..
        (the (n, k*d) layer inputs with hidden_layers)."""
        if not self._record_hidden:
            return
        end = start + features.shape[0]
        if self._hidden is None or self._hidden.shape[0] < end:
            grown = features.new_zeros((max(end, 2 * (0 if self._hidden is None else self._hidden.shape[0]), 256),
                                        features.shape[1]))
            if self._hidden is not None:
                grown[: self._hidden.shape[0]] = self._hidden
            self._hidden = grown
        self._hidden[start:end] = features

    def numeric_path(self, rows: int) -> str:
        """Which implementation computes a pass over `rows` positions (passes on one path round the
        same way whatever the row count only where it is the fast path, see fast_rows)."""
        return self.path

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

    supports_trees: bool = False
    """Whether forward_tree works (a tree attention mask on this backend's path)."""

    def forward_tree(self, ids: torch.Tensor, parents: torch.Tensor) -> torch.Tensor:
        """Append a token tree in one pass: ids (n + 1,) are the root (the next token of the
        sequence) and n nodes whose parents (n,) index earlier nodes (-1 = the root). Row i of
        the (n + 1, V) logits is the distribution after the root path ending at row i. Until
        `keep_path`, the cache holds the rows in slot order."""
        if not self.supports_trees:
            raise NotImplementedError(f"the {self.path} backend scores chains only")
        from ..modeling.tree import TreeLayout

        start = self.length
        logits = self._forward_tree(ids, TreeLayout.of(parents), start)
        self.held.extend(ids.tolist())
        return logits

    def keep_path(self, root: int, path: list[int]) -> None:
        """After forward_tree put its root at position `root`: keep the root and the nodes on
        `path` (node indices, root to leaf) as positions root + 1, root + 2, ...; drop the rest."""
        tokens = [self.held[root + 1 + i] for i in path]
        slots = [root + 1 + i for i in path]
        with torch.inference_mode():  # the caches are inference tensors
            self._keep(root + 1, slots)
            if self._record_hidden and self._hidden is not None and slots:
                self._hidden[root + 1 : root + 1 + len(slots)] = self._hidden[torch.tensor(slots)]
        del self.held[root + 1 :]
        self.held.extend(tokens)

    def _forward_tree(self, ids: torch.Tensor, layout, start: int) -> torch.Tensor:
        raise NotImplementedError

    def _keep(self, start: int, slots: list[int]) -> None:
        raise NotImplementedError

    def rollback(self, length: int) -> None:
        """Keep only the first `length` cached tokens."""
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot roll back to {length}: the cache holds {self.length} tokens")
        self._rollback(length)
        del self.held[length:]

    def prefill(self, ids: torch.Tensor) -> None:
        """Make the cache hold exactly `ids`, reusing the longest prefix it already holds."""
        common = self.reuse(ids)
        if common < ids.numel():
            self.append(ids[common:])

    def reuse(self, ids: torch.Tensor) -> int:
        """Keep the longest prefix of `ids` the cache holds (and can roll back to); return its length."""
        common = self.common_prefix(ids)
        if common < self.oldest_reachable():
            self.reset()
            common = 0
        self.rollback(common)
        return common

    def common_prefix(self, ids: torch.Tensor) -> int:
        """How many leading tokens of `ids` the cache holds."""
        common = 0
        for mine, theirs in zip(self.held, ids.tolist()):
            if mine != theirs:
                break
            common += 1
        return common

    def append(self, ids: torch.Tensor) -> None:
        """Append tokens without wanting their logits (a prompt); backends may skip the LM head."""
        self.forward(ids)

    can_fork: bool = False
    """Whether `fork` makes another sequence on the same weights."""

    def fork(self) -> Backend:
        """A new, empty sequence sharing this one's weights (its own cache)."""
        raise NotImplementedError(f"the {self.path} backend holds one sequence")

    def forward_many(self, work: list[tuple[Backend, Step]]) -> list[torch.Tensor | None]:
        """One step of each (sequence, step) pair, the sequences being this backend or its forks:
        their logits (None where not wanted). Here one pass each; backends that batch override it."""
        out = []
        for sequence, step in work:
            if step.parents is not None:
                out.append(sequence.forward_tree(step.ids, step.parents))
            elif step.wants_logits:
                out.append(sequence.forward(step.ids))
            else:
                sequence.append(step.ids)
                out.append(None)
        return out

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
