"""Monte Carlo: speculative samples of a 3-token continuation follow the target's exact law, and the
same check catches a verifier that accepts every draft (negative control)."""

import pytest

import specdec.engine
from specdec.backends import TransformersBackend
from specdec.config import SamplingParams
from specdec.drafters import ModelDrafter, NGramDrafter, NGramTable
from specdec.engine import SpeculativeEngine
from specdec.exactness import exact_continuation_law, one_sample_check, sample_continuations, tv_distance, empirical
from specdec.verify import Verdict

from conftest import tiny_llama

VOCAB, K, N = 5, 3, 2000
PROMPT = [0, 1, 2, 3, 4, 1]


@pytest.fixture(scope="module")
def models():
    return tiny_llama(VOCAB, layers=2, seed=10, init=0.15), tiny_llama(VOCAB, layers=1, seed=11, init=0.15)


def drafters(target, draft):
    table = NGramTable.fit([[0, 1, 2, 3, 4, 0, 2, 4, 1, 3]], n=2)
    return {"model": ModelDrafter(TransformersBackend(draft), VOCAB), "ngram": NGramDrafter(table)}


CASES = [
    ("model", SamplingParams(temperature=1.0)),
    ("model", SamplingParams(temperature=0.8, top_k=4, top_p=0.9)),
    ("ngram", SamplingParams(temperature=1.0)),
]


@pytest.mark.parametrize("kind,sampling", CASES)
def test_speculative_law_equals_target_law(models, kind, sampling):
    target, draft = models
    law = exact_continuation_law(target, PROMPT, K, sampling)
    engine = SpeculativeEngine(TransformersBackend(target), drafters(target, draft)[kind])
    counts = sample_continuations(engine, PROMPT, K, sampling, gamma=2, n=N, seed=1000)
    check = one_sample_check("3-token law", counts, law, delta=1e-4)
    assert check.passed, check


def accept_always(p, q, draft, generator):
    """A broken verifier: keeps every draft token and adds a bonus from p."""
    from specdec.sampling import sample

    return Verdict(accepted=draft.shape[0], token=sample(p[draft.shape[0]], generator))


def test_negative_control_accept_always_is_caught(models, monkeypatch):
    target, draft = models
    sampling = SamplingParams(temperature=1.0)
    law = exact_continuation_law(target, PROMPT, K, sampling)
    monkeypatch.setattr(specdec.engine, "verify", accept_always)
    engine = SpeculativeEngine(TransformersBackend(target), drafters(target, draft)["model"])
    counts = sample_continuations(engine, PROMPT, K, sampling, gamma=2, n=N, seed=1000)
    check = one_sample_check("3-token law", counts, law, delta=1e-4)
    # The control has power: its true distance is well beyond what the check detects.
    broken_law = empirical(counts)
    assert tv_distance(broken_law, law) > check.detectable_tv or not check.passed
    assert not check.passed, check
