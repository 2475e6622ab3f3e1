"""The built-in SmolLM2-135M: greedy parity with plain decoding in float32, and the main job."""

import json

import pytest

from specdec.backends import TransformersBackend
from specdec.config import SamplingParams, SpecConfig
from specdec.decoding.engine import SpeculativeEngine
from specdec.drafters import NGramDrafter, NGramTable, PromptLookupDrafter

PROMPTS = [
    "Repeat this sentence exactly: The quick brown fox jumps over the lazy dog, and the dog sleeps.",
    "Rewrite with type hints:\n\ndef add(a, b):\n    return a + b\n\ndef scale(xs, k):\n    return [x * k for x in xs]",
    "Translate to German: The file could not be opened because it does not exist.",
]


@pytest.fixture(scope="module")
def bigram(builtin_model):
    from specdec.models import tokenizer_fingerprint
    from specdec.tasks import corpus

    tok = builtin_model.tokenizer
    texts = [m.english + " " + m.german for m in corpus.gettext_messages()[:3000]]
    seqs = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    return NGramTable.fit(seqs, n=2, tokenizer_id=tokenizer_fingerprint(tok))


@pytest.fixture(scope="module")
def plain_outputs(builtin_model) -> dict[str, list[int]]:
    """Each prompt's plain greedy continuation (40 tokens), decoded once for every gamma below."""
    plain = SpeculativeEngine(TransformersBackend(builtin_model.model), None, builtin_model.eos_token_ids)
    return {text: plain.generate(builtin_model.encode(text), SamplingParams(),
                                 SpecConfig(gamma=0, max_new_tokens=40)).run().tokens for text in PROMPTS}


@pytest.mark.slow
@pytest.mark.parametrize("gamma", [1, 4, 8])
def test_builtin_greedy_parity_fp32(builtin_model, bigram, plain_outputs, gamma):
    backend = TransformersBackend(builtin_model.model)
    eos = builtin_model.eos_token_ids
    for drafter in (PromptLookupDrafter(), NGramDrafter(bigram)):
        spec_engine = SpeculativeEngine(backend, drafter, eos)
        for text in PROMPTS:
            ids = builtin_model.encode(text)
            run = spec_engine.generate(ids, SamplingParams(), SpecConfig(gamma=gamma, max_new_tokens=40)).run()
            assert run.tokens == plain_outputs[text], (drafter.name, text)
            assert run.stats.drafted > 0


@pytest.mark.slow
def test_main_job_cli_compare_json():
    """What the README's first command runs: the built-in model, the default drafter (prompt lookup at T=0), --compare."""
    from test_cli import run_cli

    proc = run_cli("generate", PROMPTS[1], "--max-new-tokens", "48", "--compare", "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    from specdec.modeling import kernels, quant

    # auto picks the lean forward pass for Llama: on the GGUF file's blocks with int8 activations where
    # quant.cpp's packed kernels run (AVX2, AVX-512 VNNI, AMX-INT8), else in bf16 on kernels.cpp where
    # they build (on AMX tiles where the CPU has them), else on the blocks with quant.cpp's unpacked
    # AVX2 kernels, else float32 on oneDNN
    kern = kernels.load()
    if quant.packed_int8():
        expected = "lean+gguf-int8+" + quant.packed_isa()
    else:
        expected = (("lean+tiles" if kern.tiles else "lean+kernels") if kern
                    else "lean+gguf-int8" if quant.load() else "lean")
    assert out["stats"]["path"] == expected
    assert out["stats"]["new_tokens"] > 0 and out["baseline"]["stats"]["new_tokens"] > 0
    assert out["speedup"] > 0
    assert out["stats"]["accepted"] > 0  # the answer quotes the code, so prompt lookup must hit


@pytest.mark.slow
def test_shipped_trained_drafter_parity_fp32(builtin_model):
    """The drafter shipped for smollm2-135m loads (in float32 too: the identity check ignores the
    dtype), drafts, and leaves greedy output unchanged."""
    from specdec.backends import LeanBackend
    from specdec.drafters import build_drafter, shipped_drafter

    assert shipped_drafter("smollm2-135m") is not None
    auto = build_drafter("auto", builtin_model)  # the default: prompt lookup greedy, eagle sampling
    assert auto.for_sampling(SamplingParams()).name.startswith("prompt-lookup")
    assert auto.for_sampling(SamplingParams(temperature=0.8)).name.startswith("eagle:")
    drafter = build_drafter("trained", builtin_model)
    backend = LeanBackend(builtin_model.model)
    eos = builtin_model.eos_token_ids
    plain = SpeculativeEngine(backend, None, eos)
    spec_engine = SpeculativeEngine(backend, drafter, eos)
    for text in PROMPTS[:2] + ["Why do we have seasons on Earth?"]:
        ids = builtin_model.encode(text)
        expected = plain.generate(ids, SamplingParams(), SpecConfig(gamma=0, max_new_tokens=40)).run().tokens
        run = spec_engine.generate(ids, SamplingParams(), SpecConfig(gamma=4, max_new_tokens=40)).run()
        assert run.tokens == expected, text
        assert run.stats.accepted > 0
