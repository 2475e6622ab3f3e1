"""The lean backend gives transformers' logits on the same weights, rolls back for free, and keeps
greedy parity; unknown architectures fall back to transformers."""

import pytest
import torch

from helpers import tiny_gemma3, tiny_llama, tiny_llama_family
from specdec.backends import TransformersBackend
from specdec.backends.lean import LeanBackend, make_backend
from specdec.config import SamplingParams, SpecConfig
from specdec.decoding.engine import SpeculativeEngine
from specdec.drafters import ModelDrafter, PromptLookupDrafter

VOCAB = 40
MODELS = {"llama": lambda seed=0: tiny_llama(VOCAB, seed=seed),
          "gemma3": lambda seed=0: tiny_gemma3(VOCAB, seed=seed, sliding_window=8),
          **{kind: (lambda seed=0, kind=kind: tiny_llama_family(kind, VOCAB, seed=seed, sliding_window=8))
             for kind in ("mistral", "qwen2", "qwen3")}}


@pytest.mark.parametrize("arch", MODELS)
@pytest.mark.parametrize("dtype,atol", [(torch.float32, 1e-4), (torch.bfloat16, 0.15)])
def test_same_logits_as_transformers(arch, dtype, atol):
    model = MODELS[arch]().to(dtype)
    ids = torch.randint(0, VOCAB, (30,), generator=torch.Generator().manual_seed(0))
    lean, hf = LeanBackend(model), TransformersBackend(model)
    # a prefill, then steps of 1 and of 5 positions, crossing the sliding window of 8
    for chunk in (ids[:12], ids[12:13], ids[13:18], ids[18:19], ids[19:30]):
        a, b = lean.forward(chunk), hf.forward(chunk)
        assert a.shape == b.shape
        assert (a - b).abs().max() <= atol * max(1.0, b.abs().max()), (a - b).abs().max()


@pytest.mark.parametrize("arch", MODELS)
def test_rollback_is_free_and_exact(arch):
    model = MODELS[arch]()
    ids = torch.randint(0, VOCAB, (30,), generator=torch.Generator().manual_seed(1))
    lean = LeanBackend(model)
    lean.forward(ids[:20])
    lean.forward((ids[20:26] + 3) % VOCAB)  # a draft that will be rejected
    lean.rollback(20)
    after = lean.forward(ids[20:25])
    fresh = TransformersBackend(model).forward(ids[:25])[20:25]
    assert torch.allclose(after, fresh, atol=1e-4)


@pytest.mark.parametrize("arch", MODELS)
@pytest.mark.parametrize("gamma", [1, 4, 8])
def test_greedy_parity_with_transformers_backend(arch, gamma):
    target, draft = MODELS[arch](0), MODELS[arch](1)
    prompt = [1, 2, 3, 4, 5, 1, 2, 3, 9, 4, 5, 1, 2]
    plain = SpeculativeEngine(TransformersBackend(target)).generate(
        prompt, SamplingParams(), SpecConfig(gamma=0, max_new_tokens=40)).run().tokens
    for drafter in (PromptLookupDrafter(), ModelDrafter(LeanBackend(draft), VOCAB)):
        run = SpeculativeEngine(LeanBackend(target), drafter).generate(
            prompt, SamplingParams(), SpecConfig(gamma=gamma, max_new_tokens=40)).run()
        assert run.tokens == plain
        assert run.stats.path == "lean"


def test_unknown_architecture_falls_back():
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=1, n_head=2, n_positions=64)).eval()
    backend = make_backend(model)
    assert backend.path == "transformers"
    assert backend.forward(torch.tensor([1, 2, 3])).shape == (3, VOCAB)


def test_biases_the_lean_path_does_not_add_fall_back_to_transformers():
    from transformers import LlamaConfig, LlamaForCausalLM

    from specdec.errors import SpecdecError

    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                         num_key_value_heads=2, attention_bias=True)  # on q, k, v and o: o's is not added
    model = LlamaForCausalLM(config).eval()
    assert make_backend(model).path == "transformers"
    with pytest.raises(SpecdecError, match="biases on its attention output or MLP"):
        make_backend(model, prefer="lean")


@pytest.mark.slow
def test_builtin_model_lean_matches_transformers(builtin_model):
    ids = torch.tensor(builtin_model.tokenizer("The quick brown fox jumps over the lazy dog.")["input_ids"])
    a = LeanBackend(builtin_model.model).forward(ids)
    b = TransformersBackend(builtin_model.model).forward(ids)
    assert (a - b).abs().max() < 1e-3 * b.abs().max()
    assert torch.equal(a.argmax(-1), b.argmax(-1))
