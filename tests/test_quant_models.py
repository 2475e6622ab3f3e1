"""Models on GGUF blocks (quant.cpp, backends/gguf.py): a layer in one call is the layer as ops to the bit,
the built-in file's blocks are exactly the weights transformers loaded, `--weights` quantises a float
model, and speculative decoding on blocks emits what plain decoding does."""

import json

import numpy as np
import pytest
import torch

from helpers import (
    blocks_of,
    built_extension,
    check_tree_path_scores_like_steps,
    int8_path,
    tiny_gemma3,
    tiny_llama,
    tiny_llama_family,
)
from specdec.backends.gguf import GGUFWeights, choose_weights
from specdec.backends.lean import LeanBackend, target_backend
from specdec.config import SamplingParams, SpecConfig
from specdec.decoding.batching import Batch
from specdec.decoding.engine import SpeculativeEngine
from specdec.drafters import PromptLookupDrafter, PromptLookupTreeDrafter
from specdec.errors import SpecdecError
from specdec.modeling import quant

KINDS = quant.KINDS


@pytest.fixture(scope="module")
def kernels():
    return built_extension(quant)


# --- a tiny model whose float weights are its blocks, dequantised ---------------------------------

_PARTS = {"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "o_proj", "gate": "gate_proj", "up": "up_proj",
          "down": "down_proj"}
_NAMES = {"q": "attn_q", "k": "attn_k", "v": "attn_v", "o": "attn_output", "gate": "ffn_gate", "up": "ffn_up",
          "down": "ffn_down"}


def quantised_twin(model, kinds: dict[str, int], head_kind: int | None = 8) -> GGUFWeights:
    """Quantise `model`'s linear layers (kind per part; a part left out keeps float weights) and its LM
    head, and set the float weights to the blocks' values: the same model on two paths."""
    tensors = {}
    with torch.no_grad():
        for i, layer in enumerate(model.model.layers):
            for part, attr in _PARTS.items():
                module = getattr(layer.self_attn if part in ("q", "k", "v", "o") else layer.mlp, attr)
                if part in kinds:
                    w = blocks_of(module.weight.float(), kinds[part])
                    module.weight.copy_(quant.dequantize(w))
                    tensors[f"blk.{i}.{_NAMES[part]}.weight"] = w
        head = model.get_output_embeddings()
        if head_kind is not None:
            w = blocks_of(head.weight.float(), head_kind)
            head.weight.copy_(quant.dequantize(w))
            tensors["output.weight"] = w
    return GGUFWeights(path=None, arch="test", tensors=tensors)


def tiny(arch: str):
    """head_dim 16: what rowops.cpp's fused q/k RoPE, and so quant.cpp's layer_step, take."""
    if arch == "llama":
        return tiny_llama(40, seed=3, head_dim=16).float()
    if arch == "gemma3":
        return tiny_gemma3(40, seed=3, sliding_window=8, head_dim=16).float()
    return tiny_llama_family(arch, 40, seed=3, sliding_window=8, head_dim=16).float()  # qwen2's QKV bias, qwen3's norms


ALL_Q4_1 = dict.fromkeys(_PARTS, 3)
MIXED = {"q": 6, "k": 6, "v": 8, "gate": 2, "up": 3, "down": 8}  # o stays float; q/k/v fuse as two kinds


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
@pytest.mark.parametrize("kinds", [ALL_Q4_1, MIXED], ids=["q4_1", "mixed"])
def test_lean_on_blocks_gives_the_float_models_logits(kernels, arch, kinds):
    model = tiny(arch)
    weights = quantised_twin(model, kinds)
    on_blocks, on_floats = LeanBackend(model, gguf=weights), LeanBackend(model)
    assert on_blocks.path == "lean+gguf" and "GGUF blocks" in on_blocks.numeric_path(1)
    ids = torch.randint(0, 40, (30,), generator=torch.Generator().manual_seed(0))
    for chunk in (ids[:12], ids[12:13], ids[13:18], ids[18:30]):
        a, b = on_blocks.forward(chunk), on_floats.forward(chunk)
        assert (a - b).abs().max() <= 1e-4 * max(1.0, b.abs().max())


