"""Greedy parity on every numeric path a user can choose. For each --dtype, --weights, --backend and
drafter kind, on a Hugging Face directory and on a GGUF file, the API (what the CLI, the server and the
bench build on) either refuses the combination with a SpecdecError that names what stands in the way,
before anything runs, or its speculative output is, token for token, plain decoding on that same path,
with drafts proposed (and, where the drafter is the target's own weights, accepted)."""

from __future__ import annotations

import pytest

from specdec.api import SpecDec
from specdec.config import WEIGHTS
from specdec.errors import SpecdecError

DTYPES = ("auto", "float32", "bfloat16", "float16")
BACKENDS = ("auto", "transformers")
DRAFTERS = ("prompt-lookup", "prompt-lookup-tree", "suffix", "self-q4", "model", "none")
TOKENS = 20


@pytest.fixture(scope="module")
def targets(tiny_dirs, tmp_path_factory):
    """{kind: (target, same-tokenizer draft model, a prompt whose answer repeats)}: the tiny directory, and
    a tiny GGUF file of the built-in tokenizer's first 600 tokens (with a sibling to draft for it)."""
    from specdec.modeling import quant

    made = {"hf-directory": (str(tiny_dirs["target"]), str(tiny_dirs["draft"]), "the cat sat on the mat, the cat sat on the mat")}
    if quant.load() is not None:
        from specdec.bench.gguf_models import Shape, write_random

        root = tmp_path_factory.mktemp("paths")
        shape = Shape(hidden=256, layers=2, heads=4, kv_heads=2, ffn=512)
        target = write_random(root / "target.gguf", "llama", kind="Q4_K", seed=0, shape=shape, vocab=600)
        draft = write_random(root / "draft.gguf", "llama", kind="Q8_0", seed=1, shape=shape, vocab=600)
        made["gguf-file"] = (str(target), str(draft), "Hello world, hello world, hello world, hello")
    return made


def _run(target: str, draft: str, prompt: str, dtype: str, weights: str, backend: str, drafter: str):
    """None where the API refuses the combination (the message checked), else (plain, speculative)."""
    spec = f"model:{draft}" if drafter == "model" else drafter
    try:
        sd = SpecDec(target=target, drafter=spec, dtype=dtype, backend=backend, weights=weights)
    except SpecdecError as error:
        assert len(str(error)) > 20, error  # says what was wrong
        return None
    plain = sd.generate(prompt, max_new_tokens=TOKENS, gamma=0)
    fast = sd.generate(prompt, max_new_tokens=TOKENS, gamma=4)
    return plain, fast


@pytest.mark.parametrize("kind", ["hf-directory", "gguf-file"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_every_path_is_refused_clearly_or_exact(targets, kind, dtype):
    if kind not in targets:
        pytest.skip("quant.cpp does not run here: GGUF files need it")
    target, draft, prompt = targets[kind]
    ran, refused = [], []
    for weights in WEIGHTS:
        for backend in BACKENDS:
            for drafter in DRAFTERS:
                combination = f"--dtype {dtype} --weights {weights} --backend {backend} --drafter {drafter}"
                outcome = _run(target, draft, prompt, dtype, weights, backend, drafter)
                if outcome is None:
                    refused.append(combination)
                    continue
                plain, fast = outcome
                assert fast.token_ids == plain.token_ids, combination
                assert len(plain.token_ids) == TOKENS, combination
                if drafter != "none":
                    assert fast.stats.drafted > 0, combination
                    assert fast.stats.target_calls <= TOKENS - fast.stats.accepted + 1, combination
                if drafter == "self-q4":
                    assert fast.stats.accepted > 0, combination
                ran.append(combination)
    print(f"{kind}, --dtype {dtype}: {len(ran)} paths exact, {len(refused)} refused")
    if kind == "gguf-file" and dtype not in ("auto", "float32"):
        assert not ran  # a file's blocks take float32 activations: refused, saying so
    else:  # the default path, and the model drafters where they apply, run
        float32 = dtype in ("auto", "float32")  # what self-q4's blocks take, and say so otherwise
        for drafter in ("prompt-lookup-tree", "model") + (("self-q4",) if kind == "hf-directory" and float32 else ()):
            assert f"--weights auto --backend auto --drafter {drafter}" in " ".join(ran), (drafter, refused)
