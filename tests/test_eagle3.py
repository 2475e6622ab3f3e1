"""EAGLE-3 drafters: training-time test attends as drafting does, the backends record the same
layer inputs, and the checkpoints vLLM and SGLang load round-trip exactly (export -> import gives
the same drafts and q), with exactly the keys and shapes their loaders read."""

import json

import pytest
import torch

from helpers import save_tiny_model, tiny_llama
from specdec.backends import LeanBackend, TransformersBackend
from specdec.backends.base import Step
from specdec.cli import main
from specdec.config import SamplingParams, SpecConfig
from specdec.decoding.engine import SpeculativeEngine
from specdec.drafters import build_drafter, eagle3_format
from specdec.drafters.checkpoint import save_drafter
from specdec.drafters.eagle import EagleDrafter
from specdec.drafters.nets import DraftConfig, DraftNet
from specdec.drafters.trained import load_net
from specdec.errors import SpecdecError
from specdec.models import load_model, target_identity

PROMPT = [1, 2, 3, 4, 5, 6, 7, 1, 2, 3, 9, 9, 4, 5, 6, 1, 2]


def eagle3_net(target_model, vocab, aux=(0, 1), before=False, seed=0, identity=None) -> DraftNet:
    torch.manual_seed(seed)
    d = target_model.config.hidden_size
    config = DraftConfig("eagle3", d, head_dim=8, ffn=2 * d, kv_heads=2, aux_layers=list(aux),
                         norm_before_residual=before, target=identity or {})
    net = DraftNet(config, vocab, target_model.get_input_embeddings().weight,
                   target_model.get_output_embeddings().weight[vocab]).eval()
    with torch.no_grad():  # norms away from 1, so a swapped norm shows
        for block in net.blocks:
            for norm in (block.attn_norm, block.hidden_norm, block.mlp_norm):
                norm.weight.uniform_(0.5, 1.5)
        net.norm.weight.uniform_(0.5, 1.5)
    return net


@pytest.mark.parametrize("before", [False, True])
def test_training_time_test_attends_as_drafting_does(before):
    """Step s, row t of the unrolled training pass = the s-th draft of a chain drafted from the
    target's features at t, token by token over a KV cache (the rows of steps 1..s seen once each)."""
    net = eagle3_net(tiny_llama(40, seed=0), torch.arange(0, 40, 2), before=before)
    features, tokens = torch.randn(1, 12, 64), torch.randint(0, 40, (1, 12))
    with torch.no_grad():
        unrolled = net.eagle3_unrolled(features, tokens, 3)
        assert [u.shape[1] for u in unrolled] == [11, 10, 9]
        for t in (0, 4, 8):
            cache = net.new_cache()
            h = net.predict(net.features_in(features[:, : t + 1]), tokens[:, 1 : t + 2], cache, 0)[:, -1:]
            for s in range(3):
                torch.testing.assert_close(net.draft_logits(h)[0, 0], unrolled[s][0, t], atol=1e-5, rtol=1e-5)
                if s < 2:
                    h = net.predict(h, tokens[:, t + s + 2 : t + s + 3], cache, t + s + 1)