def test_blocks_that_do_not_fit_the_model_are_refused(kernels):
    model = tiny("llama")
    weights = quantised_twin(model, ALL_Q4_1)
    weights.tensors["blk.0.ffn_down.weight"] = weights.tensors["blk.0.attn_q.weight"]
    with pytest.raises(SpecdecError, match="not the file this model was converted from"):
        LeanBackend(model, gguf=weights)


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
@pytest.mark.parametrize("int8", [False, True], ids=["float-activations", "int8-activations"])
def test_speculative_equals_plain_on_blocks(kernels, arch, int8):
    """Row invariance carries greedy parity: chains and trees of drafts, scored several rows a pass."""
    model = tiny(arch)
    backend = LeanBackend(model, gguf=quantised_twin(model, ALL_Q4_1), int8_activations=int8)
    prompt = [int(t) for t in torch.randint(0, 40, (24,), generator=torch.Generator().manual_seed(5))] * 2
    plain = SpeculativeEngine(backend, None).generate(prompt, SamplingParams(), SpecConfig(gamma=0, max_new_tokens=40))
    expected = plain.run().tokens
    for drafter in (PromptLookupDrafter(), PromptLookupTreeDrafter()):
        for gamma in (3, "auto"):
            run = SpeculativeEngine(backend, drafter).generate(prompt, SamplingParams(),
                                                              SpecConfig(gamma=gamma, max_new_tokens=40)).run()
            assert run.tokens == expected, (type(drafter).__name__, gamma)
            assert run.stats.path == (int8_path() if int8 else "lean+gguf")


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
@pytest.mark.parametrize("int8", [False, True], ids=["float-activations", "int8-activations"])
def test_a_trees_accepted_path_scores_what_plain_decoding_scores_to_the_bit(kernels, arch, int8):
    """A tree's nodes sit in slots with other branches between them (masked out); attention must not
    let that change a sum's order, or the accepted path's logits differ from one-position steps in the
    last bits, which int8 activations (rounded per 32) turn into differences of whole logits."""
    model = tiny(arch)
    check_tree_path_scores_like_steps(LeanBackend(model, gguf=quantised_twin(model, ALL_Q4_1), int8_activations=int8))


@pytest.mark.parametrize("arch", ["llama", "gemma3", "qwen2", "qwen3"])
@pytest.mark.parametrize("int8", [False, True], ids=["float-activations", "int8-activations"])
def test_a_layer_in_one_call_is_the_layer_as_ops_to_the_bit(kernels, arch, int8):
    """quant.cpp's layer_step (a whole layer of one sequence in one call) against layer_aten with
    rowops.cpp: equal logits, bit for bit, for a chunk of 14 positions, one position, a chain and a tree,
    past Gemma's sliding window; so passes may take either. With int8 activations the KV cache is
    float16 (llama.cpp's), with float32 ones float32."""
    from specdec.modeling.tree import TreeLayout

    model = tiny(arch)
    weights = quantised_twin(model, ALL_Q4_1)
    one_call, as_ops = (LeanBackend(model, gguf=weights, int8_activations=int8) for _ in range(2))
    as_ops.decoder.layer_step = None
    assert one_call.decoder.layer_step is not None
    assert one_call.cache.dtype == (torch.float16 if int8 else torch.float32)
    ids = torch.randint(0, 40, (30,), generator=torch.Generator().manual_seed(1))
    for backend in (one_call, as_ops):
        backend.reset()
    # a chunk with logits, not a prompt: both attend on rowops (the ops give prompt chunks to SDPA)
    assert torch.equal(one_call.forward(ids[:14]), as_ops.forward(ids[:14]))
    for chunk in (ids[14:15], ids[15:20]):
        assert torch.equal(one_call.forward(chunk), as_ops.forward(chunk))
    parents = torch.tensor([-1, -1, 0, 0, 2])  # rows: the root, then five nodes
    trees = [b._forward_tree(ids[20:26], TreeLayout.of(parents), b.length) for b in (one_call, as_ops)]
    assert torch.equal(trees[0], trees[1])


