"""Drafter-invariant sampling (tokens drawn by noise keyed by (seed, position), shared with the
drafter): speculative output equals plain sampling with the same seed token for token, for every
drafter and gamma; the law of the output is the target's (with a negative control); acceptance
keeps the (1 - TV)/(1 + TV) bound."""

from collections import Counter
from dataclasses import replace

import pytest
import torch

import specdec.decoding.engine
from helpers import TableLM
from specdec.config import SamplingParams, SpecConfig
from specdec.conformance.exactness import goodness_of_fit, sample_continuations
from specdec.decoding.engine import SpeculativeEngine
from specdec.decoding.sampling import coupled_draw, probs
from specdec.drafters import ModelDrafter, NGramDrafter, NGramTable, PromptLookupDrafter, PromptLookupTreeDrafter
from specdec.errors import SpecdecError

VOCAB = 8
PROMPT = [0, 1, 2, 3, 4, 5, 6, 1, 2, 3]
SAMPLINGS = [SamplingParams(temperature=1.0, seed=0, drafter_invariant=True),
             SamplingParams(temperature=0.7, top_p=0.9, seed=0, drafter_invariant=True)]


def drafter(kind: str):
    if kind == "model":
        return ModelDrafter(TableLM(VOCAB, order=1, seed=21, scale=1.2), VOCAB)
    if kind == "prompt-lookup":
        return PromptLookupDrafter()
    if kind == "prompt-lookup-tree":
        return PromptLookupTreeDrafter()
    return NGramDrafter(NGramTable.fit([[0, 1, 2, 3, 4, 5, 6, 0, 2, 4, 6, 1, 3, 5, 0]], n=2))


@pytest.mark.parametrize("kind", ["model", "prompt-lookup", "prompt-lookup-tree", "ngram"])
@pytest.mark.parametrize("gamma", [1, 3, "auto"])
@pytest.mark.parametrize("sampling", SAMPLINGS, ids=["T1", "T0.7-top-p0.9"])
def test_speculative_output_equals_plain_output_with_the_same_seed(kind, gamma, sampling):
    target = TableLM(VOCAB, seed=20)
    plain = SpeculativeEngine(target, None)
    spec = SpeculativeEngine(target, drafter(kind))
    accepted = trees = 0
    for seed in range(12):
        params = replace(sampling, seed=seed)
        expected = plain.generate(PROMPT, params, SpecConfig(gamma=0, max_new_tokens=40)).run().tokens
        run = spec.generate(PROMPT, params, SpecConfig(gamma=gamma, max_new_tokens=40)).run()
        assert run.tokens == expected, (seed, run.tokens, expected)
        accepted += run.stats.accepted
        trees += run.stats.tree_rounds
    if kind == "model":
        assert accepted > 0  # the verifier did accept drafts
    if kind == "prompt-lookup-tree" and gamma != 1:
        assert trees > 0  # the tree path (a draw at each visited row's depth) was exercised


def chain_law(target: TableLM, prompt: list[int], k: int, sampling: SamplingParams) -> dict:
    """The exact law of the target's k-token continuation (enumerated: V^k outcomes)."""
    law = {(): 1.0}
    for _ in range(k):
        grown = {}
        for prefix, mass in law.items():
            p = probs(target.table[target.index(prompt + list(prefix))][None], sampling)[0].double()
            for token, pt in enumerate(p.tolist()):
                if pt > 0:
                    grown[prefix + (token,)] = mass * pt
        law = grown
    return law


@pytest.mark.parametrize("sampling", SAMPLINGS, ids=["T1", "T0.7-top-p0.9"])
def test_law_of_the_output_is_the_targets(sampling):
    target = TableLM(VOCAB, seed=20)
    spec = SpeculativeEngine(target, drafter("model"))
    counts = sample_continuations(spec, PROMPT, 2, sampling, gamma=3, n=4000, seed=10_000)
    test = goodness_of_fit("2-token law", counts, chain_law(target, PROMPT, 2, sampling))
    assert test.p_value > 1e-4, test


def test_negative_control_a_biased_race_is_caught(monkeypatch):
    """argmax p + E (noise added, not divided) is not a draw from p: the same test sees it."""
    def biased(dist, seed, position):
        from specdec.decoding.sampling import position_noise

        return int(torch.argmax(dist.double() + position_noise(seed, position, dist.shape[-1])))

    monkeypatch.setattr(specdec.decoding.engine, "coupled_draw", biased)
    sampling = SAMPLINGS[0]
    target = TableLM(VOCAB, seed=20)
    counts = sample_continuations(SpeculativeEngine(target, drafter("model")), PROMPT, 2, sampling, gamma=3, n=4000,
                                  seed=10_000)
    assert goodness_of_fit("2-token law", counts, chain_law(target, PROMPT, 2, sampling)).p_value < 1e-4


def test_acceptance_keeps_the_coupling_bound():
    """P(the two races pick the same token) >= (1 - TV) / (1 + TV) (Daliri et al. 2024)."""
    g = torch.Generator().manual_seed(3)
    for _ in range(3):
        p = torch.softmax(torch.randn(VOCAB, generator=g) * 2, -1).double()
        q = torch.softmax(torch.randn(VOCAB, generator=g) * 2, -1).double()
        tv = 0.5 * float((p - q).abs().sum())
        n = 4000
        same = sum(coupled_draw(p, 7, i) == coupled_draw(q, 7, i) for i in range(n)) / n
        assert same >= (1 - tv) / (1 + tv) - 3 * (0.25 / n) ** 0.5, (same, tv)


def test_a_seed_is_required():
    with pytest.raises(SpecdecError, match="needs a seed"):
        SamplingParams(temperature=1.0, drafter_invariant=True)
    with pytest.raises(SpecdecError, match="seed must be in"):
        SamplingParams(temperature=1.0, seed=2**64)


def test_coupled_draw_follows_the_distribution():
    p = torch.tensor([0.5, 0.3, 0.2, 0.0], dtype=torch.float64)
    counts = Counter(coupled_draw(p, 11, i) for i in range(6000))
    law = {(i,): float(v) for i, v in enumerate(p) if v > 0}
    assert goodness_of_fit("one draw", Counter({(k,): c for k, c in counts.items()}), law).p_value > 1e-4
    assert counts[3] == 0


def test_specdec_verify_checks_drafter_invariant_sampling(monkeypatch):
    from specdec.conformance.check import Settings, run_conformance

    target = TableLM(VOCAB, seed=20)

    def report():
        plain, spec = SpeculativeEngine(target, None), SpeculativeEngine(target, drafter("model"))
        return run_conformance("table", torch.float32, plain, spec, target, [PROMPT], SAMPLINGS[0], 3,
                               Settings.quick(), seed=1)

    good = report()
    assert good.passed and [c.name for c in good.checks] == ["distribution", "greedy parity", "seeded parity",
                                                             "acceptance"], good.to_text()

    def biased(dist, seed, position):
        from specdec.decoding.sampling import position_noise

        return int(torch.argmax(dist.double() + position_noise(seed, position, dist.shape[-1])))

    monkeypatch.setattr(specdec.decoding.engine, "coupled_draw", biased)  # the target's draws only: plain and spec split
    bad = report()
    assert not bad.passed
