"""Greedy parity with plain decoding, rollback = recomputation, EOS and max_new_tokens handling."""

import pytest
import torch

from helpers import tiny_gemma3, tiny_llama, tiny_llama_family
from specdec.backends import TransformersBackend
from specdec.config import SamplingParams, SpecConfig
from specdec.decoding.engine import SpeculativeEngine
from specdec.drafters import ModelDrafter, NGramDrafter, NGramTable, PromptLookupDrafter
from specdec.errors import SpecdecError

VOCAB = 40
PROMPT = [1, 2, 3, 4, 5, 6, 7, 1, 2, 3, 9, 9, 4, 5, 6, 1, 2]  # repeats, so prompt lookup has matches
ARCHITECTURES = [lambda: tiny_llama(VOCAB, seed=0), lambda: tiny_gemma3(VOCAB, seed=0, sliding_window=8),
                 lambda: tiny_llama_family("mistral", VOCAB, seed=0, sliding_window=8),
                 lambda: tiny_llama_family("qwen2", VOCAB, seed=0, sliding_window=8),
                 lambda: tiny_llama_family("qwen3", VOCAB, seed=0)]
ARCHITECTURE_NAMES = ["llama", "gemma3", "mistral", "qwen2", "qwen3"]


@pytest.fixture(scope="module")
def target():
    return tiny_llama(VOCAB, layers=2, seed=0)


@pytest.fixture(scope="module")
def draft_model():
    return tiny_llama(VOCAB, layers=1, seed=1)


def plain_tokens(model, prompt, n, sampling=SamplingParams()):
    engine = SpeculativeEngine(TransformersBackend(model))
    return engine.generate(prompt, sampling, SpecConfig(gamma=0, max_new_tokens=n)).run().tokens


def make_drafter(kind, target, draft_model):
    if kind == "prompt-lookup":
        return PromptLookupDrafter()
    if kind == "ngram":
        # fitted on the target's own greedy outputs, as `specdec ngram fit --from-target` does
        seqs = [PROMPT + plain_tokens(target, PROMPT[i:], 30) for i in range(4)]
        return NGramDrafter(NGramTable.fit(seqs, n=2))
    return ModelDrafter(TransformersBackend(draft_model), VOCAB)


@pytest.mark.parametrize("kind", ["prompt-lookup", "ngram", "model"])
@pytest.mark.parametrize("gamma", [1, 4, 8, "auto"])
def test_greedy_parity_fp32(target, draft_model, kind, gamma):
    expected = plain_tokens(target, PROMPT, 40)
    engine = SpeculativeEngine(TransformersBackend(target), make_drafter(kind, target, draft_model))
    run = engine.generate(PROMPT, SamplingParams(temperature=0), SpecConfig(gamma=gamma, max_new_tokens=40)).run()
    assert run.tokens == expected
    # the drafter really took part, and every kept draft saved a target call: a verifier that rejected every
    # draft would give the same tokens, in as many calls as plain decoding (auto may stop drafting after a
    # few rejections: on these random models that is right)
    assert run.stats.drafted > 0, run.stats
    assert run.stats.target_calls == len(expected) - run.stats.accepted, run.stats
    assert run.stats.accepted > 0 or gamma == "auto", run.stats


def test_greedy_parity_gemma3_sliding_window_rollback():
    """Gemma-3's sliding-window layers keep their past so that rollback below the window is exact."""
    model = tiny_gemma3(VOCAB, seed=0, sliding_window=8)
    draft = tiny_gemma3(VOCAB, seed=1, sliding_window=8)
    expected = plain_tokens(model, PROMPT, 40)
    engine = SpeculativeEngine(TransformersBackend(model), ModelDrafter(TransformersBackend(draft), VOCAB))
    run = engine.generate(PROMPT, SamplingParams(temperature=0), SpecConfig(gamma=4, max_new_tokens=40)).run()
    assert run.tokens == expected
    assert run.stats.rejections > 0


@pytest.mark.parametrize("make", ARCHITECTURES, ids=ARCHITECTURE_NAMES)
def test_rollback_equals_recompute(make):
    model = make()
    ids = torch.randint(0, VOCAB, (30,), generator=torch.Generator().manual_seed(0))
    backend = TransformersBackend(model)
    backend.forward(ids[:20])
    backend.rollback(20)
    backend.forward(ids[20:26])  # a draft of six tokens ...
    backend.rollback(22)  # ... of which two are kept
    after_rollback = backend.forward(ids[22:25])
    fresh = TransformersBackend(model)
    recomputed = fresh.forward(ids[:25])[22:25]
    assert backend.length == fresh.length == 25
    assert torch.allclose(after_rollback, recomputed, atol=1e-5)