@pytest.mark.parametrize("arch", ["llama", "gemma3", "qwen2", "qwen3"])
@pytest.mark.parametrize("int8", [False, True], ids=["float-activations", "int8-activations"])
def test_several_sequences_in_one_call_equal_each_alone_to_the_bit(kernels, arch, int8, monkeypatch):
    """A pass of several sequences (a position, a chain, a tree) takes quant.cpp's stack call once for
    all of them, and each sequence's logits are what it gets alone."""
    from specdec.backends.base import Step

    model = tiny(arch)
    backend = LeanBackend(model, gguf=quantised_twin(model, ALL_Q4_1), int8_activations=int8)
    calls = []
    step = backend.decoder.layer_step
    monkeypatch.setattr(step, "run", lambda h, tables, sequences, *rest:
                        calls.append(len(sequences)) or type(step).run(step, h, tables, sequences, *rest))
    g = torch.Generator().manual_seed(9)
    contexts = [torch.randint(0, 40, (n,), generator=g) for n in (11, 19, 6)]
    steps = [Step(torch.tensor([5])), Step(torch.tensor([7, 8, 9])),
             Step(torch.tensor([3, 4, 5, 6]), parents=torch.tensor([-1, -1, 0]))]
    sequences = [backend.fork() for _ in contexts]
    for sequence, context in zip(sequences, contexts):
        sequence.prefill(context)
    calls.clear()
    together = backend.forward_many(list(zip(sequences, steps)))
    assert calls == [3]  # one call for the pass, three sequences in it
    for sequence, context, s, logits in zip(sequences, contexts, steps, together):
        sequence.rollback(len(context))
        alone = sequence.forward(s.ids) if s.parents is None else sequence.forward_tree(s.ids, s.parents)
        assert torch.equal(alone, logits)


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
@pytest.mark.parametrize("int8", [False, True], ids=["float-activations", "int8-activations"])
def test_a_prompts_cache_does_not_depend_on_its_chunks(kernels, arch, int8):
    """A server cuts prompts into chunks as the batch allows; the keys and values (and so every later
    logit) must be those of the prompt in one piece, or with int8 activations a batched request differs
    from the same request alone (SDPA's prompt attention did, in the last bits, for Llama here)."""
    model = tiny(arch)
    backend = LeanBackend(model, gguf=quantised_twin(model, ALL_Q4_1), int8_activations=int8)
    ids = torch.randint(0, 40, (60,), generator=torch.Generator().manual_seed(3))
    backend.append(ids)
    whole = backend.forward(torch.tensor([4]))
    backend.reset()
    for start in range(0, 60, 7):
        backend.append(ids[start : start + 7])
    assert torch.equal(backend.forward(torch.tensor([4])), whole)


def test_the_caches_handle_follows_the_storage_as_it_grows(kernels):
    """stack_steps takes each sequence's caches as one handle (KVCache.bound), made again when the storage
    grows: a pass after the growth must read the keys written before it, as one pass over the whole does."""
    model = tiny("llama")
    backend = LeanBackend(model, gguf=quantised_twin(model, ALL_Q4_1), int8_activations=True)
    ids = torch.randint(0, 40, (300,), generator=torch.Generator().manual_seed(5))
    backend.append(ids[:250])  # capacity 256
    first = backend.cache.bound(kernels.SequenceCaches)
    assert backend.cache.bound(kernels.SequenceCaches) is first  # kept while the storage stands
    backend.append(ids[250:])  # grows to 512: the old handle names the old tensors
    assert backend.cache.bound(kernels.SequenceCaches) is not first
    grown = backend.forward(torch.tensor([4]))
    backend.reset()  # the whole context in one pass, into the grown storage
    backend.append(ids)
    assert torch.equal(backend.forward(torch.tensor([4])), grown)


