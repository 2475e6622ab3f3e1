"""Logit bias, presence and frequency penalties, and log-probabilities under speculation.

A penalty makes the target's distribution at a position depend on the output before it, drafts
included: each scored row must count the drafts on its own path. Checked as plain = speculative
(greedy and seeded, chains and trees, with a negative control that counts no drafts), by the
exact 2-token law under rejection sampling, and logprobs against the target's own table."""

from collections import Counter
from dataclasses import replace

import pytest
import torch

import specdec.decoding.engine
from helpers import TableLM
from specdec.config import SamplingParams, SpecConfig
from specdec.conformance.exactness import goodness_of_fit, sample_continuations
from specdec.decoding.engine import SpeculativeEngine
from specdec.decoding.sampling import adjust, probs, row_counts
from specdec.drafters import ModelDrafter, PromptLookupDrafter, PromptLookupTreeDrafter
from specdec.errors import SpecdecError

VOCAB = 8
PROMPT = [0, 1, 2, 3, 4, 5, 6, 1, 2, 3, 1, 2, 3]
ADJUSTED = dict(frequency_penalty=0.9, presence_penalty=0.5, logit_bias=((5, 1.5), (7, -100.0)))
SAMPLINGS = {"greedy": SamplingParams(temperature=0, **ADJUSTED),
             "seeded": SamplingParams(temperature=1.0, seed=0, drafter_invariant=True, **ADJUSTED)}


def drafter(kind: str):
    return {"model": lambda: ModelDrafter(TableLM(VOCAB, order=1, seed=21, scale=1.2), VOCAB),
            "prompt-lookup": PromptLookupDrafter, "prompt-lookup-tree": PromptLookupTreeDrafter}[kind]()


def parity(kind: str, sampling: SamplingParams, seeds=range(8)) -> list[bool]:
    target = TableLM(VOCAB, seed=20)
    plain, spec = SpeculativeEngine(target, None), SpeculativeEngine(target, drafter(kind))
    same, accepted = [], 0
    for seed in seeds:
        params = replace(sampling, seed=seed) if sampling.seed is not None else sampling
        expected = plain.generate(PROMPT, params, SpecConfig(gamma=0, max_new_tokens=30)).run().tokens
        run = spec.generate(PROMPT, params, SpecConfig(gamma=4, max_new_tokens=30)).run()
        same.append(run.tokens == expected)
        accepted += run.stats.accepted
        assert 7 not in run.tokens  # banned by its bias
    assert accepted > 0  # drafts were accepted, so rows after a draft were judged
    return same


@pytest.mark.parametrize("sampling", list(SAMPLINGS))
@pytest.mark.parametrize("kind", ["model", "prompt-lookup", "prompt-lookup-tree"])
def test_speculative_equals_plain_with_bias_and_penalties(kind, sampling):
    assert all(parity(kind, SAMPLINGS[sampling]))


def test_negative_control_rows_that_ignore_their_drafts_are_caught(monkeypatch):
    monkeypatch.setattr(specdec.decoding.engine, "row_counts", lambda counts, drafts, sees: counts.repeat(sees.shape[0], 1))
    assert not all(parity("prompt-lookup", SAMPLINGS["greedy"]) + parity("model", SAMPLINGS["seeded"]))


def adjusted_law(target: TableLM, prompt: list[int], k: int, sampling: SamplingParams) -> dict:
    """The exact law of the k-token continuation with bias and penalties (enumerated)."""
    law = {(): 1.0}
    for _ in range(k):
        grown = {}
        for prefix, mass in law.items():
            counts = torch.bincount(torch.tensor(prefix, dtype=torch.long), minlength=VOCAB).float()[None]
            logits = adjust(target.table[target.index(prompt + list(prefix))][None], sampling, counts)
            for token, pt in enumerate(probs(logits, sampling)[0].double().tolist()):
                if pt > 0:
                    grown[prefix + (token,)] = mass * pt
        law = grown
    return law


def test_law_with_penalties_under_rejection_sampling_is_the_targets():
    target = TableLM(VOCAB, seed=20)
    sampling = SamplingParams(temperature=1.0, **ADJUSTED)
    spec = SpeculativeEngine(target, drafter("model"))
    counts = sample_continuations(spec, PROMPT, 2, sampling, gamma=3, n=4000, seed=10_000)
    test = goodness_of_fit("2-token law, penalised", counts, adjusted_law(target, PROMPT, 2, sampling))
    assert test.p_value > 1e-4, test
    unpenalised = adjusted_law(target, PROMPT, 2, SamplingParams(temperature=1.0))
    assert goodness_of_fit("against the unpenalised law", counts, unpenalised).p_value < 1e-6  # the test has power


def test_row_counts_follow_each_rows_path():
    sees = torch.tensor([[False, False, False], [True, False, False], [True, False, True]])  # a tree
    counts = row_counts(torch.tensor([1.0, 0, 0, 0]), torch.tensor([2, 3, 2]), sees)
    assert counts.tolist() == [[1, 0, 0, 0], [1, 0, 1, 0], [1, 0, 2, 0]]


@pytest.mark.parametrize("kind", ["prompt-lookup", "prompt-lookup-tree", "model"])
def test_logprobs_are_the_targets_whatever_the_drafter(kind):
    target = TableLM(VOCAB, seed=20)
    sampling = SamplingParams(temperature=1.0, seed=3, drafter_invariant=True, logprobs=3)
    run = SpeculativeEngine(target, drafter(kind)).generate(PROMPT, sampling, SpecConfig(gamma=4, max_new_tokens=20))
    run.run()
    assert run.stats.accepted > 0 and len(run.logprobs) == len(run.tokens)
    context = list(PROMPT)
    for token, entry in zip(run.tokens, run.logprobs):
        expected = torch.log_softmax(target.table[target.index(context)], dim=-1)
        assert entry.token == token and entry.logprob == pytest.approx(float(expected[token]), abs=1e-5)
        assert [t for t, _ in entry.top] == expected.topk(3).indices.tolist()
        context.append(token)
    quiet = SpeculativeEngine(target, None).generate(PROMPT, SamplingParams(), SpecConfig(max_new_tokens=4)).run()
    assert quiet.logprobs is None


def test_bad_adjustments_are_clear_errors():
    with pytest.raises(SpecdecError, match="presence_penalty"):
        SamplingParams(presence_penalty=3.0)
    with pytest.raises(SpecdecError, match="logit_bias"):
        SamplingParams(logit_bias=((1, 500.0),))
    with pytest.raises(SpecdecError, match="logprobs"):
        SamplingParams(logprobs=21)
    engine = SpeculativeEngine(TableLM(VOCAB, seed=20), None)
    with pytest.raises(SpecdecError, match="token ids"):
        engine.generate(PROMPT, SamplingParams(logit_bias=((VOCAB, 1.0),)))


def test_counts_of_repeated_tokens_in_one_round():
    """A round that emits the same token twice counts it twice for the next round."""
    target = TableLM(VOCAB, seed=20)
    sampling = SamplingParams(temperature=0, frequency_penalty=2.0)
    tokens = SpeculativeEngine(target, drafter("prompt-lookup")).generate(
        PROMPT, sampling, SpecConfig(gamma=6, max_new_tokens=40)).run().tokens
    plain = SpeculativeEngine(target, None).generate(PROMPT, sampling, SpecConfig(gamma=0, max_new_tokens=40)).run()
    assert tokens == plain.tokens
    assert max(Counter(tokens).values()) <= 40  # sanity: the run finished
