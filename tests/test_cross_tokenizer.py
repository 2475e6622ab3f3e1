"""Drafting across tokenizers (drafters/cross_tokenizer.py, vocab_map.py): the token-level
intersection keeps rejection sampling exact at every temperature (the emitted law, analytically and
by Monte Carlo, each with a negative control that must fail), greedy drafting either way keeps plain
decoding's output, and the vocabularies' bytes are read right for both built-in tokenizers."""

from collections import Counter

import pytest
import torch

import specdec.drafters.cross_tokenizer as cross
from helpers import char_tokenizer, tiny_llama
from specdec.backends import LeanBackend, TransformersBackend
from specdec.config import SamplingParams, SpecConfig
from specdec.conformance.exactness import exact_continuation_law, goodness_of_fit, sample_continuations
from specdec.decoding.engine import SpeculativeEngine
from specdec.decoding.rejection import accept_prefix, acceptance_probability, residual, verify
from specdec.decoding.sampling import probs
from specdec.drafters import CrossTokenizerDrafter
from specdec.drafters.vocab_map import VocabMap, intersect, token_bytes

TARGET_CHARS, DRAFT_CHARS = list("abcde "), list("xcd eyz")  # shared: c, d, e and the space


# -- the law of one position, on pure tensors ------------------------------------------------------

def partial_map(target_width: int = 12, draft_width: int = 10, shared: int = 6, seed: int = 0) -> VocabMap:
    """A draft vocabulary of which `shared` ids spell one target token each (the rest none)."""
    g = torch.Generator().manual_seed(seed)
    target = torch.randperm(target_width, generator=g)[:shared].sort().values
    source = torch.randperm(draft_width, generator=g)[:shared]
    return VocabMap(target=target, width=target_width, source=source)


