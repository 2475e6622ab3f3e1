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
keep it. Whether drafting pays at all with b generations sharing a step is measured, not assumed
(`SpeculationChoice`): where many rows cost nearly what as many steps do (AVX2: 16 rows ~3.7 steps),
plain batching emitted more tokens a second than speculative batching when measured; where they
are nearly free (AMX tiles) the drafts should win.

>>> # batch = Batch(engine, max_batch=8)
>>> # a, b = batch.add(ids_a, SamplingParams(), SpecConfig()), batch.add(ids_b, ...)
>>> # while batch.members: for member, tokens in batch.step(): ...
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from ..backends import Backend
from ..config import SamplingParams, SpecConfig
from ..drafters.base import Drafter
from ..errors import SpecdecError
from .engine import Limits, Pass, Rounds, SpeculativeEngine, TokenLogprob
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


class SpeculationChoice:
    """Whether gamma="auto" generations draft while b of them share a step, chosen by what each way
    has emitted per second at that batch size (`bucket`): a decayed mean of tokens per second of step
    (the pass, the verification and the drafting) for "draft" and for "plain" steps (Batch.step
    measures a step only when it and the step before ran the same way). A way with fewer than
    `settle` steps measured at that size is tried first; after that the faster one runs, and the other
    is tried again for `settle` steps every `probe_every`, so a change (longer contexts, other
    prompts) is seen. The choice only caps how many tokens are drafted, never what is emitted
    (verification keeps the target's law)."""

    WAYS = ("draft", "plain")

    def __init__(self, settle: int = 3, probe_every: int = 32, decay: float = 0.25):
        self.settle, self.probe_every, self.decay = settle, probe_every, decay
        self.rate: dict[tuple[int, str], float] = {}
        self.seen: dict[tuple[int, str], int] = {}

    @staticmethod
    def bucket(running: int) -> int:
        """Batch sizes measured together: 2, 3-4, 5-8, 9-16, ... (a server's batch moves by one as
        requests come and go; each size alone would be measured too rarely to settle)."""
        return (running - 1).bit_length()

    def way(self, running: int) -> str:
        b = self.bucket(running)
        for way in self.WAYS:
            if self.seen.get((b, way), 0) < self.settle:
                return way
        best = max(self.WAYS, key=lambda w: self.rate[b, w])
        other = self.WAYS[1 - self.WAYS.index(best)]
        steps = sum(self.seen[b, w] for w in self.WAYS)
        return other if steps % self.probe_every < self.settle else best

    def observe(self, running: int, way: str, tokens: int, seconds: float) -> None:
        if seconds <= 0:
            return
        b = self.bucket(running)
        key, rate = (b, way), tokens / seconds
        self.rate[key] = rate if key not in self.rate else (1 - self.decay) * self.rate[key] + self.decay * rate
        self.seen[key] = self.seen.get(key, 0) + 1


class Batch:
    def __init__(self, engine: SpeculativeEngine, max_batch: int = 8, row_budget: int = 16, prefill_chunk: int = 128,
                 spec_off_at: int | None = None, measure_choice: bool = True):
        """max_batch: generations at once (1 where the target cannot fork a sequence, or the drafter
        cannot be copied for one). row_budget: rows a step may score before drafts are capped.
        prefill_chunk: the most prompt tokens of one generation in a step. spec_off_at: batch size
        from which generations with gamma="auto" do not speculate at all (None: only the budget).
        measure_choice: with two or more generations, draft or not as measured faster at that batch
        size (SpeculationChoice); False: draft within the budget always."""
        if max_batch < 1 or row_budget < 1 or prefill_chunk < 1:
            raise SpecdecError("max_batch, row_budget and prefill_chunk must be >= 1")
        target = engine.target
        if target.in_use_by is not None:
            raise SpecdecError("the engine's target is running a generation: finish or close it before batching")
        target.in_use_by = self
        self.engine, self.row_budget, self.prefill_chunk, self.spec_off_at = engine, row_budget, prefill_chunk, spec_off_at
        self.choice = SpeculationChoice() if measure_choice else None
        self._clock = time.perf_counter
        self._last_way: str | None = None  # the way the drafts of this step's pass were proposed under
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
        running = len(self.members)
        cap = self.draft_cap(running)
        way = None
        if self.choice is not None and running >= 2 and cap != 0:
            way = self.choice.way(running)
            cap = 0 if way == "plain" else cap
        for member in self.members:
            member.limits.max_drafts = cap
        for member in list(self.members):
            if member.pending is None:  # joined since the last step
                self._advance(member, emitted)
        waiting = [member for member in self.members if member.pending is not None]
        if waiting:
            decoding = all(m.pending.step.wants_logits for m in waiting)  # no prompt chunk in this pass
            start = self._clock()
            results = self.engine.target.forward_many([(m.pending.sequence, m.pending.step) for m in waiting])
            seconds = self._clock() - start
            for member, logits in zip(waiting, results):
                member.pending.logits = logits
                member.pending.seconds = seconds  # each waits for the whole pass: its gamma policy sees the batch's cost
            before = len(emitted)
            for member in waiting:
                self._advance(member, emitted)
            # a step scores the drafts proposed under the last step's way and proposes under its own: it
            # measures a way only when both are that way
            if way is not None and way == self._last_way and decoding and len(waiting) == running:
                tokens = sum(len(tokens) for _, tokens in emitted[before:])
                self.choice.observe(running, way, tokens, self._clock() - start)
        self._last_way = way
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
