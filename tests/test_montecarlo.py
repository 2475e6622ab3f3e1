"""Monte Carlo on real (tiny) transformer models: speculative samples of a 3-token continuation
follow the target's exact law, on the transformers backend and on the lean backend, for a draft
model, an n-gram table and prompt lookup; the same test catches a verifier that accepts every draft
(negative control). The statistical power lives in the fake-model mutant suite (test_conformance);
these check the real forward passes, caches and rollbacks."""

import pytest

import specdec.decoding.engine
from helpers import tiny_llama
from specdec.backends import LeanBackend, TransformersBackend
from specdec.config import SamplingParams
from specdec.conformance.exactness import exact_continuation_law, goodness_of_fit, sample_continuations
from specdec.decoding.engine import SpeculativeEngine
from specdec.decoding.rejection import Verdict
from specdec.drafters import ModelDrafter, NGramDrafter, NGramTable, PromptLookupDrafter

VOCAB, K, N = 5, 3, 2000
PROMPT = [0, 1, 2, 3, 4, 1]


@pytest.fixture(scope="module")
def models():
    return tiny_llama(VOCAB, layers=2, seed=10, init=0.15), tiny_llama(VOCAB, layers=1, seed=11, init=0.15)


def drafters(target, draft):
    table = NGramTable.fit([[0, 1, 2, 3, 4, 0, 2, 4, 1, 3]], n=2)
    return {"model": ModelDrafter(TransformersBackend(draft), VOCAB), "ngram": NGramDrafter(table),
            "prompt-lookup": PromptLookupDrafter()}


CASES = [
    ("model", SamplingParams(temperature=1.0), TransformersBackend),
    ("model", SamplingParams(temperature=0.8, top_k=4, top_p=0.9), LeanBackend),
    ("ngram", SamplingParams(temperature=1.0), LeanBackend),
    ("prompt-lookup", SamplingParams(temperature=0.7, top_p=0.9), LeanBackend),
]


@pytest.mark.parametrize("kind,sampling,backend", CASES)
def test_speculative_law_equals_target_law(models, kind, sampling, backend):
    target, draft = models
    law = exact_continuation_law(target, PROMPT, K, sampling)
    engine = SpeculativeEngine(backend(target), drafters(target, draft)[kind])
    stats = []
    counts = sample_continuations(engine, PROMPT, K, sampling, gamma=2, n=N, seed=1000, stats_sink=stats)
    test = goodness_of_fit("3-token law", counts, law)
    assert test.p_value > 1e-4, test
    # the verifier really decided: drafts were proposed, and some kept and some rejected
    drafted, accepted = sum(s.drafted for s in stats), sum(s.accepted for s in stats)
    assert drafted >= N and 0 < accepted < drafted, (drafted, accepted)


def accept_always(p, q, draft, generator):
    """A broken verifier: keeps every draft token and adds a bonus from p."""
    from specdec.decoding.sampling import sample

    return Verdict(accepted=draft.shape[0], token=sample(p[draft.shape[0]], generator))


def test_negative_control_accept_always_is_caught(models, monkeypatch):
    target, draft = models
    sampling = SamplingParams(temperature=1.0)
    law = exact_continuation_law(target, PROMPT, K, sampling)
    monkeypatch.setattr(specdec.decoding.engine, "verify", accept_always)
    engine = SpeculativeEngine(TransformersBackend(target), drafters(target, draft)["model"])
    counts = sample_continuations(engine, PROMPT, K, sampling, gamma=2, n=N, seed=1000)
    test = goodness_of_fit("3-token law", counts, law)
    assert test.p_value < 1e-4, test
