"""Continuous batching: many generations on one target, one target pass per step for all.

At batch size one a target step is bound by reading the weights; the rows of other requests ride
along almost free. A `Batch` keeps up to `max_batch` sequences of the engine's target (the target
and its forks: each its own KV cache on the same weights), each with its own drafter (a fork of
the engine's, bound to that sequence), and runs the engine's own decode coroutine for every
generation (`SpeculativeEngine.decode`): a step gathers the pass each generation waits for (a
chain or a tree of drafts, or a chunk of a prompt being prefilled), runs them as one
`forward_many`, and resumes each generation to verify, emit and propose its next round.
Acceptance is ragged (each generation keeps what its own verification accepts), generations join
and leave between steps, and long prompts are prefilled in chunks so they do not stall the others.

Every generation verifies with its own generator or its own drafter-invariant noise, so each one's
law is exactly the target's, whatever runs beside it. How many drafts to propose is the gamma
policy's and the drafter's choice, capped as the batch fills: a pass of b generations with k
drafts (chain drafts or tree nodes) each scores b(k + 1) rows, and beyond `row_budget` rows a pass
costs about what the rows cost one by one (`draft_cap`); requests that asked for a fixed gamma
keep it.

>>> # batch = Batch(engine, max_batch=8)
>>> # a, b = batch.add(ids_a, SamplingParams(), SpecConfig()), batch.add(ids_b, ...)
>>> # while batch.members: for member, tokens in batch.step(): ...
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from .backends import Backend
from .config import SamplingParams, SpecConfig
from .drafters.base import Drafter
from .engine import Limits, Pass, Rounds, SpeculativeEngine, TokenLogprob
from .errors import SpecdecError
from .metrics import GenerationStats


@dataclass(eq=False)
class Slot:
    """A sequence of the target, with the drafter that drafts for it; `member` while in use."""

    sequence: Backend
    drafter: Drafter | None
    member: Member | None = None


@dataclass(eq=False)
class Member:
    """One generation in a batch: `tokens` grows as steps emit them; `done` when it has ended."""

    slot: Slot
    rounds: Rounds
    stats: GenerationStats
    limits: Limits
    tokens: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] | None = None
    """Each token's log-probabilities, when the sampling settings asked for them."""
    pending: Pass | None = None
    done: bool = False


class Batch:
    def __init__(self, engine: SpeculativeEngine, max_batch: int = 8, row_budget: int = 16, prefill_chunk: int = 128,
                 spec_off_at: int | None = None):
        """max_batch: generations at once (1 where the target cannot fork a sequence, or the drafter
        cannot be copied for one). row_budget: rows a step may score before drafts are capped.
        prefill_chunk: the most prompt tokens of one generation in a step. spec_off_at: batch size
        from which generations with gamma="auto" do not speculate at all (None: only the budget)."""
        if max_batch < 1 or row_budget < 1 or prefill_chunk < 1:
            raise SpecdecError("max_batch, row_budget and prefill_chunk must be >= 1")
        target = engine.target
        if target.in_use_by is not None:
            raise SpecdecError("the engine's target is running a generation: finish or close it before batching")
        target.in_use_by = self
        self.engine, self.row_budget, self.prefill_chunk, self.spec_off_at = engine, row_budget, prefill_chunk, spec_off_at
        self.max_batch = max_batch if target.can_fork and self._drafter_forks(engine.drafter) else 1
        self.slots = [Slot(target, engine.drafter)]
        self.members: list[Member] = []

    @staticmethod
    def _drafter_forks(drafter: Drafter | None) -> bool:
        try:
            return drafter is None or drafter.fork() is not None
        except NotImplementedError:
            return False

    def close(self) -> None:
        """Stop every generation and hand the target back to the engine."""
        for member in list(self.members):
            self.cancel(member)
        if self.engine.target.in_use_by is self:
            self.engine.target.in_use_by = None

    @property
    def full(self) -> bool:
        return len(self.members) >= self.max_batch

    def add(self, prompt_ids: list[int] | torch.Tensor, sampling: SamplingParams = SamplingParams(),
            spec: SpecConfig = SpecConfig()) -> Member:
        """Start a generation (it runs from the next step on). Input is checked here; a full batch
        is an error (check `full`)."""
        prompt = self.engine.check_prompt(prompt_ids)
        self.engine.check_sampling(sampling)
        if self.full:
            raise SpecdecError(f"the batch is full ({self.max_batch} generations): wait for one to finish")
        slot = self._slot_for(prompt)
        drafter = self.engine.drafter_for(slot.drafter, sampling, spec)
        reads = drafter is not None and drafter.reads_features
        slot.sequence.record_features(reads, drafter.feature_layers if reads else ())
        stats = self.engine.new_stats(prompt, drafter, slot.sequence)
        limits = Limits()
        logprobs = [] if sampling.logprobs is not None else None
        rounds = self.engine.decode(slot.sequence, prompt, sampling, spec, drafter, stats, limits, self.prefill_chunk,
                                    logprobs)
        slot.member = Member(slot, rounds, stats, limits, logprobs=logprobs)
        self.members.append(slot.member)
        return slot.member

    def _slot_for(self, prompt: torch.Tensor) -> Slot:
        """A free sequence, the one that already holds the longest prefix of the prompt (a chat's
        earlier turns); a new fork only when none is free."""
        free = [slot for slot in self.slots if slot.member is None]
        if free:
            return max(free, key=lambda slot: slot.sequence.common_prefix(prompt[:-1]))
        sequence = self.engine.target.fork()
        drafter = None
        if self.engine.drafter is not None:
            drafter = self.engine.drafter.fork()
            drafter.bind(sequence)
        self.slots.append(Slot(sequence, drafter))
        return self.slots[-1]

    def draft_cap(self, running: int) -> int | None:
        """The most draft tokens a gamma="auto" generation may propose when `running` share a step."""
        if self.spec_off_at is not None and running >= self.spec_off_at:
            return 0
        if running < 2:
            return None
        return max(0, self.row_budget // running - 1)

    def cancel(self, member: Member) -> None:
        """Stop a generation now (its client left); its sequence keeps only what it had verified."""
        if member in self.members:
            member.rounds.close()
            self._release(member)

    def _release(self, member: Member) -> None:
        member.done = True
        member.pending = None
        member.slot.member = None
        self.members.remove(member)

    def step(self) -> list[tuple[Member, list[int]]]:
        """One target pass for every generation waiting on one; then each verifies, emits and
        proposes its next round. Returns the tokens emitted, by generation; generations that ended
        have `done` set and have left `members`."""
        emitted: list[tuple[Member, list[int]]] = []
        cap = self.draft_cap(len(self.members))
        for member in self.members:
            member.limits.max_drafts = cap
        for member in list(self.members):
            if member.pending is None:  # joined since the last step
                self._advance(member, emitted)
        waiting = [member for member in self.members if member.pending is not None]
        if waiting:
            start = time.perf_counter()
            results = self.engine.target.forward_many([(m.pending.sequence, m.pending.step) for m in waiting])
            seconds = time.perf_counter() - start
            for member, logits in zip(waiting, results):
                member.pending.logits = logits
                member.pending.seconds = seconds  # each waits for the whole pass: its gamma policy sees the batch's cost
            for member in waiting:
                self._advance(member, emitted)
        return emitted

    def _advance(self, member: Member, emitted: list[tuple[Member, list[int]]]) -> None:
        """Resume a generation until it waits on its next pass, or ends."""
        member.pending = None
        for item in member.rounds:
            if isinstance(item, Pass):
                member.pending = item
                return
            member.tokens.extend(item)
            emitted.append((member, item))
        self._release(member)
