"""An n-gram table: "a lookup table that takes the previous token and returns whatever most often
followed it" (the paper's bigram drafter, alpha ~ 0.2 at c ~ 0). Not a neural network in any sense.

The table maps the last n-1 tokens to the token that most often followed them in a corpus, with
back-off to shorter contexts; drafting chains lookups. Its proposals are point masses (q one-hot),
so verification accepts a guess x with probability p(x).

Worked example, n=2, fitted on ids [5, 6, 5, 6, 5, 7]: after 5 came 6 twice and 7 once, after 6
came 5 twice, so from context [..., 5] with gamma=3 the drafter proposes [6, 5, 6].

`ngram-tree` drafts a token tree from the same table: each node's `branch` most frequent successors
(point masses), scored by the product of the shares of their path (how often each step followed its
context), the likeliest nodes kept (and trimmed to what pays by gamma=auto, gamma.py).

Files are NumPy .npz archives: for each order, the contexts, their `top_k` most frequent successors
(-1 where a context had fewer) and the share of the context's occurrences each took, plus a JSON
header naming the tokenizer the ids belong to. Version 1 files (one successor, no shares) still load.
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
    """The most frequent successors of every context of lengths 1..n-1 (up to top_k each, most
    frequent first, with the share of the context's occurrences each took)."""

    def __init__(self, n: int, successors: dict[int, dict[tuple[int, ...], list[tuple[int, float]]]],
                 tokenizer_id: str = "", source: str = "", top_k: int = 1):
        self.n = n
        self.successors = successors  # context length -> {context tuple: [(next token, share), ...]}
        self.tokenizer_id = tokenizer_id
        self.source = source
        self.top_k = top_k

    @classmethod
    def fit(cls, sequences: Iterable[Iterable[int]], n: int = 2, tokenizer_id: str = "", source: str = "",
            top_k: int = 4) -> NGramTable:
        """Count successors of every context of length 1..n-1 in the given token id sequences."""
        if n < 2:
            raise SpecdecError(f"an n-gram drafter needs n >= 2, got {n}")
        if top_k < 1:
            raise SpecdecError(f"an n-gram table keeps top_k >= 1 successors, got {top_k}")
        counts: dict[int, dict[tuple[int, ...], Counter]] = {m: defaultdict(Counter) for m in range(1, n)}
        for seq in sequences:
            ids = list(seq)
            for i in range(1, len(ids)):
                for m in range(1, min(n - 1, i) + 1):
                    counts[m][tuple(ids[i - m : i])][ids[i]] += 1
        successors = {m: {ctx: [(token, k / c.total()) for token, k in c.most_common(top_k)] for ctx, c in table.items()}
                      for m, table in counts.items()}
        return cls(n, successors, tokenizer_id, source, top_k)

    def followers(self, context: list[int]) -> list[tuple[int, float]]:
        """The successors of the longest known suffix of context, most frequent first, with their
        shares; [] when no suffix is known."""
        for m in range(min(self.n - 1, len(context)), 0, -1):
            found = self.successors[m].get(tuple(context[-m:]))
            if found:
                return found
        return []

    def next_token(self, context: list[int]) -> int | None:
        """The most frequent successor of the longest known suffix of context, or None."""
        found = self.followers(context)
        return found[0][0] if found else None

    def save(self, path: str | Path) -> None:
        arrays = {}
        for m, table in self.successors.items():
            arrays[f"context_{m}"] = np.array(list(table.keys()), dtype=np.int64).reshape(len(table), m)
            following = np.full((len(table), self.top_k), -1, dtype=np.int64)
            shares = np.zeros((len(table), self.top_k), dtype=np.float32)
            for row, found in enumerate(table.values()):
                for j, (token, share) in enumerate(found):
                    following[row, j], shares[row, j] = token, share
            arrays[f"next_{m}"], arrays[f"share_{m}"] = following, shares
        header = {"format": "specdec-ngram", "version": 2, "n": self.n, "top_k": self.top_k,
                  "tokenizer": self.tokenizer_id, "source": self.source}
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
        n, successors = int(header["n"]), {}
        for m in range(1, n):
            contexts = map(tuple, data[f"context_{m}"].tolist())
            if header.get("version", 1) == 1:  # one successor a context, its share unknown
                successors[m] = {ctx: [(token, 1.0)] for ctx, token in zip(contexts, data[f"next_{m}"].tolist())}
            else:
                successors[m] = {ctx: [(t, s) for t, s in zip(tokens, shares) if t >= 0]
                                 for ctx, tokens, shares in zip(contexts, data[f"next_{m}"].tolist(),
                                                                data[f"share_{m}"].tolist())}
        return cls(n, successors, header.get("tokenizer", ""), header.get("source", ""), int(header.get("top_k", 1)))


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


class NGramTreeDrafter(NGramDrafter):
    """The table's top successors as a token tree: level by level, the `beam` likeliest nodes of the
    last level (by the product of the shares along their path) get their `branch` most frequent
    successors as children, up to gamma levels and max_nodes nodes. Children are point masses, distinct
    by construction (a context's successors are distinct tokens), so verification is exact at any
    temperature (specdec.decoding.rejection, token trees).

    Worked example, table fitted on [5, 6, 5, 6, 5, 7, 6, 5] (after 5: 6 twice, 7 once; after 6: 5
    three times; after 7: 6), branch=2, beam=1, gamma=2, context [..., 5]: the root's children 6 (2/3)
    and 7 (1/3); 6 is expanded into 5 (1): tokens [6, 7, 5], parents [-1, -1, 0], scores [2/3, 1/3, 2/3]."""

    def __init__(self, table: NGramTable, branch: int = 3, beam: int = 2, max_nodes: int = 10):
        super().__init__(table)
        if min(branch, beam, max_nodes) < 1:
            raise ValueError(f"branch, beam and max_nodes must be >= 1, got {branch}, {beam}, {max_nodes}")
        self.name = f"{self.name}-tree"
        self.branch, self.beam, self.max_nodes = branch, beam, max_nodes

    def propose(
        self, context: torch.Tensor, gamma: int, sampling: SamplingParams, generator: torch.Generator
    ) -> Proposal:
        history = context[-(self.table.n - 1) :].tolist()
        tokens: list[int] = []
        parents: list[int] = []
        scores: list[float] = []
        paths = {-1: history}
        frontier = [-1]
        for _ in range(gamma):
            offers = []  # (path score, parent, token), grouped by parent in frontier order
            for node in frontier:
                base = 1.0 if node < 0 else scores[node]
                for token, share in self.table.followers(paths[node])[: self.branch]:
                    offers.append((base * share, node, token))
            room = self.max_nodes - len(tokens)
            chosen = sorted(offers, key=lambda o: -o[0])[:room]
            chosen.sort(key=lambda o: (frontier.index(o[1]), -o[0]))  # by parent, likeliest first
            if not chosen:
                break
            level = []
            for score, parent, token in chosen:
                tokens.append(token)
                parents.append(parent)
                scores.append(score)
                paths[len(tokens) - 1] = (paths[parent] + [token])[-(self.table.n - 1) :]
                level.append(len(tokens) - 1)
            if len(tokens) >= self.max_nodes:
                break
            frontier = sorted(level, key=lambda node: -scores[node])[: self.beam]
        if not tokens:
            return Proposal.empty()
        return Proposal.tree(torch.tensor(tokens, dtype=torch.long), torch.tensor(parents, dtype=torch.long),
                             scores=torch.tensor(scores))
