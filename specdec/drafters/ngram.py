"""An n-gram table: "a lookup table that takes the previous token and returns whatever most often
followed it" (the paper's bigram drafter, alpha ~ 0.2 at c ~ 0). Not a neural network in any sense.

The table maps the last n-1 tokens to the token that most often followed them in a corpus, with
back-off to shorter contexts; drafting chains lookups. Its proposals are point masses (q one-hot),
so verification accepts a guess x with probability p(x).

Worked example, n=2, fitted on ids [5, 6, 5, 6, 5, 7]: after 5 came 6 twice and 7 once, after 6
came 5 twice, so from context [..., 5] with gamma=3 the drafter proposes [6, 5, 6].

Files are NumPy .npz archives: for each order, the contexts, their most frequent successor and
its count, plus a JSON header naming the tokenizer the ids belong to.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import torch

from ..config import SamplingParams
from ..errors import SpecdecError
from .base import Drafter, Proposal


class NGramTable:
    """Most-frequent-successor tables for context lengths 1..n-1."""

    def __init__(self, n: int, successors: dict[int, dict[tuple[int, ...], int]], tokenizer_id: str = "", source: str = ""):
        self.n = n
        self.successors = successors  # context length -> {context tuple: next token}
        self.tokenizer_id = tokenizer_id
        self.source = source

    @classmethod
    def fit(cls, sequences: Iterable[Iterable[int]], n: int = 2, tokenizer_id: str = "", source: str = "") -> NGramTable:
        """Count successors of every context of length 1..n-1 in the given token id sequences."""
        if n < 2:
            raise SpecdecError(f"an n-gram drafter needs n >= 2, got {n}")
        counts: dict[int, dict[tuple[int, ...], Counter]] = {m: defaultdict(Counter) for m in range(1, n)}
        for seq in sequences:
            ids = list(seq)
            for i in range(1, len(ids)):
                for m in range(1, min(n - 1, i) + 1):
                    counts[m][tuple(ids[i - m : i])][ids[i]] += 1
        successors = {
            m: {ctx: c.most_common(1)[0][0] for ctx, c in table.items()} for m, table in counts.items()
        }
        return cls(n, successors, tokenizer_id, source)

    def next_token(self, context: list[int]) -> int | None:
        """The most frequent successor of the longest known suffix of context, or None."""
        for m in range(min(self.n - 1, len(context)), 0, -1):
            token = self.successors[m].get(tuple(context[-m:]))
            if token is not None:
                return token
        return None

    def save(self, path: str | Path) -> None:
        arrays = {}
        for m, table in self.successors.items():
            keys = np.array(list(table.keys()), dtype=np.int64).reshape(len(table), m)
            arrays[f"context_{m}"] = keys
            arrays[f"next_{m}"] = np.array(list(table.values()), dtype=np.int64)
        header = {"format": "specdec-ngram", "version": 1, "n": self.n, "tokenizer": self.tokenizer_id, "source": self.source}
        arrays["header"] = np.frombuffer(json.dumps(header).encode(), dtype=np.uint8)
        with open(path, "wb") as f:
            np.savez_compressed(f, **arrays)

    @classmethod
    def load(cls, path: str | Path) -> NGramTable:
        try:
            data = np.load(path, allow_pickle=False)
            header = json.loads(bytes(data["header"]).decode())
        except (OSError, ValueError, KeyError) as exc:
            raise SpecdecError(f"{path} is not an n-gram table written by `specdec ngram fit` ({exc})") from None
        if header.get("format") != "specdec-ngram":
            raise SpecdecError(f"{path} is not an n-gram table written by `specdec ngram fit`")
        n = int(header["n"])
        successors = {
            m: dict(zip(map(tuple, data[f"context_{m}"].tolist()), data[f"next_{m}"].tolist())) for m in range(1, n)
        }
        return cls(n, successors, header.get("tokenizer", ""), header.get("source", ""))


class NGramDrafter(Drafter):
    def __init__(self, table: NGramTable):
        self.table = table
        self.name = "bigram" if table.n == 2 else f"{table.n}-gram"

    def propose(
        self, context: torch.Tensor, gamma: int, sampling: SamplingParams, generator: torch.Generator
    ) -> Proposal:
        history = context[-(self.table.n - 1) :].tolist()
        tokens = []
        for _ in range(gamma):
            token = self.table.next_token(history)
            if token is None:
                break
            tokens.append(token)
            history = (history + [token])[-(self.table.n - 1) :]
        return Proposal(tokens=torch.tensor(tokens, dtype=torch.long))