def test_backends_record_the_same_layer_inputs():
    """The lean backend's taps (chains, trees and batched passes) = transformers' hidden states,
    layer N (3) being the final-norm output in both."""
    target = tiny_llama(40, layers=3, seed=0)
    ids = torch.tensor(PROMPT)
    reference = TransformersBackend(target)
    reference.record_features(True, (2, 0, 3))
    reference.forward(ids)
    lean = LeanBackend(target)
    lean.record_features(True, (2, 0, 3))
    lean.prefill(ids[:-4])
    lean.forward(ids[-4:])
    torch.testing.assert_close(lean.hidden(), reference.hidden(), atol=1e-4, rtol=1e-4)
    assert lean.hidden().shape == (ids.numel(), 96)
    final = LeanBackend(target)
    final.record_features(True)
    final.prefill(ids[:-4])
    final.forward(ids[-4:])
    assert torch.equal(lean.hidden()[:, 64:], final.hidden())  # the final-norm features recorded as layer N
    other = lean.fork()
    other.record_features(True, (2, 0, 3))
    lean.rollback(10)
    lean.forward_many([(lean, Step(ids[10:])), (other, Step(ids))])
    torch.testing.assert_close(lean.hidden(), reference.hidden(), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(other.hidden(), reference.hidden(), atol=1e-4, rtol=1e-4)
    lean.record_features(False)
    assert lean.length == 0 and lean.hidden_layers == () and not lean.record_hidden


@pytest.mark.parametrize("backend", [LeanBackend, TransformersBackend])
def test_greedy_parity_reading_three_layers(backend):
    target = tiny_llama(40, layers=3, seed=0)
    plain = SpeculativeEngine(backend(target)).generate(PROMPT, SamplingParams(), SpecConfig(gamma=0, max_new_tokens=30))
    drafter = EagleDrafter(eagle3_net(target, torch.arange(0, 40, 2), aux=(0, 1, 2)), "test")
    assert drafter.feature_layers == (0, 1, 2)
    engine = SpeculativeEngine(backend(target), drafter)
    run = engine.generate(PROMPT, SamplingParams(), SpecConfig(gamma=3, max_new_tokens=30)).run()
    assert run.tokens == plain.run().tokens and run.stats.drafted > 0


@pytest.fixture(scope="module")
def three_layers(tmp_path_factory):
    """A tiny chat target of three layers and an eagle3 drafter for it reading all three, saved."""
    root = tmp_path_factory.mktemp("eagle3")
    target = load_model(str(save_tiny_model(root / "target", seed=7, layers=3, chat=True)), "float32")
    width = target.model.get_output_embeddings().weight.shape[0]
    vocab = torch.tensor(sorted(set(range(0, width, 3)) | {width - 1}))
    net = eagle3_net(target.model, vocab, aux=(0, 1, 2), identity=target_identity(target))
    return target, save_drafter(net, root / "drafter")


def proposals(drafter, target, prompt, sampling):
    """The tokens a generation makes and every proposal (tokens, q) the drafter made on the way."""
    engine = SpeculativeEngine(LeanBackend(target.model), drafter)
    out = []
    run = engine.generate(prompt, sampling, SpecConfig(gamma=3, max_new_tokens=24, stop_at_eos=False))
    propose = drafter.propose

    def spy(*args, **kwargs):
        proposal = propose(*args, **kwargs)
        out.append((proposal.tokens.clone(), None if proposal.q is None else proposal.q.clone()))
        return proposal
    drafter.propose = spy
    tokens = run.run().tokens
    return tokens, out


@pytest.mark.parametrize("layout", eagle3_format.FORMATS)
def test_export_then_import_drafts_identically(three_layers, tmp_path, layout):
    target, saved = three_layers
    net = eagle3_format.read_saved(saved)
    out = eagle3_format.export(net, tmp_path / layout, layout, verifier="tiny/chat")
    assert eagle3_format.checkpoint_format(out) == layout
    imported = eagle3_format.read(out, target)
    original = load_net(saved, target)
    for name, tensor in original.state_dict().items():
        assert torch.equal(imported.state_dict()[name].float(), tensor.float()), name
    assert imported.config.norm_before_residual == original.config.norm_before_residual
    prompt = target.encode("hello there, how are you")
    for sampling in (SamplingParams(), SamplingParams(temperature=1.0, seed=3)):
        a = proposals(build_drafter(str(saved), target), target, prompt, sampling)
        b = proposals(build_drafter(str(out), target), target, prompt, sampling)
        assert a[0] == b[0] and len(a[1]) == len(b[1]) > 0
        for (ta, qa), (tb, qb) in zip(a[1], b[1]):
            assert torch.equal(ta, tb) and (qa is None) == (qb is None) and (qa is None or torch.equal(qa, qb))


def vllm_parameters(config: dict) -> dict[str, tuple]:
    """The parameters vLLM's Eagle3LlamaForCausalLM builds from an eagle3 config, by the names its
    load_weights maps checkpoint keys to (q/k/v into qkv_proj, gate/up into gate_up_proj)."""
    d, hd = config["hidden_size"], config["head_dim"]
    q, kv, ffn = config["num_attention_heads"] * hd, config["num_key_value_heads"] * hd, config["intermediate_size"]
    layer = "model.layers.0."
    return {
        "model.fc.weight": (d, 3 * config.get("target_hidden_size", d)),
        f"{layer}self_attn.qkv_proj.weight": (q + 2 * kv, 2 * d), f"{layer}self_attn.o_proj.weight": (d, q),
        f"{layer}mlp.gate_up_proj.weight": (2 * ffn, d), f"{layer}mlp.down_proj.weight": (d, ffn),
        f"{layer}input_layernorm.weight": (d,), f"{layer}hidden_norm.weight": (d,),
        f"{layer}post_attention_layernorm.weight": (d,), "model.norm.weight": (d,),
        "lm_head.weight": (config["draft_vocab_size"], d), "draft_id_to_target_id": (config["draft_vocab_size"],),
    }


def vllm_load(tensors: dict[str, torch.Tensor]) -> dict[str, tuple]:
    """vLLM's Eagle3 load_weights renaming, applied to a checkpoint: the parameter each key fills and
    the shape it fills it with (stacked parts summed along the first dimension)."""
    loaded: dict[str, list] = {}
    stacked = {".q_proj": ".qkv_proj", ".k_proj": ".qkv_proj", ".v_proj": ".qkv_proj", ".gate_proj": ".gate_up_proj",
               ".up_proj": ".gate_up_proj"}
    for name, tensor in tensors.items():
        if "t2d" in name:
            continue
        if "d2t" in name:
            name = "draft_id_to_target_id"
        elif "lm_head" not in name:
            name = "model." + name.replace("midlayer.", "layers.0.")
        for part, whole in stacked.items():
            if part in name:
                name = name.replace(part, whole)
                break
        loaded.setdefault(name, []).append(tuple(tensor.shape))
    return {name: (sum(s[0] for s in shapes), *shapes[0][1:]) for name, shapes in loaded.items()}


@pytest.mark.parametrize("layout", eagle3_format.FORMATS)
def test_export_has_exactly_the_keys_and_shapes_the_loaders_read(three_layers, tmp_path, layout):
    from safetensors.torch import load_file

    target, saved = three_layers
    out = eagle3_format.export(eagle3_format.read_saved(saved), tmp_path / layout, layout, verifier="tiny/chat")
    config = json.loads((out / "config.json").read_text())
    tensors = load_file(str(out / "model.safetensors"))
    llama = config if layout == "eagle3" else {**config["transformer_layer_config"], **{
        k: config[k] for k in ("draft_vocab_size", "target_hidden_size")}}
    assert vllm_load(tensors) == vllm_parameters(llama)
    width = target.model.get_output_embeddings().weight.shape[0]
    vocab = torch.arange(tensors["d2t"].numel()) + tensors["d2t"]
    assert tensors["d2t"].dtype == torch.int64 and tensors["t2d"].dtype == torch.bool
    assert tensors["t2d"].shape == (width,) and torch.equal(tensors["t2d"].nonzero()[:, 0], vocab)
    assert config["eagle_aux_hidden_state_layer_ids"] == [0, 1, 2] and config["norm_before_residual"] is False
    assert llama["num_hidden_layers"] == 1 and llama["vocab_size"] == width and llama["tie_word_embeddings"] is False
    if layout == "eagle3":  # what SGLang reads too: the layer under midlayer., no fc bias
        assert config["architectures"] == ["LlamaForCausalLMEagle3"] and any(k.startswith("midlayer.") for k in tensors)
        # SGLang counts the output of layer i (it captures the input of i + 1): one lower than vLLM
        assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [-1, 0, 1] and not config.get("bias")
    else:
        assert config["speculators_model_type"] == "eagle3" and any(k.startswith("layers.0.") for k in tensors)
        method = config["speculators_config"]["proposal_methods"][0]
        assert method["speculative_tokens"] >= 1 and config["speculators_config"]["verifier"]["name_or_path"] == "tiny/chat"


def test_import_refuses_what_it_cannot_run(three_layers, tmp_path):
    target, saved = three_layers
    out = eagle3_format.export(eagle3_format.read_saved(saved), tmp_path / "ok", "eagle3", verifier="tiny/chat")
    config = json.loads((out / "config.json").read_text())
    for change, needle in (({"hidden_size": 64}, "hidden size is 64"), ({"num_hidden_layers": 2}, "layers"),
                           ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "rope scaling"),
                           ({"eagle_aux_hidden_state_layer_ids": [0, 1, 9]}, "layers 0..2"),
                           ({"hidden_act": "gelu"}, "activation")):
        (out / "config.json").write_text(json.dumps({**config, **change}))
        with pytest.raises(SpecdecError, match=needle):
            build_drafter(str(out), target)
    (out / "config.json").write_text(json.dumps(config))
    assert isinstance(build_drafter(str(out), target), EagleDrafter)
    from safetensors.torch import load_file  # EAGLE-3's own checkpoints come as pytorch_model.bin

    torch.save(load_file(str(out / "model.safetensors")), out / "pytorch_model.bin")
    (out / "model.safetensors").unlink()
    assert isinstance(build_drafter(str(out), target), EagleDrafter)
    sglang_only = {k: v for k, v in config.items() if k != "eagle_aux_hidden_state_layer_ids"}
    (out / "config.json").write_text(json.dumps(sglang_only))
    assert build_drafter(str(out), target).feature_layers == (0, 1, 2)  # read as SGLang reads eagle_config


