"""The decode loop: propose -> score (one target pass) -> verify -> roll back -> record.

Each round the target cache holds the context but its newest token. One target pass over
[newest token, d1..dk] gives p at all k+1 positions; `verify` keeps n drafts and adds one token of
the target's own; both caches roll back to the kept length. With no drafter or gamma = 0 every
round is k = 0: plain autoregressive decoding through the very same code, the baseline every
speedup is measured against.

A generation is written as a coroutine over the target: where it needs a pass it yields a `Pass`
(a sequence and the rows to add) and reads the logits once whoever drives it has run it. A
`Generation` runs its passes one by one; `specdec.batching` runs the passes of many generations
together, one target pass for all (continuous batching). Either way the decoding logic is this
module's, so a batched generation verifies exactly as a lone one.

>>> # engine = SpeculativeEngine(TransformersBackend(model), PromptLookupDrafter(), eos_token_ids={2})
>>> # run = engine.generate(prompt_ids, SamplingParams(temperature=0), SpecConfig(gamma="auto"))
>>> # for chunk in run: print(chunk)          # token ids as they are accepted
>>> # run.tokens, run.stats.alpha, run.stats.tau
"""

from __future__ import annotations

import time
from collections.abc import Generator, Iterable, Iterator
from dataclasses import dataclass

import torch

from .backends import Backend, Step
from .config import SamplingParams, SpecConfig
from .drafters.base import Drafter, Proposal
from .errors import SpecdecError
from .gamma import GammaPolicy
from .metrics import GenerationStats
from .modeling.tree import depths
from .rejection import TreeVerdict, Verdict, verify, verify_greedy, verify_tree, verify_tree_greedy
from .sampling import coupled_draw, new_generator, probs


@dataclass
class Pass:
    """A target pass a generation waits for: `step` added to `sequence`. Whoever drives the
    generation runs it and fills in `logits` and `seconds` (how long the pass took)."""

    sequence: Backend
    step: Step
    logits: torch.Tensor | None = None
    seconds: float = 0.0

    def run(self) -> None:
        """Run it alone."""
        start = time.perf_counter()
        self.logits = self.sequence.forward_many([(self.sequence, self.step)])[0]
        self.seconds = time.perf_counter() - start


@dataclass
class Limits:
    """What a driver may change between rounds: the most draft tokens (a chain's drafts, a tree's
    nodes) a round of a gamma="auto" generation may propose (None: the gamma policy and the drafter
    decide alone). A batch lowers it as it fills."""

    max_drafts: int | None = None


Rounds = Iterator["list[int] | Pass"]
"""A generation's coroutine: yields a Pass when it needs the target, a list of token ids when a
round emits them."""


class Generation:
    """One request in flight. Iterate it for lists of new token ids as rounds finish; afterwards
    `tokens` holds the whole continuation and `stats` the measurements. Closing it early (or just
    dropping it) stops the work."""

    def __init__(self, rounds: Rounds, stats: GenerationStats):
        self._rounds = rounds
        self.stats = stats
        self.tokens: list[int] = []

    def __iter__(self) -> Iterator[list[int]]:
        for item in self._rounds:
            if isinstance(item, Pass):
                item.run()
                continue
            self.tokens.extend(item)
            yield item

    def run(self) -> Generation:
        """Run to the end without streaming."""
        for _ in self:
            pass
        return self

    def close(self) -> None:
        self._rounds.close()


