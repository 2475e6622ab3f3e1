"""Pure-tensor stand-ins for models: statistical tests run on these in seconds, not minutes."""

from __future__ import annotations

import torch

from specdec.backends import Backend


class TableLM(Backend):
    """A causal LM whose next-token logits are a fixed random function of the last `order` tokens
    (one table row per context), behind the backend interface with a real held/rollback state.

    `row_noise` imitates reduced precision: a pass over n > 1 positions adds a deterministic
    perturbation of that size to each row (depending on the position and n), as a GEMM whose
    blocking depends on the row count would; `fast_rows` then declares passes up to that many rows
    to be exact (no perturbation), like the kernels' row-invariant path."""

    path = "table"

    def __init__(self, vocab: int = 8, order: int = 2, seed: int = 0, scale: float = 1.5,
                 row_noise: float = 0.0, fast_rows: int | None = None, max_length: int | None = None,
                 eos: int | None = None, eos_bias: float = 0.0):
        super().__init__()
        generator = torch.Generator().manual_seed(seed)
        self.vocab_size, self.order, self.max_length = vocab, order, max_length
        self.table = torch.randn(vocab ** order, vocab, generator=generator) * scale
        if eos is not None:  # make the end-of-sequence token likelier (or rarer) everywhere
            self.table[:, eos] += eos_bias
        self.device = torch.device("cpu")
        self.row_noise, self.fast_rows = row_noise, fast_rows
        self.calls: list[int] = []  # rows per forward pass, for tests that count them

    def numeric_path(self, rows: int) -> str:
        return "table"

    def index(self, context: list[int]) -> int:
        window = ([0] * self.order + context)[-self.order:]
        value = 0
        for token in window:
            value = value * self.vocab_size + token
        return value

    def _forward(self, ids: torch.Tensor, start: int) -> torch.Tensor:
        sequence = self.held[:start] + ids.tolist()
        n = ids.shape[0]
        self.calls.append(n)
        logits = torch.stack([self.table[self.index(sequence[: start + i + 1])] for i in range(n)])
        if self.row_noise and n > 1 and not (self.fast_rows and n <= self.fast_rows):
            g = torch.Generator().manual_seed(1000 * n + start)
            logits = logits + self.row_noise * torch.randn(logits.shape, generator=g)
        return logits

    def _reset(self) -> None:
        pass

    def _rollback(self, length: int) -> None:
        pass