def test_cli_export(three_layers, tmp_path, capsys):
    target, saved = three_layers
    out = tmp_path / "export"
    assert main(["export-drafter", str(saved), "--out", str(out), "--verifier", "tiny/chat"]) == 0
    assert "eagle3 layout" in capsys.readouterr().err
    assert main(["export-drafter", str(saved), "--out", str(out)]) == 1  # not empty
    assert "--overwrite" in capsys.readouterr().err
    medusa = save_drafter(DraftNet(DraftConfig("medusa", 32, head_dim=8, target=target_identity(target)),
                                   torch.arange(4), torch.zeros(4, 32), torch.zeros(4, 32)), tmp_path / "medusa")
    assert main(["export-drafter", str(medusa), "--out", str(tmp_path / "m")]) == 1
    assert "only eagle3 drafters" in capsys.readouterr().err
    two = save_drafter(eagle3_net(target.model, torch.arange(8), aux=(0, 1), identity=target_identity(target)),
                       tmp_path / "two")
    assert main(["export-drafter", str(two), "--out", str(tmp_path / "t")]) == 1
    assert "read exactly three" in capsys.readouterr().err


def test_cli_train_export_and_draft_with_the_export(three_layers, tmp_path, monkeypatch, capsys):
    """train-drafter --kind eagle3 (data with the layers' inputs), export, and generate with the export."""
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    target, _ = three_layers
    out, export = tmp_path / "eagle3", tmp_path / "export"
    common = ["--target", target.name, "--kind", "eagle3", "--steps", "2", "--prompts", "8", "--max-new-tokens", "8",
              "--vocab", "16", "--dtype", "float32"]
    assert main(["train-drafter", *common, "--out", str(out)]) == 0
    config = json.loads((out / "config.json").read_text())
    assert config["kind"] == "eagle3" and config["aux_layers"] == [2, 1, 0]  # 2, N/2, N-3 for N = 3
    assert main(["train-drafter", *common, "--out", str(tmp_path / "bad"), "--aux-layers", "0,3"]) == 1
    assert "0..2" in capsys.readouterr().err
    assert main(["export-drafter", str(out), "--out", str(export), "--format", "speculators"]) == 0
    capsys.readouterr()
    assert main(["generate", "hello", "--target", target.name, "--drafter", str(export), "--dtype", "float32",
                 "--max-new-tokens", "8", "--json", "--compare"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["stats"]["drafter"].startswith("eagle3:") and result["identical"] is True