class SpeculativeEngine:
    def __init__(self, target: Backend, drafter: Drafter | None = None, eos_token_ids: Iterable[int] = ()):
        self.target = target
        self.drafter = drafter
        self.eos_token_ids = set(eos_token_ids)
        if drafter is not None:
            drafter.bind(target)

    def generate(
        self,
        prompt_ids: list[int] | torch.Tensor,
        sampling: SamplingParams = SamplingParams(),
        spec: SpecConfig = SpecConfig(),
    ) -> Generation:
        """Start generating after `prompt_ids`. Input is checked here, before any model work."""
        prompt = self.check_prompt(prompt_ids)
        drafter = self.drafter_for(self.drafter, sampling, spec)
        self._check_free()
        self.target.record_hidden = drafter is not None and drafter.reads_features  # only who reads them pays
        stats = self.new_stats(prompt, drafter, self.target)
        return Generation(self._owned(prompt, sampling, spec, drafter, stats), stats)

    def check_prompt(self, prompt_ids: list[int] | torch.Tensor) -> torch.Tensor:
        """The prompt as a (P,) tensor, or a SpecdecError that says what is wrong with it."""
        prompt = torch.as_tensor(prompt_ids, dtype=torch.long).flatten()
        if prompt.numel() == 0:
            raise SpecdecError("the prompt is empty: give at least one token of text")
        limit = self.target.max_length
        if limit is not None and prompt.numel() >= limit:
            raise SpecdecError(
                f"the prompt has {prompt.numel()} tokens but the model's context holds {limit}: "
                "shorten the prompt to leave room for the answer"
            )
        if int(prompt.max()) >= self.target.vocab_size or int(prompt.min()) < 0:
            raise SpecdecError(f"prompt token ids must be in [0, {self.target.vocab_size})")
        return prompt

    @staticmethod
    def drafter_for(drafter: Drafter | None, sampling: SamplingParams, spec: SpecConfig) -> Drafter | None:
        return drafter.for_sampling(sampling) if drafter is not None and spec.gamma != 0 else None

    @staticmethod
    def new_stats(prompt: torch.Tensor, drafter: Drafter | None, target: Backend) -> GenerationStats:
        stats = GenerationStats(drafter=drafter.name if drafter else "none", path=target.path)
        stats.prompt_tokens = prompt.numel()
        return stats

    def _check_free(self) -> None:
        if self.target.in_use_by is not None:
            raise SpecdecError(
                "another generation on this model is still running (its KV cache holds that sequence): "
                "finish it, or close() it, before starting the next; for concurrent generations use "
                "specdec.batching.Batch (or one engine per model copy)")

    @staticmethod
    def _coupled_draws(p: torch.Tensor, draft: torch.Tensor, sampling: SamplingParams, length: int) -> torch.Tensor:
        """The target's drafter-invariant draws for rows 0.. of p (row i draws sequence index
        length + i), up to the first that differs from the draft: all verify_greedy reads."""
        draws = []
        for i in range(p.shape[0]):
            draws.append(coupled_draw(p[i], sampling.seed, length + i))
            if i == draft.numel() or draws[-1] != int(draft[i]):
                break
        draws += [-1] * (p.shape[0] - len(draws))  # never read: verify_greedy stops at the first mismatch
        return torch.tensor(draws)

    def _chain_round(self, target: Backend, proposal: Proposal, context: torch.Tensor, length: int,
                     sampling: SamplingParams, generator: torch.Generator
                     ) -> Generator[Pass, None, tuple[torch.Tensor, Verdict, float]]:
        """Score context[length - 1] and the k drafts in one pass, verify, keep the accepted prefix.
        Returns (draft, verdict, seconds): the seconds of the pass and
        of the verification, not the time it waited while a batch ran other generations."""
        draft = proposal.tokens  # (k,)
        scored = Pass(target, Step(torch.cat([context[length - 1 : length], draft])))
        yield scored
        resumed, logits = time.perf_counter(), scored.logits  # (k+1, V)
        if sampling.greedy:
            verdict = verify_greedy(logits.argmax(dim=-1), draft)
        elif sampling.drafter_invariant:  # the target's own draws at these positions decide
            verdict = verify_greedy(self._coupled_draws(probs(logits, sampling), draft, sampling, length), draft)
        else:
            verdict = verify(probs(logits, sampling), proposal.q, draft, generator)
        target.rollback(length + verdict.accepted)  # keeps the context and the accepted drafts
        return draft, verdict, scored.seconds + time.perf_counter() - resumed

    def _tree_round(self, target: Backend, proposal: Proposal, context: torch.Tensor, length: int,
                    sampling: SamplingParams, generator: torch.Generator
                    ) -> Generator[Pass, None, tuple[torch.Tensor, TreeVerdict, bool, float]]:
        """Score context[length - 1] and the tree's nodes in one pass, walk it (rejection.py), keep
        the accepted path's cache entries. Returns the path's tokens, the verdict, whether the
        walk stopped at a node with children, and the seconds (as _chain_round's)."""
        tokens, parents = proposal.tokens, proposal.parents
        scored = Pass(target, Step(torch.cat([context[length - 1 : length], tokens]), parents))
        yield scored
        resumed, logits = time.perf_counter(), scored.logits  # (n+1, V)
        if sampling.greedy:
            argmax = logits.argmax(dim=-1)
            verdict = verify_tree_greedy(lambda row: int(argmax[row]), tokens, parents)
        elif sampling.drafter_invariant:  # the target's own draw at each visited row's position decides
            p = probs(logits, sampling)
            row_depth = [0] + depths(parents).tolist()
            verdict = verify_tree_greedy(lambda row: coupled_draw(p[row], sampling.seed, length + row_depth[row]),
                                         tokens, parents)
        else:
            verdict = verify_tree(probs(logits, sampling), proposal.q, tokens, parents, generator)
        target.keep_path(length - 1, verdict.path)
        last = verdict.path[-1] if verdict.path else -1
        return tokens[verdict.path], verdict, bool((parents == last).any()), scored.seconds + time.perf_counter() - resumed

    def emitted(self, draft: torch.Tensor, accepted: int, token: int, spec: SpecConfig) -> tuple[list[int], bool]:
        """The tokens a round adds to the output, and whether the generation ends: the accepted
        drafts and the target's token, cut after the first end-of-sequence token among them (an
        accepted draft may be one: nothing after it may be emitted)."""
        new = draft[:accepted].tolist() + [token]
        if spec.stop_at_eos:
            stop = next((i for i, t in enumerate(new) if t in self.eos_token_ids), None)
            if stop is not None:
                return new[: stop + 1], True
        return new, False

    def _owned(
        self, prompt: torch.Tensor, sampling: SamplingParams, spec: SpecConfig, drafter: Drafter | None,
        stats: GenerationStats,
    ) -> Rounds:
        """decode() on the engine's own target, which no other generation may use meanwhile."""
        self._check_free()  # another generation may have started since this one was made
        owner = object()
        self.target.in_use_by = owner
        try:
            yield from self.decode(self.target, prompt, sampling, spec, drafter, stats)
        finally:
            if self.target.in_use_by is owner:
                self.target.in_use_by = None

    def decode(
        self, target: Backend, prompt: torch.Tensor, sampling: SamplingParams, spec: SpecConfig,
        drafter: Drafter | None, stats: GenerationStats, limits: Limits | None = None,
        prefill_chunk: int | None = None,
    ) -> Rounds:
        """The decode loop of one generation on `target` (the engine's backend or a fork of it),
        with `drafter` bound to it; a coroutine (see Rounds). The prompt is prefilled in passes of
        at most `prefill_chunk` tokens (all at once by default)."""
        generator = new_generator(sampling.seed)
        budget = spec.max_new_tokens
        if target.max_length is not None:
            budget = min(budget, target.max_length - prompt.numel())
        context = torch.empty(prompt.numel() + budget, dtype=torch.long)  # prompt + generated tokens
        context[: prompt.numel()] = prompt
        length = prompt.numel()
        policy = GammaPolicy(spec, prior_c=drafter.cost_prior if drafter is not None else 0.0,
                             fast_rows=target.fast_rows)
        prefilled = False
        try:
            start = time.perf_counter()
            held = target.reuse(prompt[:-1])  # what the cache already holds of this prompt
            chunk = prefill_chunk or prompt.numel()
            for at in range(held, prompt.numel() - 1, chunk):
                yield Pass(target, Step(prompt[at : min(at + chunk, prompt.numel() - 1)], wants_logits=False))
            prefilled = True
            if drafter is not None:
                drafter.begin(prompt)
            stats.prefill_seconds = time.perf_counter() - start
            start = time.perf_counter()
            stats.finish_reason = "length"
            while length < prompt.numel() + budget:
                remaining = prompt.numel() + budget - length
                gamma = policy.next(remaining - 1) if drafter is not None else 0
                cap = limits.max_drafts if limits is not None and spec.gamma == "auto" else None
                if cap is not None:
                    gamma = min(gamma, cap)
                t0 = time.perf_counter()
                proposal = drafter.propose(context[:length], gamma, sampling, generator) if gamma else Proposal.empty()
                if proposal.is_tree and not target.supports_trees:
                    proposal = proposal.first_chain()
                if cap is not None:
                    proposal = proposal.head(cap)  # a tree's nodes count against the batch's rows too
                t1 = time.perf_counter()
                if proposal.is_tree:
                    draft, verdict, rejected, scoring = yield from self._tree_round(target, proposal, context, length,
                                                                                    sampling, generator)
                else:
                    draft, verdict, scoring = yield from self._chain_round(target, proposal, context, length, sampling,
                                                                           generator)
                    rejected = None
                t2 = time.perf_counter()
                n = verdict.accepted
                if drafter is not None:
                    drafter.feedback(length + n)
                scoring += time.perf_counter() - t2
                stats.draft_seconds += t1 - t0
                stats.target_seconds += scoring
                policy.observe(proposal.tokens.numel(), n, t1 - t0, scoring)

                new, stop = self.emitted(draft, n, verdict.token, spec)
                stats.record_round(proposal.tokens.numel(), n, verdict.beta, emitted=len(new),
                                   rejected=rejected)
                context[length : length + len(new)] = torch.tensor(new)
                length += len(new)
                stats.new_tokens = length - prompt.numel()
                stats.decode_seconds = time.perf_counter() - start
                yield new
                if stop:
                    stats.finish_reason = "stop"
                    break
        finally:
            # Stopped between a pass and its verdict (a batch cancelled it), the cache may hold
            # unverified rows (a tree's, in slot order): keep only the context it had verified.
            if prefilled and target.length > length - 1:
                target.rollback(length - 1)
