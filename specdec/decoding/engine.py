"""The decode loop: propose -> score (one target pass) -> verify -> roll back -> record.

Each round the target cache holds the context but its newest token. One target pass over
[newest token, d1..dk] gives p at all k+1 positions; `verify` keeps n drafts and adds one token of
the target's own; both caches roll back to the kept length. With no drafter or gamma = 0 every
round is k = 0: plain autoregressive decoding through the very same code, the baseline every
speedup is measured against.

A generation is written as a coroutine over the target: where it needs a pass it yields a `Pass`
(a sequence and the rows to add) and reads the logits once whoever drives it has run it. A
`Generation` runs its passes one by one; `specdec.decoding.batching` runs the passes of many generations
together, one target pass for all (continuous batching). Either way the decoding logic is this
module's, so a batched generation verifies exactly as a lone one.

>>> # engine = SpeculativeEngine(TransformersBackend(model), PromptLookupDrafter(), eos_token_ids={2})
>>> # run = engine.generate(prompt_ids, SamplingParams(temperature=0), SpecConfig(gamma="auto"))
>>> # for chunk in run: print(chunk)          # token ids as they are accepted
>>> # run.tokens, run.stats.alpha, run.stats.tau
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Iterable, Iterator
from dataclasses import dataclass

import torch

from ..backends import Backend, Step
from ..config import SamplingParams, SpecConfig
from ..drafters.base import Drafter, Proposal
from ..errors import SpecdecError
from ..modeling.tree import ancestor_mask, depths
from .gamma import GammaPolicy, RoundHistory
from .metrics import GenerationStats
from .rejection import TreeVerdict, Verdict, verify, verify_greedy, verify_tree, verify_tree_greedy
from .sampling import adjust, argmax_rows, coupled_draw, new_generator, probs, row_counts


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


@dataclass
class TokenLogprob:
    """The target's log-probability of an emitted token, and its likeliest alternatives."""

    token: int
    logprob: float
    top: list[tuple[int, float]]


