"""A draft model with another tokenizer than the target's (Timor et al., ICML 2025: lossless
speculative decoding across heterogeneous vocabularies).

The draft model reads the context as its own tokens: the target's ids are turned into their bytes
(vocab_map.token_bytes) and the text re-tokenised by the draft tokenizer each round; its KV cache
keeps the longest prefix it already holds. It then drafts one of two ways:

- **TLI** (token-level intersection), exact at every temperature: the draft model draws only among
  its tokens whose bytes are also one target token (vocab_map.intersect), its warped softmax
  renormalised over them; q over the target's ids is that law, scattered. Verification is the
  usual rejection sampling in target ids (rejection.py): the emitted token follows p because q is
  exactly the law the draft was drawn from, whatever q is; a target token outside the
  intersection has q = 0 and can still be emitted by the residual or the bonus.
- **SLEM** (string-level exact match), at temperature 0: the draft model drafts freely in its own
  vocabulary, its text is re-tokenised by the target's tokenizer, and those target tokens are
  verified greedily (accepted while they are the target's argmax). Any proposal is exact under
  greedy verification; SLEM's win is that a target token spelled by several draft tokens (Gemma's
  262 k vocabulary against SmolLM2's 49 k) can be proposed at all.

`way="auto"` drafts TLI when sampling and, at temperature 0, whichever way has been accepting more
target tokens per draft-model pass (each tried first, the other re-measured every 16th round).
"""

from __future__ import annotations

import torch

from ..backends import Backend
from ..config import SamplingParams
from ..decoding.sampling import argmax_rows
from .base import Drafter, Proposal
from .vocab_map import Spelling, VocabMap, token_bytes

WAYS = ("auto", "tli", "slem")
RECHECK_EVERY = 16
"""At temperature 0 with way="auto", every so many rounds the way not chosen is tried again."""
FIRST_ROUNDS = 3
"""Rounds each way gets before the measured better one is chosen."""


class ContextText:
    """The target's context as text for another tokenizer: its ids' bytes, appended as the context
    grows (cut back where it was rolled back), decoded once per round."""

    def __init__(self, target_bytes: list[bytes]):
        self.target_bytes = target_bytes
        self.ids: list[int] = []
        self.ends: list[int] = []  # byte offset after each id
        self.data = bytearray()

    def text(self, context: torch.Tensor) -> str:
        ids = context.tolist()
        common = 0
        for mine, theirs in zip(self.ids, ids):
            if mine != theirs:
                break
            common += 1
        del self.ids[common:], self.ends[common:]
        del self.data[self.ends[-1] if self.ends else 0:]
        for token in ids[common:]:
            self.data += self.target_bytes[token] if token < len(self.target_bytes) else b""
            self.ids.append(token)
            self.ends.append(len(self.data))
        return self.data.decode("utf-8", errors="ignore")  # a character cut in two waits for its end