def test_cache_after_generation_equals_recompute(target, draft_model):
    """After rounds with rejections, the target's cache is exactly the cache of the kept prefix."""
    backend = TransformersBackend(target)
    engine = SpeculativeEngine(backend, ModelDrafter(TransformersBackend(draft_model), VOCAB))
    run = engine.generate(PROMPT, SamplingParams(temperature=1.0, seed=3), SpecConfig(gamma=4, max_new_tokens=30)).run()
    assert run.stats.rejections > 0
    context = torch.tensor(PROMPT + run.tokens)
    fresh = TransformersBackend(target)
    fresh.forward(context[:-1])
    assert backend.length == fresh.length
    for mine, theirs in zip(backend.cache.layers, fresh.cache.layers):
        assert torch.allclose(mine.keys, theirs.keys, atol=1e-5)
        assert torch.allclose(mine.values, theirs.values, atol=1e-5)


class ScriptedDrafter(PromptLookupDrafter):
    """Proposes a fixed continuation, to steer EOS into the middle of a draft."""

    def __init__(self, tokens):
        super().__init__()
        self.tokens = tokens

    def propose(self, context, gamma, sampling, generator):
        from specdec.drafters import Proposal

        done = len(context) - len(PROMPT)
        return Proposal(tokens=torch.tensor(self.tokens[done : done + gamma], dtype=torch.long))


def test_eos_inside_draft_stops_exactly(target):
    expected = plain_tokens(target, PROMPT, 12)
    eos = expected[5]
    engine = SpeculativeEngine(TransformersBackend(target), ScriptedDrafter(expected), eos_token_ids={eos})
    run = engine.generate(PROMPT, SamplingParams(temperature=0), SpecConfig(gamma=8, max_new_tokens=12)).run()
    first = expected.index(eos)
    assert run.tokens == expected[: first + 1]
    assert run.stats.finish_reason == "stop"


@pytest.mark.parametrize("n", [1, 2, 5, 9])
def test_max_new_tokens_reached_mid_round(target, n):
    expected = plain_tokens(target, PROMPT, 12)
    engine = SpeculativeEngine(TransformersBackend(target), ScriptedDrafter(expected))
    run = engine.generate(PROMPT, SamplingParams(temperature=0), SpecConfig(gamma=8, max_new_tokens=n)).run()
    assert run.tokens == expected[:n]
    assert run.stats.finish_reason == "length"
    assert run.stats.new_tokens == n


def test_stats_are_consistent(target):
    expected = plain_tokens(target, PROMPT, 20)
    engine = SpeculativeEngine(TransformersBackend(target), ScriptedDrafter(expected[:10] + [0] * 20))
    run = engine.generate(PROMPT, SamplingParams(temperature=0), SpecConfig(gamma=4, max_new_tokens=20)).run()
    s = run.stats
    assert s.new_tokens == 20
    assert s.new_tokens == s.accepted + s.target_calls  # each call adds its accepted drafts plus one token
    assert s.tau == pytest.approx(20 / s.target_calls)
    assert s.position_tested[0] == s.rounds_with_draft
    assert 0 <= s.alpha <= 1


def test_prompt_errors(target):
    engine = SpeculativeEngine(TransformersBackend(target))
    with pytest.raises(SpecdecError, match="empty"):
        engine.generate([])
    with pytest.raises(SpecdecError, match="context"):
        engine.generate(list(range(10)) * 30)
    with pytest.raises(SpecdecError, match="token ids"):
        engine.generate([VOCAB + 5])


def test_cancel_stops_work(target):
    engine = SpeculativeEngine(TransformersBackend(target))
    run = engine.generate(PROMPT, SamplingParams(), SpecConfig(gamma=0, max_new_tokens=50))
    chunks = iter(run)
    next(chunks)
    run.close()
    assert run.stats.new_tokens == 1


@pytest.mark.parametrize("make", ARCHITECTURES, ids=ARCHITECTURE_NAMES)
def test_prefill_reuses_prefix_exactly(make):
    model = make()
    ids = torch.randint(0, VOCAB, (30,), generator=torch.Generator().manual_seed(1))
    backend = TransformersBackend(model)
    backend.forward(ids[:25])
    other = ids.clone()
    other[12:] = (other[12:] + 1) % VOCAB  # shares the first 12 tokens
    backend.prefill(other[:20])
    assert backend.held == other[:20].tolist()
    fresh = TransformersBackend(model)
    fresh.forward(other[:20])
    assert torch.allclose(backend.forward(other[20:24]), fresh.forward(other[20:24]), atol=1e-5)


