"""Vocabulary maps: the draft's token ids -> the target's, one representation for every drafter that
draws from a vocabulary other than the target's own.

A `VocabMap` lists the draft vocabulary S as pairs (source id, target id): the columns of the
drafter's logits it may draw from and the target ids they stand for. The draft distribution q is
the drafter's (warped) softmax over S alone, renormalised there, so q is exactly the law its token
was drawn from; over the target's ids it is q scattered to the target's width, zero outside S.
Rejection sampling (rejection.py) then needs nothing else: a target token outside S has q = 0
there, so it can still be emitted, through the residual norm(max(0, p - q)) or the bonus token.

Two drafters use it:

- trained drafters (eagle, eagle3, medusa, draft-lm): their head has one row per id of S, the
  target ids the target emits most often (EAGLE-3's `d2t`: target id = draft id + d2t[draft id]),
  so `source` is None (column i is S's i-th id);
- a draft model with another tokenizer (drafters/cross_tokenizer.py): S is the **token-level
  intersection** of the two vocabularies (Timor et al. 2025, TLI): the draft model's tokens whose
  bytes are one token of the target's too (`intersect`).

Target ids are kept ascending, so a draw over S's |S| probabilities with a uniform number picks the
same token as a draw over q's full width would (q's zeros change no partial sum), in less time.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import NamedTuple

import torch

from ..config import SamplingParams
from ..decoding.sampling import argmax_rows, draw, probs, sample


@dataclass(frozen=True)
class VocabMap:
    target: torch.Tensor
    """(n,) the target ids of S, distinct (ascending, for draws that match a draw over q: above)."""
    width: int
    """The target's logit width, the width q is verified at."""
    source: torch.Tensor | None = None
    """(n,) the drafter's logit columns of S, or None when its logits are over S already."""

    @property
    def size(self) -> int:
        return self.target.numel()

    def restrict(self, logits: torch.Tensor) -> torch.Tensor:
        """(..., drafter width) logits -> (..., |S|): the columns the drafter may draw from."""
        return logits if self.source is None else logits[..., self.source]

    def full(self, values: torch.Tensor, fill: float) -> torch.Tensor:
        """(n, |S|) values over S -> (n, width) over the target's ids, `fill` outside S."""
        out = values.new_full((values.shape[0], self.width), fill)
        out[:, self.target] = values
        return out

    def draw(self, logits: torch.Tensor, sampling: SamplingParams, generator: torch.Generator,
             position: int) -> tuple[int, int, torch.Tensor | None]:
        """One draft token for sequence index `position` from (1, drafter width) logits: the
        argmax over S at temperature 0, else a draw from q. Returns (target id, the index into S it
        is, q over the target's width or None at temperature 0)."""
        compact = self.restrict(logits)
        if sampling.greedy:
            index = int(argmax_rows(compact)[0])
            return int(self.target[index]), index, None
        q_s = probs(compact, sampling)  # (1, |S|): renormalised over S
        q = self.full(q_s, 0.0)[0]  # (V,)
        if sampling.drafter_invariant:  # the position's noise is over the target's ids
            token = draw(q, sampling, generator, position)
            return token, int((self.target == token).nonzero()[0]), q
        index = sample(q_s[0], generator)
        return int(self.target[index]), index, q


# -- the token-level intersection of two tokenizers ----------------------------------------------

_BYTE_FALLBACK = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


@lru_cache(maxsize=1)
def _byte_level_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet, reversed: the printable character that stands for each byte."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


def _uses(tokenizer, component: str) -> bool:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    return backend is not None and component in str(backend.decoder)


class Spelling(NamedTuple):
    """A tokenizer's ids as text: token_bytes's answer, computed once per tokenizer and shared."""

    pieces: list[bytes]
    """Each id's bytes."""
    control: list[bool]
    """Whether each id is a control token (it stands for no text)."""


def token_bytes(tokenizer) -> Spelling:
    """Every id's text as bytes, and whether the id is a control token (a special token: it stands
    for a role, a turn, the end of text, not for the characters of its name). Byte-level BPE
    (GPT-2, Llama 3, Qwen, SmolLM) maps its alphabet back to bytes; SentencePiece (Gemma, Llama 2,
    Mistral) reads "▁" as a space and <0xHH> as byte HH; other tokenizers decode each token."""
    size = len(tokenizer)
    pieces = tokenizer.convert_ids_to_tokens(list(range(size)))
    added = {i: t for i, t in getattr(tokenizer, "added_tokens_decoder", {}).items()}
    special = set(tokenizer.all_special_ids) | {i for i, t in added.items() if getattr(t, "special", False)}
    byte_level, metaspace = _uses(tokenizer, "ByteLevel"), _uses(tokenizer, "▁")
    alphabet = _byte_level_decoder() if byte_level else {}
    out: list[bytes] = []
    for i, piece in enumerate(pieces):
        if piece is None:
            out.append(b"")
        elif i in added:  # literal text, matched before the model's own tokens
            out.append(added[i].content.encode())
        elif byte_level and all(c in alphabet for c in piece):
            out.append(bytes(alphabet[c] for c in piece))
        elif (m := _BYTE_FALLBACK.match(piece)) is not None:
            out.append(bytes([int(m.group(1), 16)]))
        elif metaspace:
            out.append(piece.replace("▁", " ").encode())
        else:
            out.append(tokenizer.convert_tokens_to_string([piece]).encode())
    return Spelling(out, [i in special for i in range(size)])


def intersect(draft: Spelling, target: Spelling, target_width: int, draft_width: int) -> VocabMap:
    """The draft tokens whose bytes are also one of the target's tokens (control tokens and empty
    ones excluded; ids below each side's logit width), as a VocabMap from the draft model's logit
    columns to the target's ids, verified at `target_width`. Where several ids on one side spell
    the same bytes, the lowest id is the one mapped."""
    by_bytes: dict[bytes, int] = {}
    for i, b in enumerate(target.pieces[:target_width]):
        if b and not target.control[i]:
            by_bytes.setdefault(b, i)
    pairs: dict[int, int] = {}  # target id -> draft id
    for i, b in enumerate(draft.pieces[:draft_width]):
        t = by_bytes.get(b)
        if b and not draft.control[i] and t is not None:
            pairs.setdefault(t, i)
    ids = torch.tensor(sorted(pairs), dtype=torch.long)
    source = torch.tensor([pairs[int(t)] for t in ids], dtype=torch.long)
    return VocabMap(target=ids, width=target_width, source=source)