def token_logprobs(logits: torch.Tensor, tokens: list[int], top: int) -> list[TokenLogprob]:
    """logits (len(tokens), V): row i is the distribution token i was emitted from."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    values, ids = logp.topk(top, dim=-1) if top else (None, None)
    return [TokenLogprob(t, float(logp[i, t]), [] if not top else list(zip(ids[i].tolist(), values[i].tolist())))
            for i, t in enumerate(tokens)]


@dataclass
class RoundOutcome:
    """What a verification round kept: the accepted drafts (a chain's prefix, a tree's path), the
    verdict, whether a tree walk stopped at a node with children, the seconds of the pass and the
    verification (not the time a batch spent on other generations), and the target's raw logits
    at the kept rows (row i: where the round's i-th emitted token came from)."""

    accepted: torch.Tensor
    verdict: Verdict | TreeVerdict
    rejected: bool | None
    seconds: float
    logits: torch.Tensor


Rounds = Iterator["list[int] | Pass"]
"""A generation's coroutine: yields a Pass when it needs the target, a list of token ids when a
round emits them."""


class Generation:
    """One request in flight. Iterate it for lists of new token ids as rounds finish; afterwards
    `tokens` holds the whole continuation and `stats` the measurements. Closing it early (or just
    dropping it) stops the work."""

    def __init__(self, rounds: Rounds, stats: GenerationStats, logprobs: list[TokenLogprob] | None = None):
        self._rounds = rounds
        self.stats = stats
        self.tokens: list[int] = []
        self.logprobs = logprobs
        """Each token's log-probabilities, when the sampling settings asked for them."""

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
        self.round_history = RoundHistory()
        """What gamma=auto learnt of acceptance and costs in earlier generations (per drafter way and
        sampling regime; the target's cost of positions)."""
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
        self.check_sampling(sampling)
        drafter = self.drafter_for(self.drafter, sampling, spec)
        self._check_free()
        reads = drafter is not None and drafter.reads_features  # only who reads them pays
        self.target.record_features(reads, drafter.feature_layers if reads else ())
        stats = self.new_stats(prompt, drafter, self.target)
        logprobs = [] if sampling.logprobs is not None else None
        return Generation(self._owned(prompt, sampling, spec, drafter, stats, logprobs), stats, logprobs)

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

    def check_sampling(self, sampling: SamplingParams) -> None:
        """Token ids the sampling settings name must be the target's."""
        bad = [token for token, _ in sampling.logit_bias if token >= self.target.vocab_size]
        if bad:
            raise SpecdecError(f"logit_bias names token ids {bad[:5]} but the model's ids are < {self.target.vocab_size}")

    @staticmethod
    def drafter_for(drafter: Drafter | None, sampling: SamplingParams, spec: SpecConfig) -> Drafter | None:
        return drafter.for_sampling(sampling) if drafter is not None and spec.gamma != 0 else None

    @staticmethod
    def new_stats(prompt: torch.Tensor, drafter: Drafter | None, target: Backend) -> GenerationStats:
        stats = GenerationStats(drafter=drafter.name if drafter else "none", path=target.path,
                                draft_vocab_share=drafter.vocab_share if drafter else None)
        stats.prompt_tokens = prompt.numel()
        return stats

    def _check_free(self) -> None:
        if self.target.in_use_by is not None:
            raise SpecdecError(
                "another generation on this model is still running (its KV cache holds that sequence): "
                "finish it, or close() it, before starting the next; for concurrent generations use "
                "specdec.decoding.batching.Batch (or one engine per model copy)")

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
                     sampling: SamplingParams, generator: torch.Generator, output_counts: torch.Tensor | None
                     ) -> Generator[Pass, None, RoundOutcome]:
        """Score context[length - 1] and the k drafts in one pass, verify, keep the accepted prefix."""
        draft = proposal.tokens  # (k,)
        last = context[length - 1 : length]  # a view: the round writes the context only after `length`
        scored = Pass(target, Step(torch.cat([last, draft]) if draft.numel() else last))
        yield scored
        resumed, raw = time.perf_counter(), scored.logits  # (k+1, V)
        k = draft.numel()
        logits = self._adjusted(raw, sampling, output_counts, draft, lambda: torch.ones(k + 1, k, dtype=torch.bool).tril(-1))
        if sampling.greedy:
            verdict = verify_greedy(argmax_rows(logits), draft)
        elif sampling.drafter_invariant:  # the target's own draws at these positions decide
            verdict = verify_greedy(self._coupled_draws(probs(logits, sampling), draft, sampling, length), draft)
        else:
            verdict = verify(probs(logits, sampling), proposal.q, draft, generator)
        target.rollback(length + verdict.accepted)  # keeps the context and the accepted drafts
        n = verdict.accepted
        return RoundOutcome(draft[:n], verdict, None, scored.seconds + time.perf_counter() - resumed, raw[: n + 1])

    def _tree_round(self, target: Backend, proposal: Proposal, context: torch.Tensor, length: int,
                    sampling: SamplingParams, generator: torch.Generator, output_counts: torch.Tensor | None
                    ) -> Generator[Pass, None, RoundOutcome]:
        """Score context[length - 1] and the tree's nodes in one pass, walk it (rejection.py), keep
        the accepted path's cache entries."""
        tokens, parents = proposal.tokens, proposal.parents
        scored = Pass(target, Step(torch.cat([context[length - 1 : length], tokens]), parents))
        yield scored
        resumed, raw = time.perf_counter(), scored.logits  # (n+1, V)
        logits = self._adjusted(raw, sampling, output_counts, tokens, lambda: ancestor_mask(parents)[:, 1:])
        if sampling.greedy:
            argmax = argmax_rows(logits)
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
        rows = torch.tensor([0] + [1 + node for node in verdict.path])
        return RoundOutcome(tokens[verdict.path], verdict, bool((parents == last).any()),
                            scored.seconds + time.perf_counter() - resumed, raw[rows])

    @staticmethod
    def _adjusted(logits: torch.Tensor, sampling: SamplingParams, output_counts: torch.Tensor | None,
                  drafts: torch.Tensor, sees: Callable[[], torch.Tensor]) -> torch.Tensor:
        """The scored rows' logits with the request's bias and penalties, each row counting the
        output so far and the drafts on its own path (`sees()`, built only for penalties: see
        sampling.row_counts)."""
        counts = row_counts(output_counts, drafts, sees()) if output_counts is not None else None
        return adjust(logits, sampling, counts)

    def emitted(self, accepted: torch.Tensor, token: int, spec: SpecConfig) -> tuple[list[int], bool]:
        """The tokens a round adds to the output, and whether the generation ends: the accepted
        drafts and the target's token, cut after the first end-of-sequence token among them (an
        accepted draft may be one: nothing after it may be emitted)."""
        new = accepted.tolist() + [token]
        if spec.stop_at_eos:
            stop = next((i for i, t in enumerate(new) if t in self.eos_token_ids), None)
            if stop is not None:
                return new[: stop + 1], True
        return new, False

    def _owned(
        self, prompt: torch.Tensor, sampling: SamplingParams, spec: SpecConfig, drafter: Drafter | None,
        stats: GenerationStats, logprobs: list[TokenLogprob] | None,
    ) -> Rounds:
        """decode() on the engine's own target, which no other generation may use meanwhile."""
        self._check_free()  # another generation may have started since this one was made
        owner = object()
        self.target.in_use_by = owner
        try:
            yield from self.decode(self.target, prompt, sampling, spec, drafter, stats, logprobs=logprobs)
        finally:
            if self.target.in_use_by is owner:
                self.target.in_use_by = None

    def decode(
        self, target: Backend, prompt: torch.Tensor, sampling: SamplingParams, spec: SpecConfig,
        drafter: Drafter | None, stats: GenerationStats, limits: Limits | None = None,
        prefill_chunk: int | None = None, logprobs: list[TokenLogprob] | None = None,
    ) -> Rounds:
        """The decode loop of one generation on `target` (the engine's backend or a fork of it),
        with `drafter` bound to it; a coroutine (see Rounds). The prompt is prefilled in passes of
        at most `prefill_chunk` tokens (all at once by default). With sampling.logprobs set, each
        emitted token's log-probabilities are appended to `logprobs`."""
        generator = new_generator(sampling.seed)
        output_counts = torch.zeros(target.vocab_size) if sampling.penalised else None
        budget = spec.max_new_tokens
        if target.max_length is not None:
            budget = min(budget, target.max_length - prompt.numel())
        context = torch.empty(prompt.numel() + budget, dtype=torch.long)  # prompt + generated tokens
        context[: prompt.numel()] = prompt
        length = prompt.numel()
        regime = (drafter.name, sampling.temperature, sampling.top_k, sampling.top_p,
                  sampling.drafter_invariant) if drafter is not None else None
        policy = GammaPolicy(spec, prior_c=drafter.cost_prior if drafter is not None else 0.0,
                             fast_rows=target.fast_rows, history=self.round_history, regime=regime)
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
                if drafter is not None:
                    route = drafter.route(context[:length])
                    policy.select(route, drafter.route_cost_prior(route))
                gamma = policy.next(remaining - 1) if drafter is not None else 0
                cap = limits.max_drafts if limits is not None and spec.gamma == "auto" else None
                if cap is not None:
                    gamma = min(gamma, cap)
                t0 = time.perf_counter()
                proposal = drafter.propose(context[:length], gamma, sampling, generator) if gamma else Proposal.empty()
                if proposal.is_tree and not target.supports_trees:
                    proposal = proposal.first_chain()
                trimmed = proposal.is_tree and proposal.scores is not None and spec.gamma == "auto"
                if trimmed:  # the nodes worth their rows at the measured cost of positions
                    value = policy.expected(proposal.scores.tolist(), proposal.depths().tolist(),
                                            proposal.parents.tolist())
                    proposal = proposal.top(policy.tree_nodes(value, time.perf_counter() - t0), by=value)
                if cap is not None:
                    proposal = proposal.top(cap)  # a tree's nodes count against the batch's rows too
                t1 = time.perf_counter()
                verify_round = self._tree_round if proposal.is_tree else self._chain_round
                outcome = yield from verify_round(target, proposal, context, length, sampling, generator, output_counts)
                verdict, scoring = outcome.verdict, outcome.seconds
                t2 = time.perf_counter()
                n = verdict.accepted
                if drafter is not None:
                    drafter.feedback(length + n)
                scoring += time.perf_counter() - t2
                stats.draft_seconds += t1 - t0
                stats.target_seconds += scoring
                depth = int(proposal.depths().max()) if proposal.is_tree else proposal.tokens.numel()
                policy.observe(proposal.tokens.numel(), n, t1 - t0, scoring, depth)
                if trimmed:  # the kept nodes (a trimmed tree may have become a chain)
                    policy.observe_tree(proposal.scores.tolist(), proposal.depths().tolist(), n)

                new, stop = self.emitted(outcome.accepted, verdict.token, spec)
                stats.record_round(proposal.tokens.numel(), n, verdict.beta, emitted=len(new),
                                   rejected=outcome.rejected)
                if output_counts is not None:
                    output_counts.index_add_(0, torch.tensor(new), torch.ones(len(new)))
                if logprobs is not None and sampling.logprobs is not None:
                    logprobs += token_logprobs(outcome.logits[: len(new)], new, sampling.logprobs)
                context[length : length + len(new)] = torch.tensor(new)
                length += len(new)
                stats.new_tokens = length - prompt.numel()
                stats.decode_seconds = time.perf_counter() - start
                yield new
                if stop:
                    stats.finish_reason = "stop"
                    break
        finally:
            policy.commit()
            # Stopped between a pass and its verdict (a batch cancelled it), the cache may hold
            # unverified rows (a tree's, in slot order): keep only the context it had verified.
            if prefilled and target.length > length - 1:
                target.rollback(length - 1)