def emitted_law(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """The exact law of the token one round with one draft emits (the draft x ~ q): accepted with
    min(1, p/q), else the residual."""
    law = torch.zeros_like(p[0])
    for x in torch.nonzero(q[0]).flatten().tolist():
        a = float(acceptance_probability(p[:1], q, torch.tensor([x]))[0])
        law[x] += q[0, x] * a
        law += q[0, x] * (1 - a) * residual(p[0], q[0])
    return law


@pytest.mark.parametrize("sampling", [SamplingParams(temperature=1.0), SamplingParams(temperature=0.7, top_p=0.9)])
def test_tli_emits_the_target_law_and_tokens_outside_the_intersection(sampling):
    vocab = partial_map()
    g = torch.Generator().manual_seed(1)
    draft_logits, target_logits = torch.randn(1, 10, generator=g) * 2, torch.randn(2, 12, generator=g) * 2
    p = probs(target_logits, sampling)
    q = vocab.full(probs(vocab.restrict(draft_logits), sampling), 0.0)
    assert torch.allclose(q.sum(), torch.tensor(1.0)) and int((q > 0).sum()) <= vocab.size
    law = emitted_law(p, q)
    torch.testing.assert_close(law, p[0], atol=1e-6, rtol=0)
    outside = torch.ones(12, dtype=torch.bool)
    outside[vocab.target] = False
    assert float(law[outside].sum()) > 0.05  # the target's tokens the draft cannot spell are still emitted
    # negative control: q read off the draft's softmax over its whole vocabulary (not renormalised
    # over the intersection it drew from) is not the law of the draft, and the emitted law moves
    wrong = vocab.full(probs(draft_logits, sampling)[:, vocab.source], 0.0)
    assert float((emitted_law(p, wrong) - p[0]).abs().sum()) > 0.01


def test_tli_monte_carlo_with_a_negative_control():
    """verify() fed VocabMap.draw's tokens and q: the emitted token's counts fit p; the same with the
    unrenormalised q must not."""
    vocab, sampling = partial_map(seed=3), SamplingParams(temperature=1.0)
    g = torch.Generator().manual_seed(4)
    draft_logits, target_logits = torch.randn(1, 10, generator=g) * 2, torch.randn(2, 12, generator=g) * 2
    p = probs(target_logits, sampling)
    law = {(i,): float(v) for i, v in enumerate(p[0].tolist())}
    wrong_q = vocab.full(probs(draft_logits, sampling)[:, vocab.source], 0.0)
    right, wrong = Counter(), Counter()
    generator = torch.Generator().manual_seed(5)
    for _ in range(8000):
        token, _, q = vocab.draw(draft_logits, sampling, generator, position=0)
        verdict = verify(p, q[None], torch.tensor([token]), generator)
        right[(token if verdict.accepted else verdict.token,)] += 1
        n, dist = accept_prefix(p, wrong_q, torch.tensor([token]), torch.rand(1, generator=generator))
        wrong[(token if n else int(torch.multinomial(dist, 1, generator=generator)),)] += 1
    assert goodness_of_fit("TLI", right, law).p_value > 1e-4
    assert goodness_of_fit("TLI, q not renormalised", wrong, law).p_value < 1e-6


def test_a_vocabulary_map_draws_like_a_draw_over_q():
    """With the target ids ascending, VocabMap.draw picks, from one generator state, the token a
    draw over q's full width would (the trained drafters rely on it too)."""
    from specdec.decoding.sampling import sample

    vocab, sampling = partial_map(target_width=300, draft_width=200, shared=90), SamplingParams(temperature=0.8)
    logits = torch.randn(1, 200, generator=torch.Generator().manual_seed(2))
    for seed in range(200):
        token, index, q = vocab.draw(logits, sampling, torch.Generator().manual_seed(seed), position=0)
        assert token == sample(q, torch.Generator().manual_seed(seed)) == int(vocab.target[index])


# -- the intersection of real tokenizers ---------------------------------------------------------

def test_intersection_of_character_tokenizers():
    target, draft = char_tokenizer(TARGET_CHARS), char_tokenizer(DRAFT_CHARS)
    vocab = intersect(token_bytes(draft), token_bytes(target), len(target), len(draft))
    pairs = {target.convert_ids_to_tokens(int(t)): draft.convert_ids_to_tokens(int(s))
             for t, s in zip(vocab.target, vocab.source)}
    assert pairs == {"c": "c", "d": "d", "e": "e", " ": " "}  # <eos> is a control token on both sides


@pytest.fixture(scope="module")
def builtin_tokenizers():
    from transformers import AutoTokenizer

    from specdec.models import BUILTIN_MODELS, converted_dir

    return {name: AutoTokenizer.from_pretrained(str(converted_dir(BUILTIN_MODELS[name])), local_files_only=True)
            for name in ("smollm2-135m", "gemma3-270m")}


def test_token_bytes_spell_the_text_for_byte_level_and_sentencepiece(builtin_tokenizers):
    text = "Grüße aus Köln — 東京 🚀\n\tdef f(x):\n        return x ** 2  # ok\n\n\n  trailing  "
    for name, tokenizer in builtin_tokenizers.items():
        spelled, control = token_bytes(tokenizer)
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        assert b"".join(spelled[i] for i in ids) == text.encode(), name
        assert control[tokenizer.eos_token_id], name
    smol, gemma = builtin_tokenizers["smollm2-135m"], builtin_tokenizers["gemma3-270m"]
    vocab = intersect(token_bytes(smol), token_bytes(gemma), len(gemma), len(smol))
    assert 0.9 * len(smol) < vocab.size < len(smol)  # nearly all of SmolLM2's tokens are Gemma tokens too
    g_bytes, _ = token_bytes(gemma)
    s_bytes, _ = token_bytes(smol)
    assert all(g_bytes[int(t)] == s_bytes[int(s)] for t, s in zip(vocab.target[::97], vocab.source[::97]))


# -- the engine: exact at T > 0, output kept at T = 0 --------------------------------------------

@pytest.fixture(scope="module")
def tiny_pair():
    target_tok, draft_tok = char_tokenizer(TARGET_CHARS), char_tokenizer(DRAFT_CHARS)
    target = tiny_llama(vocab_size=len(target_tok), layers=2, seed=20, init=0.15)
    draft = tiny_llama(vocab_size=len(draft_tok), layers=1, seed=21, init=0.15)
    return target, target_tok, draft, draft_tok


def cross_drafter(tiny_pair, way: str = "auto") -> CrossTokenizerDrafter:
    target, target_tok, draft, draft_tok = tiny_pair
    vocab = intersect(token_bytes(draft_tok), token_bytes(target_tok), len(target_tok), len(draft_tok))
    return CrossTokenizerDrafter(TransformersBackend(draft), draft_tok, target_tok, vocab, "tiny", way=way)


PROMPT = [0, 2, 5, 3, 4, 2]  # "ace de c" in the target's ids: text the draft model reads in its own


@pytest.mark.parametrize("sampling", [SamplingParams(temperature=1.0), SamplingParams(temperature=0.7, top_p=0.9)])
def test_speculative_law_equals_target_law_across_tokenizers(tiny_pair, sampling):
    target = tiny_pair[0]
    law = exact_continuation_law(target, PROMPT, 3, sampling)
    stats = []
    engine = SpeculativeEngine(LeanBackend(target), cross_drafter(tiny_pair))
    counts = sample_continuations(engine, PROMPT, 3, sampling, gamma=2, n=2000, seed=300, stats_sink=stats)
    assert goodness_of_fit("3-token law", counts, law).p_value > 1e-4
    drafted, accepted = sum(s.drafted for s in stats), sum(s.accepted for s in stats)
    assert drafted >= 2000 and 0 < accepted < drafted, (drafted, accepted)


def test_negative_control_q_not_renormalised_is_caught(tiny_pair, monkeypatch):
    """The drafter reporting its softmax over its whole vocabulary, read at the intersection, as q."""
    target = tiny_pair[0]
    sampling, honest_draw = SamplingParams(temperature=1.0), VocabMap.draw

    def draw_but_report_the_unrenormalised_q(self, logits, sampling, generator, position):
        token, index, _ = honest_draw(self, logits, sampling, generator, position)
        return token, index, self.full(probs(logits, sampling)[:, self.source], 0.0)[0]

    drafter = cross_drafter(tiny_pair)
    monkeypatch.setattr(VocabMap, "draw", draw_but_report_the_unrenormalised_q)
    law = exact_continuation_law(target, PROMPT, 3, sampling)
    counts = sample_continuations(SpeculativeEngine(LeanBackend(target), drafter), PROMPT, 3, sampling, gamma=2,
                                  n=2000, seed=300)
    assert goodness_of_fit("3-token law", counts, law).p_value < 1e-4


@pytest.mark.parametrize("way", ["tli", "slem", "auto"])
def test_greedy_output_is_plain_decodings(tiny_pair, way, monkeypatch):
    monkeypatch.setattr(cross, "FIRST_ROUNDS", 2)
    target = tiny_pair[0]
    spec, greedy = SpecConfig(gamma=3, max_new_tokens=40, stop_at_eos=False), SamplingParams(temperature=0)
    plain = SpeculativeEngine(LeanBackend(target), None).generate(PROMPT, greedy, spec)
    plain.run()
    drafter = cross_drafter(tiny_pair, way)
    run = SpeculativeEngine(LeanBackend(target), drafter).generate(PROMPT, greedy, spec)
    run.run()
    assert run.tokens == plain.tokens and run.stats.drafted > 0
    if way == "auto":  # both ways were measured
        assert drafter.record["tli"][0] >= 2 and drafter.record["slem"][0] >= 2, drafter.record


def test_smollm2_drafts_for_gemma3_with_gemma3s_output():
    """The built-in pair: SmolLM2-135M (49 k byte-level BPE) drafting for Gemma-3-270M (262 k
    SentencePiece): greedy output equals plain decoding's, with drafts accepted."""
    from specdec.api import SpecDec

    sd = SpecDec(target="gemma3-270m", drafter="model:smollm2-135m")
    assert isinstance(sd.drafter, CrossTokenizerDrafter) and 0.1 < sd.drafter.vocab_share < 0.3
    for prompt in ("Translate this message from English to German:\n\nFile not found.",
                   "Write a Python function that returns the square of a number."):
        spec = sd.generate(prompt, max_new_tokens=32, gamma=3)
        plain = sd.generate(prompt, max_new_tokens=32, gamma=0)
        assert spec.token_ids == plain.token_ids, prompt
        assert spec.stats.accepted > 0 and spec.stats.draft_vocab_share == sd.drafter.vocab_share
