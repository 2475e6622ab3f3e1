"""The bf16 kernels' AMX tile path (kernels.cpp linear_tiles) and what it carries: a position's numbers
do not depend on how many positions a pass scores (1 to 70, prefill included), nor on whether they sit
in a chain, a token tree or a pass of several sequences; so speculative greedy output is plain greedy
output token for token. Tests of the tiles skip, saying why, where the CPU has no AMX; the tree and
batch tests also run on the AVX-512 dot products (passes of up to 16 rows)."""

import pytest
import torch

from helpers import check_tree_path_scores_like_steps, tiny_gemma3, tiny_llama, tiny_llama_family
from specdec.backends.base import Step
from specdec.backends.lean import LeanBackend
from specdec.config import SamplingParams, SpecConfig
from specdec.decoding.engine import SpeculativeEngine
from specdec.drafters import PromptLookupDrafter, PromptLookupTreeDrafter
from specdec.modeling import kernels
from specdec.modeling.extension import cpu_flags


@pytest.fixture(scope="module")
def kern():
    if "avx512_bf16" not in cpu_flags():
        pytest.skip("needs a CPU with AVX-512 BF16 (kernels.cpp); the lean backend then runs oneDNN or the GGUF blocks")
    module = kernels.load()
    assert module is not None, kernels.unavailable_reason()  # it must build wherever it can run
    return module


@pytest.fixture(scope="module")
def tiles(kern):
    if not kern.tiles:
        pytest.skip(f"AMX tiles do not run here: {kern.tiles_reason}")
    return kern


def bf16(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16)


@pytest.mark.parametrize("k,n", [(32, 32), (40, 7), (576, 130), (1536, 576)])  # partial tiles of K and N
def test_linear_tiles_matches_the_fp32_product_and_is_row_invariant(tiles, k, n):
    x, w, residual = bf16(70, k, seed=1), bf16(n, k, seed=2), bf16(70, n, seed=3)
    packed = tiles.pack(w)
    exact = x.float() @ w.float().T  # bf16 products are exact in fp32; only the order of the sums differs
    out = tiles.linear(x, packed)
    assert ((out.float() - exact).abs() <= 2 * 2.0 ** -8 * exact.abs() + 1e-5 * k).all()
    with_residual = tiles.linear(x, packed, residual)
    assert torch.equal(with_residual, (out.float() + residual.float()).to(torch.bfloat16))
    for rows in (1, 2, 15, 16, 17, 32, 33, 64):  # one tile, two, a pass of two and a part
        assert torch.equal(tiles.linear(x[:rows], packed), out[:rows]), rows


def test_linear_tiles_refuses_weights_of_another_shape(tiles):
    packed = tiles.pack(bf16(64, 64))
    with pytest.raises(RuntimeError, match="do not match"):
        tiles.module.linear_tiles(bf16(1, 96), packed.packed, 64)


def models():
    return [("llama-hd8", tiny_llama(40, seed=3)), ("llama-hd64", tiny_llama(40, seed=3, head_dim=64)),
            ("gemma3-window8", tiny_gemma3(40, seed=3, sliding_window=8)),
            ("gemma3-hd64", tiny_gemma3(40, seed=3, sliding_window=8, head_dim=64)),
            ("mistral-window8", tiny_llama_family("mistral", 40, seed=3, sliding_window=8))]


MODELS = models()


def backend(model, tiled: bool) -> LeanBackend:
    out = LeanBackend(model.to(torch.bfloat16), use_tiles=tiled)
    assert out.path == ("lean+tiles" if tiled else "lean+kernels")
    return out


@pytest.mark.parametrize("name,model", MODELS, ids=[m[0] for m in MODELS])
def test_a_positions_logits_do_not_depend_on_the_pass(tiles, name, model):
    """One position at a time, the whole sequence at once (a prefill of 70 rows) and chunks of 5 and 33
    give the same logits to the bit, past Gemma's sliding window."""
    ids = torch.randint(0, 40, (70,), generator=torch.Generator().manual_seed(4))
    lean = backend(model, tiled=True)
    one_by_one = torch.cat([lean.forward(ids[i : i + 1]) for i in range(70)])
    lean.reset()
    assert torch.equal(lean.forward(ids), one_by_one)
    for chunk in (5, 33):
        lean.reset()
        assert torch.equal(torch.cat([lean.forward(ids[i : i + chunk]) for i in range(0, 70, chunk)]), one_by_one)
    lean.reset()
    lean.append(ids[:69])  # a prompt (no LM head) then a step: the cache is the one the steps wrote
    assert torch.equal(lean.forward(ids[69:]), one_by_one[69:])