def test_same_prompt_twice_gives_same_greedy_output(target, draft_model):
    engine = SpeculativeEngine(TransformersBackend(target), ModelDrafter(TransformersBackend(draft_model), VOCAB))
    first = engine.generate(PROMPT, SamplingParams(temperature=0), SpecConfig(gamma=3, max_new_tokens=25)).run().tokens
    second = engine.generate(PROMPT, SamplingParams(temperature=0), SpecConfig(gamma=3, max_new_tokens=25)).run().tokens
    assert first == second == plain_tokens(target, PROMPT, 25)


def test_by_temperature_drafter_routes_each_generation(target, draft_model):
    """auto's router: greedy generations draft with one drafter, sampled ones with the other, the
    stats name the one that ran, and greedy output stays the target's."""
    from specdec.drafters import ByTemperature

    class Counting(ModelDrafter):
        def propose(self, *args, **kwargs):
            self.calls = getattr(self, "calls", 0) + 1
            return super().propose(*args, **kwargs)

    class CountingLookup(PromptLookupDrafter):
        def propose(self, *args, **kwargs):
            self.calls = getattr(self, "calls", 0) + 1
            return super().propose(*args, **kwargs)

    greedy, sampled = CountingLookup(), Counting(TransformersBackend(draft_model), VOCAB)
    engine = SpeculativeEngine(TransformersBackend(target), ByTemperature(greedy, sampled))
    run = engine.generate(PROMPT, SamplingParams(), SpecConfig(gamma=3, max_new_tokens=20)).run()
    assert run.tokens == plain_tokens(target, PROMPT, 20)
    assert run.stats.drafter == greedy.name and greedy.calls > 0 and not hasattr(sampled, "calls")
    run = engine.generate(PROMPT, SamplingParams(temperature=1.0, seed=0), SpecConfig(gamma=3, max_new_tokens=20)).run()
    assert run.stats.drafter == sampled.name and sampled.calls > 0


# -- defects found by the conformance audit ----------------------------------------------------------


def test_a_second_live_generation_on_one_model_is_refused():
    """Two generations streamed alternately would share one KV cache: both outputs wrong. The
    second is refused while the first is live, and allowed once it is closed or finished."""
    from helpers import TableLM

    backend = TableLM(8, seed=1)
    engine = SpeculativeEngine(backend, PromptLookupDrafter())
    other = SpeculativeEngine(backend, None)  # another engine on the same model shares its cache too
    first = engine.generate([1, 2, 3, 1, 2], SamplingParams(), SpecConfig(gamma=2, max_new_tokens=20))
    next(iter(first))
    with pytest.raises(SpecdecError, match="still running"):
        other.generate([4, 5, 6], SamplingParams(), SpecConfig(max_new_tokens=5))
    first.close()
    assert other.generate([4, 5, 6], SamplingParams(), SpecConfig(max_new_tokens=5)).run().tokens
    made_early = engine.generate([1, 2, 3], SamplingParams(), SpecConfig(max_new_tokens=5))
    running = other.generate([4, 5, 6], SamplingParams(), SpecConfig(max_new_tokens=5))
    next(iter(running))
    with pytest.raises(SpecdecError, match="still running"):
        next(iter(made_early))  # made before the other started, refused when it starts


def test_auto_gamma_stays_on_the_fast_path():
    """gamma = auto scores at most fast_rows positions a pass (17 rows fell off the 16-row kernels)."""
    from helpers import TableLM

    backend = TableLM(8, seed=2, fast_rows=5)
    prompt = [1, 2, 3, 4, 5, 6, 7, 1, 2, 3, 4, 5, 6, 7, 1, 2, 3, 4, 5, 6, 7] * 3
    engine = SpeculativeEngine(backend, PromptLookupDrafter())
    engine.generate(prompt, SamplingParams(), SpecConfig(gamma="auto", max_new_tokens=60)).run()
    decode_calls = backend.calls[1:]  # the first is the prefill
    assert max(decode_calls) == 5, decode_calls


def test_draft_model_with_a_narrower_vocabulary_is_refused():
    from helpers import TableLM

    with pytest.raises(SpecdecError, match="knows 6 token ids but the target can emit 8"):
        ModelDrafter(TableLM(6), 8)