@pytest.mark.parametrize("kinds", [ALL_Q4_1, MIXED], ids=["layers-in-one-call", "mixed"])
def test_batched_generations_on_blocks_equal_each_alone(kernels, kinds):
    model = tiny("llama")
    backend = LeanBackend(model, gguf=quantised_twin(model, kinds))
    g = torch.Generator().manual_seed(7)
    prompts = [[int(t) for t in torch.randint(0, 40, (n,), generator=g)] * 2 for n in (9, 17, 5)]
    engine = SpeculativeEngine(backend, PromptLookupDrafter())
    alone = [engine.generate(p, SamplingParams(), SpecConfig(max_new_tokens=24)).run().tokens for p in prompts]
    batch = Batch(SpeculativeEngine(backend, PromptLookupDrafter()), max_batch=3, prefill_chunk=5)
    members = [batch.add(p, SamplingParams(), SpecConfig(max_new_tokens=24)) for p in prompts]
    while batch.members:
        batch.step()
    assert [m.tokens for m in members] == alone
    batch.close()


def test_blocks_are_mapped_from_the_file_and_indexed_once(tmp_path, monkeypatch):
    """GGUFWeights.read maps the file's blocks through an index cached beside nothing but the index (gguf's
    reader takes seconds on a real file's metadata): a second read parses nothing and gives the same blocks,
    a changed file is indexed again, and an unreadable index is replaced, not an error."""
    import os

    import gguf
    import gguf.quants

    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "tiny.gguf"

    def write(seed: int) -> None:
        w = gguf.GGUFWriter(str(path), "llama")
        x = np.random.default_rng(seed).standard_normal((8, 64)).astype(np.float32)
        w.add_tensor("blk.0.attn_q.weight", gguf.quants.quantize(x, gguf.GGMLQuantizationType.Q8_0),
                     raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        w.add_tensor("blk.0.attn_k.weight", x)  # float32: a type the kernels do not read
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()

    def same(a: GGUFWeights, b: GGUFWeights) -> bool:
        return (a.arch == b.arch and a.skipped == b.skipped and a.tensors.keys() == b.tensors.keys()
                and all(torch.equal(a.tensors[n].blocks, b.tensors[n].blocks) and a.tensors[n].kind == b.tensors[n].kind
                        and a.tensors[n].in_features == b.tensors[n].in_features for n in a.tensors))

    write(0)
    parsed = GGUFWeights.read(path)
    first_blocks = parsed.tensors["blk.0.attn_q.weight"].blocks.clone()  # a mapping sees the file rewritten in place
    indexes = list((tmp_path / "cache" / "gguf-files").glob("*/index.json"))
    assert len(indexes) == 1 and parsed.skipped == {"blk.0.attn_k.weight": "F32"}
    assert parsed.tensors["blk.0.attn_q.weight"].blocks.shape == (8, 68)
    assert torch.equal(parsed.file.dense("blk.0.attn_k.weight"),
                       torch.from_numpy(np.random.default_rng(0).standard_normal((8, 64)).astype(np.float32)))
    monkeypatch.setattr(gguf, "GGUFReader", None)  # a second read must not parse the file
    assert same(GGUFWeights.read(path), parsed)
    monkeypatch.undo()
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    indexes[0].write_text("not an index")
    assert same(GGUFWeights.read(path), parsed)  # indexed again, the index rewritten
    assert same(GGUFWeights.read(path), parsed)
    before = path.stat().st_mtime_ns
    write(1)
    os.utime(path, ns=(before + 10**9, before + 10**9))  # a later time even where timestamps are coarse
    changed = GGUFWeights.read(path)
    assert not torch.equal(changed.tensors["blk.0.attn_q.weight"].blocks, first_blocks)


# --- the built-in model's file --------------------------------------------------------------------

def test_builtin_blocks_are_exactly_the_converted_weights(kernels, builtin_model):
    """Every matrix read from SmolLM2's GGUF (Q4_1 layers with llama.cpp's q/k row permutation undone,
    the Q8_0 tied embedding as LM head) dequantises to the float32 weights transformers loaded."""
    weights = GGUFWeights.read(builtin_model.gguf)
    model = builtin_model.model
    config = model.config
    assert not weights.skipped
    for i, layer in enumerate(model.model.layers):
        for part, attr in _PARTS.items():
            module = getattr(layer.self_attn if part in ("q", "k", "v", "o") else layer.mlp, attr)
            heads = {"q": config.num_attention_heads, "k": config.num_key_value_heads}.get(part)
            assert torch.equal(quant.dequantize(weights.layer(i, part, heads)), module.weight), (i, part)
    assert torch.equal(quant.dequantize(weights.lm_head()), model.get_output_embeddings().weight)


def test_builtin_on_blocks_keeps_greedy_parity(kernels, builtin_model):
    backend = target_backend(builtin_model, "auto", "gguf", "auto")
    assert backend.path == "lean+gguf"
    ids = builtin_model.encode("List the days of the week, then list them again in the same order.")
    plain = SpeculativeEngine(backend, None).generate(ids, SamplingParams(), SpecConfig(gamma=0, max_new_tokens=48))
    expected = plain.run().tokens
    spec = SpeculativeEngine(backend, PromptLookupTreeDrafter()).generate(ids, SamplingParams(),
                                                                          SpecConfig(max_new_tokens=48)).run()
    assert spec.tokens == expected


QUANTISED = {"llama": lambda: tiny_llama(40, seed=3, head_dim=16),
             "qwen2": lambda: tiny_llama_family("qwen2", 40, seed=3, head_dim=16),  # a QKV bias
             "qwen3": lambda: tiny_llama_family("qwen3", 40, seed=3, head_dim=16)}  # head norms


@pytest.mark.parametrize("kind", ["Q8_0", "Q4_0"])
def test_quantised_weights_are_the_float_weights_in_blocks(kernels, kind):
    """--weights q8_0 / q4_0: every matrix a whole number of blocks wide becomes blocks of `kind` that dequantise
    to within a block's rounding step of the float weights; the rest stay float."""
    from specdec.backends.gguf import QuantisedWeights

    model = QUANTISED["qwen2"]()
    weights = QuantisedWeights(model, kind)
    # a block's scale d is its largest magnitude over 127 (Q8_0) or 8 (Q4_0: codes -8..7, so the side opposite
    # the largest reaches 7 d: up to d off there), stored in float16
    levels, bound = {"Q8_0": (127, 0.6), "Q4_0": (8, 1.01)}[kind]
    for index, layer in enumerate(model.model.layers):
        for part, module in (("q", layer.self_attn.q_proj), ("down", layer.mlp.down_proj)):
            w = weights.layer(index, part)
            assert w.kind == quant.KINDS[kind] and quant.shape(w) == tuple(module.weight.shape)
            float_weight = module.weight.detach().float()
            step = float_weight.view(-1, 32).abs().amax(1, keepdim=True) / levels  # a block's scale
            assert ((quant.dequantize(w).view(-1, 32) - float_weight.view(-1, 32)).abs() <= step * bound + 1e-7).all()
    assert weights.lm_head() is not None
    assert QuantisedWeights(tiny_llama(40, seed=3, head_dim=16).float(), kind).layer(0, "q") is not None


@pytest.mark.parametrize("arch", list(QUANTISED))
@pytest.mark.parametrize("kind", ["Q8_0", "Q4_0"])
def test_speculative_equals_plain_on_quantised_weights(kernels, arch, kind):
    """A user's model on its own weights quantised at load: speculation stays exact for the quantised model
    (chains and trees), and a tree's accepted path scores what one-position steps score, to the bit."""
    from specdec.backends.gguf import QuantisedWeights

    model = QUANTISED[arch]()
    backend = LeanBackend(model, gguf=QuantisedWeights(model, kind), int8_activations=True)
    assert backend.path.startswith(f"lean+{kind.lower()}-int8") and kind in backend.numeric_path(1)
    assert backend.decoder.layer_step is not None  # every layer in one quant.cpp call
    prompt = [int(t) for t in torch.randint(0, 40, (24,), generator=torch.Generator().manual_seed(5))] * 2
    expected = SpeculativeEngine(backend, None).generate(prompt, SamplingParams(),
                                                         SpecConfig(gamma=0, max_new_tokens=40)).run().tokens
    for drafter in (PromptLookupDrafter(), PromptLookupTreeDrafter()):
        run = SpeculativeEngine(backend, drafter).generate(prompt, SamplingParams(),
                                                          SpecConfig(gamma=3, max_new_tokens=40)).run()
        assert run.tokens == expected, type(drafter).__name__
    check_tree_path_scores_like_steps(LeanBackend(model, gguf=QuantisedWeights(model, kind), int8_activations=True))


def test_self_q4_quantises_a_users_float_model_to_draft_for_it(kernels, tiny_dirs, capsys):
    """--drafter self-q4 on a model with no GGUF file: its own weights in Q4_0 draft for it, the output the
    float model's greedy output."""
    from specdec.cli import main

    assert main(["generate", "abc abc ab", "--target", str(tiny_dirs["target"]), "--no-chat", "--drafter", "self-q4",
                 "--max-new-tokens", "12", "--gamma", "3", "--compare", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["identical"] is True and out["stats"]["drafter"] == "model:self-q4" and out["stats"]["drafted"] > 0


def test_cli_quantised_weights(tiny_dirs, capsys):
    """--weights q8_0 on a user's directory runs (float32 under --dtype auto) and says so; what stands in its way
    is a clear error."""
    from specdec.cli import main

    assert main(["generate", "abc abc ab", "--target", str(tiny_dirs["target"]), "--no-chat", "--weights", "q8_0",
                 "--max-new-tokens", "8", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["stats"]["path"].startswith("lean+q8_0-int8")
    for extra, needle in ((["--dtype", "bfloat16"], "float32 activations"),
                          (["--backend", "transformers"], "transformers backend runs float weights only")):
        assert main(["generate", "abc", "--target", str(tiny_dirs["target"]), "--no-chat", "--weights", "q4_0",
                     *extra]) == 1
        err = capsys.readouterr().err
        assert err.startswith("specdec: error: --weights q4_0") and needle in err, err


def test_choosing_weights():
    path = object()
    f32 = torch.float32
    assert choose_weights("float", path, f32, "auto", "lean") is None
    assert choose_weights("auto", None, f32, "auto", "lean") is None  # not a built-in GGUF target
    assert choose_weights("auto", path, f32, "float32", "lean") is None  # the user chose the float dtype
    assert choose_weights("auto", path, torch.bfloat16, "auto", "lean") is None  # kernels.cpp's machines
    assert choose_weights("auto", path, f32, "auto", "transformers") is None
    with pytest.raises(SpecdecError, match="not a GGUF model"):
        choose_weights("gguf", None, f32, "auto", "lean")
    with pytest.raises(SpecdecError, match="float32 activations"):
        choose_weights("gguf", path, torch.bfloat16, "bfloat16", "lean")
    with pytest.raises(SpecdecError, match="transformers backend"):
        choose_weights("gguf", path, f32, "auto", "transformers")
    with pytest.raises(SpecdecError, match="unknown --weights"):
        choose_weights("int3", path, f32, "auto", "lean")
    if quant.load() is not None:
        assert choose_weights("auto", path, f32, "auto", "lean") is path
        assert choose_weights("gguf", path, f32, "float32", "auto") is path


def test_dtype_auto_is_float32_where_the_blocks_are_asked_for():
    """--dtype auto with --weights gguf / gguf-int8 or the self-q4 drafter loads a built-in target in
    float32, the only dtype the blocks take (it loaded bf16 on AVX-512 BF16 CPUs, and then the blocks
    failed with an error that suggested --dtype auto); an explicit dtype, another target or the
    transformers backend keep what was asked."""
    from specdec.backends.gguf import load_dtype
    from specdec.drafters import drafts_on_blocks

    for weights in ("gguf", "gguf-int8"):
        assert load_dtype("auto", weights, "smollm2-135m") == "float32"
        assert load_dtype("bfloat16", weights, "gemma3-270m") == "bfloat16"  # then choose_weights says why not
    assert load_dtype("auto", "float", "smollm2-135m", blocks_drafter=drafts_on_blocks(["self-q4"])) == "float32"
    assert not drafts_on_blocks(["auto", "trained", "model:x"])
    assert load_dtype("auto", "gguf", "/some/hf/dir") == "auto"
    assert load_dtype("auto", "gguf", "smollm2-135m", backend="transformers") == "auto"
    assert load_dtype("auto", "float", "smollm2-135m") == "auto"
    assert load_dtype("auto", "auto", "smollm2-135m") == ("float32" if quant.packed_int8() else "auto")
    for weights in ("q8_0", "q4_0"):  # any target: the blocks take float32 activations
        assert load_dtype("auto", weights, "/some/hf/dir") == "float32"
        assert load_dtype("bfloat16", weights, "/some/hf/dir") == "bfloat16"  # then quantised_weights says why not
        assert load_dtype("auto", weights, "/some/hf/dir", backend="transformers") == "auto"


def test_self_q4_drafts_for_the_float_target(kernels, builtin_model):
    """The target's own blocks (int8 activations) draft for its float32 weights: most drafts are
    accepted (0.97-0.99 over the benchmark's prompts), and the output is the float target's greedy output."""
    from specdec.backends import make_backend
    from specdec.drafters import build_drafter

    drafter = build_drafter("self-q4", builtin_model)
    assert drafter.name == "model:self-q4"
    target = make_backend(builtin_model.model, "lean")
    ids = builtin_model.encode("Name three rivers in Europe.")
    expected = SpeculativeEngine(target, None).generate(ids, SamplingParams(),
                                                        SpecConfig(gamma=0, max_new_tokens=24)).run().tokens
    run = SpeculativeEngine(target, drafter).generate(ids, SamplingParams(), SpecConfig(gamma=4, max_new_tokens=24)).run()
    assert run.tokens == expected
    assert run.stats.accepted >= 0.5 * run.stats.drafted > 0
    with pytest.raises(SpecdecError, match="use --weights float"):
        build_drafter("self-q4", builtin_model, target_on_blocks=True)


def test_cli_weights_errors_are_clear(tiny_dirs):
    from test_cli import assert_clean_error, run_cli

    proc = run_cli("generate", "hello", "--target", str(tiny_dirs["target"]), "--weights", "gguf", "--max-new-tokens", "4")
    assert_clean_error(proc, "--weights gguf", "not a GGUF model")
    proc = run_cli("generate", "hello", "--target", str(tiny_dirs["target"]), "--drafter", "self-q4", "--dtype", "bfloat16")
    assert_clean_error(proc, "--drafter self-q4", "Q4_0", "float32 activations", "--dtype auto or float32")
    proc = run_cli("generate", "hello", "--weights", "int3")
    assert_clean_error(proc, "--weights", "int3")