def test_the_tiles_agree_with_the_aten_path(tiles):
    model = tiny_llama(40, seed=3, head_dim=64).to(torch.bfloat16)
    ids = torch.randint(0, 40, (40,), generator=torch.Generator().manual_seed(0))
    a, b = backend(model, tiled=True).forward(ids), LeanBackend(model, use_kernels=False).forward(ids)
    assert (a - b).abs().max() <= 0.05 * max(1.0, b.abs().max())


@pytest.mark.parametrize("tiled", [True, False], ids=["tiles", "dot-products"])
@pytest.mark.parametrize("name,model", MODELS, ids=[m[0] for m in MODELS])
def test_a_trees_accepted_path_scores_what_plain_decoding_scores_to_the_bit(kern, tiled, name, model):
    """A tree pass on the kernels (other branches in the slots between the path's nodes, masked out)
    scores its accepted path exactly as one-position steps do, and after keep_path the next step is
    the same too."""
    if tiled and not kern.tiles:
        pytest.skip(f"AMX tiles do not run here: {kern.tiles_reason}")
    check_tree_path_scores_like_steps(backend(model, tiled))


@pytest.mark.parametrize("tiled", [True, False], ids=["tiles", "dot-products"])
@pytest.mark.parametrize("name,model", MODELS[::2], ids=[m[0] for m in MODELS[::2]])
def test_several_sequences_in_one_pass_equal_each_alone_to_the_bit(kern, tiled, name, model):
    """A position, a chain, a tree and a prompt chunk of four sequences in one pass of the kernels."""
    if tiled and not kern.tiles:
        pytest.skip(f"AMX tiles do not run here: {kern.tiles_reason}")
    lean = backend(model, tiled)
    g = torch.Generator().manual_seed(9)
    contexts = [torch.randint(0, 40, (n,), generator=g) for n in (11, 19, 6, 3)]
    steps = [Step(torch.tensor([5])), Step(torch.tensor([7, 8, 9])),
             Step(torch.tensor([3, 4, 5, 6]), parents=torch.tensor([-1, -1, 0])),
             Step(torch.tensor([1, 2, 3, 4]), wants_logits=False)]
    sequences = [lean.fork() for _ in contexts]
    for sequence, context in zip(sequences, contexts):
        sequence.prefill(context)
    together = lean.forward_many(list(zip(sequences, steps)))
    after = sequences[3].forward(torch.tensor([6]))
    for sequence, context, s, logits in zip(sequences, contexts, steps, together):
        sequence.rollback(len(context))
        if s.parents is not None:
            alone = sequence.forward_tree(s.ids, s.parents)
        elif s.wants_logits:
            alone = sequence.forward(s.ids)
        else:
            sequence.append(s.ids)
            alone = None
        assert (alone is None and logits is None) or torch.equal(alone, logits)
    assert torch.equal(sequences[3].forward(torch.tensor([6])), after)


@pytest.mark.parametrize("name,model", MODELS[1::2], ids=[m[0] for m in MODELS[1::2]])
def test_speculative_equals_plain_on_the_tiles(tiles, name, model):
    """Chains and trees of drafts of any length, gamma fixed (past 16 rows) or auto."""
    lean = backend(model, tiled=True)
    assert lean.cheap_rows and lean.fast_rows >= 64
    prompt = [int(t) for t in torch.randint(0, 40, (24,), generator=torch.Generator().manual_seed(5))] * 2
    plain = SpeculativeEngine(lean, None).generate(prompt, SamplingParams(), SpecConfig(gamma=0, max_new_tokens=40))
    expected = plain.run().tokens
    for drafter in (PromptLookupDrafter(), PromptLookupTreeDrafter()):
        for gamma in (3, 20, "auto"):
            run = SpeculativeEngine(lean, drafter).generate(prompt, SamplingParams(),
                                                           SpecConfig(gamma=gamma, max_new_tokens=40)).run()
            assert run.tokens == expected, (type(drafter).__name__, gamma)
            assert run.stats.path == "lean+tiles"


def test_turning_the_tiles_off_says_why_and_keeps_the_dot_products(kern, monkeypatch):
    monkeypatch.setenv("SPECDEC_TILES", "0")
    off = kernels.Kernels(kern.module)
    assert not off.tiles and "SPECDEC_TILES=0" in off.tiles_reason
    monkeypatch.setattr(kernels, "_kernels", off)
    lean = LeanBackend(tiny_llama(40, seed=3).to(torch.bfloat16))
    assert lean.path == "lean+kernels" and lean.fast_rows == 16 and not lean.cheap_rows