class CrossTokenizerDrafter(Drafter):
    cost_prior = 0.1

    def __init__(self, backend: Backend, draft_tokenizer, target_tokenizer, vocab: VocabMap, label: str,
                 way: str = "auto", spellings: tuple[Spelling, Spelling] | None = None):
        """`spellings`: token_bytes of the draft and the target tokenizer, where the caller has them
        (building `vocab` needed them)."""
        if way not in WAYS:
            raise ValueError(f"way must be one of {WAYS}, got {way!r}")
        self.backend, self.draft_tokenizer, self.target_tokenizer = backend, draft_tokenizer, target_tokenizer
        self.vocab, self.way = vocab, way
        self.name = f"model:{label}" if way == "auto" else f"model-{way}:{label}"
        draft, target = spellings or (token_bytes(draft_tokenizer), token_bytes(target_tokenizer))
        self.draft_bytes = draft.pieces
        self.draft_stops = {i for i, control in enumerate(draft.control) if control}
        self.context_text = ContextText(target.pieces)
        self.record = {"tli": [0, 0, 0], "slem": [0, 0, 0]}
        """Per way at temperature 0: [rounds, draft-model passes, accepted target tokens]; shared by forks."""
        self._round: tuple[str, int, int] | None = None  # (way, context length, passes) of the round in flight
        self._greedy = False

    @property
    def vocab_share(self) -> float:
        """The intersection's share of the target's vocabulary: what TLI can propose."""
        return self.vocab.size / max(1, len(self.target_tokenizer))

    def fork(self) -> CrossTokenizerDrafter:
        twin = super().fork()
        twin.backend = self.backend.fork()
        twin.context_text = ContextText(self.context_text.target_bytes)
        twin._round = None
        return twin

    def _draft_ids(self, context: torch.Tensor) -> torch.Tensor:
        text = self.context_text.text(context)
        ids = self.draft_tokenizer(text, add_special_tokens=True)["input_ids"]
        if not ids:  # text without a character of its own (a control token alone): the draft model's start
            start = self.draft_tokenizer.bos_token_id
            ids = [start if start is not None else 0]
        return torch.tensor(ids, dtype=torch.long)

    def begin(self, prompt: torch.Tensor) -> None:
        self._greedy = False
        self.backend.prefill(self._draft_ids(prompt)[:-1])

    def route(self, context: torch.Tensor):
        return self._choose() if self._greedy else "tli"

    def _choose(self) -> str:
        if self.way != "auto":
            return self.way
        tli, slem = self.record["tli"], self.record["slem"]
        for way, (rounds, _, _) in (("slem", slem), ("tli", tli)):
            if rounds < FIRST_ROUNDS:
                return way
        rate = {way: accepted / max(1, passes) for way, (_, passes, accepted) in self.record.items()}
        best = max(rate, key=lambda way: (rate[way], way == "slem"))
        other = "tli" if best == "slem" else "slem"
        return other if (tli[0] + slem[0]) % RECHECK_EVERY == 0 else best

    def propose(self, context: torch.Tensor, gamma: int, sampling: SamplingParams,
                generator: torch.Generator) -> Proposal:
        self._greedy = sampling.greedy
        ids = self._draft_ids(context)
        held = self.backend.reuse(ids[:-1])
        unseen = ids[held:]
        way = self._choose() if sampling.greedy else "tli"
        if way == "slem":
            proposal, passes = self._slem(unseen, gamma)
        else:
            proposal, passes = self._tli(unseen, gamma, sampling, generator, context.numel()), gamma
        self._round = (way, context.numel(), passes)
        return proposal

    def _tli(self, unseen: torch.Tensor, gamma: int, sampling: SamplingParams, generator: torch.Generator,
             position: int) -> Proposal:
        tokens, dists = [], []
        for i in range(gamma):
            logits = self.backend.forward(unseen)[-1:]  # (1, draft width)
            token, index, q = self.vocab.draw(logits, sampling, generator, position + i)
            tokens.append(token)
            if q is not None:
                dists.append(q)
            unseen = self.vocab.source[index : index + 1]
        return Proposal(tokens=torch.tensor(tokens, dtype=torch.long), q=torch.stack(dists) if dists else None)

    def _slem(self, unseen: torch.Tensor, gamma: int) -> tuple[Proposal, int]:
        """Up to gamma draft-model tokens, greedily; their text as target tokens (at most gamma) and
        the passes it took."""
        drafted, passes = bytearray(), 0
        for _ in range(gamma):
            passes += 1
            token = int(argmax_rows(self.backend.forward(unseen)[-1:])[0])
            if token in self.draft_stops:  # its end of text or turn: the target's comes from the target
                break
            drafted += self.draft_bytes[token] if token < len(self.draft_bytes) else b""
            unseen = torch.tensor([token])
        text = drafted.decode("utf-8", errors="ignore")
        ids = self.target_tokenizer(text, add_special_tokens=False)["input_ids"] if text else []
        unknown = self.target_tokenizer.unk_token_id  # text the target cannot spell ends the proposal
        cut = next((n for n, i in enumerate(ids) if i == unknown or i >= self.vocab.width), len(ids))
        ids = ids[: min(cut, gamma)]
        return Proposal(tokens=torch.tensor(ids, dtype=torch.long)), passes

    def feedback(self, kept: int) -> None:
        if self._round is None:
            return
        way, start, passes = self._round
        self._round = None
        if self._greedy:
            record = self.record[way]
            record[0] += 1
            record[1] += passes
            record[2] += max(0, kept - start)
