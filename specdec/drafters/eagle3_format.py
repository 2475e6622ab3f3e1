"""EAGLE-3 checkpoints as vLLM and SGLang load them: export an eagle3 drafter, import one.

Two layouts, one set of tensors (bfloat16, in `model.safetensors`):

- "eagle3" — EAGLE-3's own layout (SafeAILab's checkpoints), what SGLang's and vLLM's
  `LlamaForCausalLMEagle3` load: the decoder layer's weights under `midlayer.`;
- "speculators" — vLLM's speculators layout (`speculators_model_type: "eagle3"`): the layer under
  `layers.0.`, the Llama sizes in `transformer_layer_config`, the verifier and proposal in
  `speculators_config` (SGLang does not read this one).

Tensors: `fc.weight` (d, 3d_target), the layer's `input_layernorm` (the embeddings' norm),
`hidden_norm`, `self_attn.{q,k,v,o}_proj`, `post_attention_layernorm`, `mlp.{gate,up,down}_proj`,
`norm.weight`, `lm_head.weight` (|S|, d), `d2t` (|S|,) int64 with target id = draft id + d2t[id],
and `t2d` (V,) bool marking the target ids in S. No `embed_tokens`: both servers then share the
target's embedding, as specdec's drafter does.

What the loaders read (vLLM `model_executor/models/llama_eagle3.py` and
`transformers_utils/configs/speculators/`, SGLang `srt/models/llama_eagle3.py`):

- vLLM: `midlayer.` renamed to `layers.0.`, q/k/v and gate/up stacked, `d2t` as
  draft_id_to_target_id, `t2d` skipped, `embed_tokens` optional; config: hidden_size,
  num_attention_heads, num_key_value_heads, head_dim, intermediate_size, hidden_act, rms_norm_eps,
  rope_theta, max_position_embeddings, vocab_size, draft_vocab_size, target_hidden_size,
  norm_before_residual (default False; True in the speculators layout when absent), and the aux
  layers from `eagle_aux_hidden_state_layer_ids` (top level, else in `eagle_config`; default
  2, N/2, N-3; id i is the hidden state entering layer i, 0 = the embeddings).
- SGLang: `midlayer.*`, `fc`, `norm` (with or without a `model.` prefix), q/k/v and gate/up stacked,
  `d2t` as its hot-token map, `t2d` skipped; config: the Llama sizes, draft_vocab_size,
  target_hidden_size, tie_word_embeddings (False), `bias` (the fc's; False). It always takes the
  hidden state before the layer's norm as the residual (norm_before_residual False). Its aux layers
  come from `eagle_config.eagle_aux_hidden_state_layer_ids` only, counted one lower: id i there is
  the *output* of layer i (it captures the input of layer i + 1); default 2, N/2, N-3 as inputs.

So the export writes the layers twice: vLLM's ids at the top level (vLLM reads those first) and
SGLang's (one lower) in `eagle_config`. Import takes the top level as vLLM does, else
`eagle_config` as SGLang does (its trainer, SpecForge, writes them there).

Import maps either layout onto an eagle3 DraftNet for a target whose sizes match, refusing what
this project cannot run as the checkpoint means it (more than one layer, rope scaling, biases,
another activation) with the reason.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from ..errors import SpecdecError
from .checkpoint import WEIGHTS_FILE as SAVED
from .checkpoint import check_vocab, load_state, read_config
from .nets import DraftConfig, DraftNet

FORMATS = ("eagle3", "speculators")
WEIGHTS_FILE = "model.safetensors"
PREFIX = {"eagle3": "midlayer.", "speculators": "layers.0."}
ARCHITECTURES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
                 "qwen3": "Qwen3ForCausalLM", "gemma3_text": "Gemma3ForCausalLM", "gemma3": "Gemma3ForConditionalGeneration"}
"""The verifier's architecture by the target's model_type (the speculators layout names it)."""


def default_aux_layers(num_layers: int) -> list[int]:
    """vLLM's and EAGLE-3's choice: the hidden states entering layers 2, N/2 and N-3."""
    return [2, num_layers // 2, num_layers - 3]


def _read_config(directory: Path) -> dict | None:
    try:
        return json.loads((directory / "config.json").read_text())
    except (OSError, ValueError):
        return None


def checkpoint_format(directory: str | Path) -> str | None:
    """"eagle3" or "speculators" for a directory holding such a checkpoint, else None."""
    directory = Path(directory)
    config = _read_config(directory)
    if not isinstance(config, dict) or not _weights_path(directory):
        return None
    if config.get("speculators_model_type") == "eagle3":
        return "speculators"
    if any("eagle3" in str(a).lower() for a in config.get("architectures") or ()):
        return "eagle3"
    return None


def _weights_path(directory: Path) -> Path | None:
    for name in (WEIGHTS_FILE, "pytorch_model.bin"):
        if (directory / name).is_file():
            return directory / name
    return None


# -- export -----------------------------------------------------------------------------------

def export_tensors(net: DraftNet, layout: str) -> dict[str, torch.Tensor]:
    """The eagle3 net's tensors under the layout's names (bfloat16; d2t int64, t2d bool)."""
    if net.config.kind != "eagle3":
        raise SpecdecError(f"only eagle3 drafters export to the EAGLE-3 layout; this one is {net.config.kind} "
                           "(train one with `specdec train-drafter --kind eagle3`)")
    block, c = net.blocks[0], net.config
    if len(c.aux_layers) != 3:
        raise SpecdecError(f"this drafter reads {len(c.aux_layers)} target layers ({c.aux_layers}); vLLM and SGLang "
                           "read exactly three (their fc is 3 x hidden wide): train it with three --aux-layers")
    hd, heads, kv = c.head_dim, c.heads, c.kv_heads or c.heads
    q, k, v = block.qkv.weight.detach().split([heads * hd, kv * hd, kv * hd])
    gate, up = block.gate_up.weight.detach().chunk(2)
    p = PREFIX[layout]
    weights = {
        "fc.weight": net.fc.weight, f"{p}input_layernorm.weight": block.attn_norm.weight,
        f"{p}hidden_norm.weight": block.hidden_norm.weight, f"{p}self_attn.q_proj.weight": q,
        f"{p}self_attn.k_proj.weight": k, f"{p}self_attn.v_proj.weight": v,
        f"{p}self_attn.o_proj.weight": block.o.weight, f"{p}post_attention_layernorm.weight": block.mlp_norm.weight,
        f"{p}mlp.gate_proj.weight": gate, f"{p}mlp.up_proj.weight": up, f"{p}mlp.down_proj.weight": block.down.weight,
        "norm.weight": net.norm.weight, "lm_head.weight": net.head,
    }
    out = {name: w.detach().to(torch.bfloat16).contiguous().cpu() for name, w in weights.items()}
    vocab = net.vocab.cpu()
    out["d2t"] = (vocab - torch.arange(vocab.numel())).long()
    t2d = torch.zeros(int(c.target["vocab_width"]), dtype=torch.bool)
    t2d[vocab] = True
    out["t2d"] = t2d
    return out


def llama_config(net: DraftNet) -> dict:
    """The Llama sizes of the draft layer, as both loaders read them."""
    c = net.config
    return {
        "model_type": "llama", "hidden_size": c.d_model, "intermediate_size": c.ffn,
        "num_attention_heads": c.heads, "num_key_value_heads": c.kv_heads or c.heads, "head_dim": c.head_dim,
        "num_hidden_layers": 1, "hidden_act": "silu", "rms_norm_eps": c.eps, "rope_theta": c.rope_theta,
        "rope_scaling": None, "max_position_embeddings": c.max_positions, "vocab_size": int(c.target["vocab_width"]),
        "attention_bias": False, "mlp_bias": False, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    }


def export_config(net: DraftNet, layout: str, verifier: str, speculative_tokens: int = 3) -> dict:
    c = net.config
    eagle3 = {"draft_vocab_size": int(net.vocab.numel()), "target_hidden_size": c.d_model,
              "norm_before_residual": c.norm_before_residual, "eagle_aux_hidden_state_layer_ids": list(c.aux_layers)}
    if layout == "eagle3":
        return {"architectures": ["LlamaForCausalLMEagle3"], **llama_config(net), **eagle3,
                "eagle_config": {"eagle_aux_hidden_state_layer_ids": [i - 1 for i in c.aux_layers],  # SGLang's count
                                 "use_aux_hidden_state": True}}
    return {
        "architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3",
        "transformer_layer_config": llama_config(net), **eagle3,
        "speculators_config": {
            "algorithm": "eagle3", "default_proposal_method": "greedy",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": speculative_tokens}],
            "verifier": {"name_or_path": verifier, "architectures": [ARCHITECTURES.get(c.target.get("model_type"),
                                                                                            "LlamaForCausalLM")]},
        },
    }


def export(net: DraftNet, out: str | Path, layout: str, verifier: str) -> Path:
    """Write the eagle3 net as an EAGLE-3 checkpoint in `layout` (FORMATS) to `out`."""
    from safetensors.torch import save_file

    if layout not in FORMATS:
        raise SpecdecError(f"unknown --format {layout!r}: use {' or '.join(FORMATS)}")
    tensors = export_tensors(net, layout)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / WEIGHTS_FILE), metadata={"format": "pt"})
    config = export_config(net, layout, verifier)
    config["specdec"] = {"target": net.config.target, "recipe_summary": {
        k: net.config.recipe.get(k) for k in ("steps_done", "seconds", "unroll", "vocab_size") if k in net.config.recipe}}
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return out


def read_saved(directory: str | Path) -> DraftNet:
    """An eagle3 drafter as `specdec train-drafter` saved it, without its target (exporting needs
    only what is saved: its head is its own; the embedding stays empty)."""
    from safetensors.torch import load_file

    config = read_config(directory)
    if config.kind != "eagle3":
        raise SpecdecError(f"{directory} holds a {config.kind} drafter; only eagle3 drafters export to the EAGLE-3 "
                           "layout (train one with `specdec train-drafter --kind eagle3`)")
    state = load_file(str(Path(directory) / SAVED))
    vocab = check_vocab(state.get("vocab"), int(config.target.get("vocab_width", 0)), Path(directory) / SAVED)
    net = DraftNet(config, vocab, torch.zeros(0, config.d_model), state["head"].float())
    return load_state(net, state, Path(directory) / SAVED).float()


# -- import -----------------------------------------------------------------------------------

def _load_tensors(path: Path) -> dict[str, torch.Tensor]:
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(str(path))
    return torch.load(str(path), map_location="cpu", weights_only=True)


def read(directory: str | Path, target) -> DraftNet:
    """The EAGLE-3 checkpoint in `directory` as an eagle3 DraftNet for `target` (a LoadedModel),
    in float32 on the CPU; a checkpoint made for other sizes, or one using what this project
    cannot run, is refused with the reason."""
    from ..models import target_identity

    directory = Path(directory)
    layout = checkpoint_format(directory)
    if layout is None:
        raise SpecdecError(f"{directory} holds no EAGLE-3 checkpoint (config.json naming LlamaForCausalLMEagle3 or "
                           f"speculators_model_type eagle3, and {WEIGHTS_FILE} or pytorch_model.bin)")
    raw = _read_config(directory)
    config = dict(raw.get("transformer_layer_config") or {}) if layout == "speculators" else dict(raw)
    where = directory / "config.json"
    text = target.model.config.get_text_config()
    d, width, layers = text.hidden_size, target.model.get_output_embeddings().weight.shape[0], text.num_hidden_layers

    def refuse(what: str) -> SpecdecError:
        return SpecdecError(f"{where}: {what}; this EAGLE-3 drafter cannot draft for {target.name!r} here")

    for key, want, what in (("hidden_size", d, "hidden size"), ("target_hidden_size", d, "target hidden size"),
                            ("vocab_size", width, "vocabulary width")):
        have = raw.get(key, config.get(key)) if key == "target_hidden_size" else config.get(key)
        if have is not None and int(have) != want:
            raise refuse(f"its {what} is {have}, the target's {want} (it was made for another model)")
    if int(config.get("num_hidden_layers", 1)) != 1:
        raise refuse(f"it has {config['num_hidden_layers']} layers; specdec runs EAGLE-3 drafters of one layer")
    if (config.get("hidden_act") or "silu") != "silu":
        raise refuse(f"its activation is {config['hidden_act']!r}, not silu")
    scaling = config.get("rope_scaling") or {}
    if scaling and (scaling.get("rope_type") or scaling.get("type")) not in (None, "default"):
        raise refuse(f"it uses rope scaling {scaling}, which specdec's drafter does not implement")
    if config.get("attention_bias") or config.get("mlp_bias") or raw.get("bias"):
        raise refuse("it has bias terms, which specdec's drafter layer does not")
    heads = int(config.get("num_attention_heads") or 0)
    if heads < 1:
        raise refuse("it gives no num_attention_heads")
    head_dim = int(config.get("head_dim") or d // heads)
    aux = raw.get("eagle_aux_hidden_state_layer_ids")  # vLLM's count: the input of layer i
    if not aux:  # SGLang's count: the output of layer i
        sglang = (raw.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
        aux = [int(i) + 1 for i in sglang] if sglang else default_aux_layers(layers)
    if any(not 0 <= int(i) < layers for i in aux):
        raise refuse(f"it reads the target's layers {list(aux)}, but the target has layers 0..{layers - 1}")
    before = raw.get("norm_before_residual", layout == "speculators")  # vLLM's defaults for each layout

    tensors = _load_tensors(_weights_path(directory))
    tensors = {name.removeprefix("model."): t for name, t in tensors.items()}
    p = next((prefix for prefix in ("midlayer.", "layers.0.") if f"{prefix}self_attn.q_proj.weight" in tensors), None)
    needed = ["fc.weight", "norm.weight"] + ([] if p is None else [
        f"{p}{n}.weight" for n in ("input_layernorm", "hidden_norm", "self_attn.q_proj", "self_attn.k_proj",
                                   "self_attn.v_proj", "self_attn.o_proj", "post_attention_layernorm",
                                   "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")])
    missing = [n for n in needed if n not in tensors] + ([] if p else ["midlayer.* (or layers.0.*)"])
    if missing:
        raise refuse(f"its weights lack {', '.join(missing)}")
    draft_size = int(raw.get("draft_vocab_size") or config.get("draft_vocab_size") or width)
    if "d2t" in tensors:
        vocab = torch.arange(tensors["d2t"].numel()) + tensors["d2t"].long()
    elif draft_size == width:
        vocab = torch.arange(width)
    else:
        raise refuse(f"its draft vocabulary has {draft_size} ids but no d2t map to the target's")
    vocab = check_vocab(vocab, width, directory)
    head = tensors.get("lm_head.weight")
    if head is None and draft_size == width:
        head = target.model.get_output_embeddings().weight.detach()  # SGLang's "load lm_head from target"
    if head is None or tuple(head.shape) != (vocab.numel(), d):
        raise refuse(f"its lm_head is {None if head is None else tuple(head.shape)}, not ({vocab.numel()}, {d})")
    embed = tensors.get("embed_tokens.weight")
    if embed is None:
        embed = target.model.get_input_embeddings().weight.detach()
    elif tuple(embed.shape) != tuple(target.model.get_input_embeddings().weight.shape):
        raise refuse(f"its embed_tokens is {tuple(embed.shape)}, the target's "
                     f"{tuple(target.model.get_input_embeddings().weight.shape)}")

    draft = DraftConfig(kind="eagle3", d_model=d, layers=1, ffn=int(config["intermediate_size"]), head_dim=head_dim,
                        attention_heads=heads, kv_heads=int(config.get("num_key_value_heads") or heads),
                        eps=float(config.get("rms_norm_eps", 1e-6)), rope_theta=float(config.get("rope_theta", 10000.0)),
                        aux_layers=[int(i) for i in aux], norm_before_residual=bool(before),
                        max_positions=int(config.get("max_position_embeddings", 8192)),
                        target=target_identity(target), recipe={"imported_from": str(directory), "layout": layout})
    net = DraftNet(draft, vocab, embed.float(), head.float())
    block = net.blocks[0]
    try:
        with torch.no_grad():
            net.fc.weight.copy_(tensors["fc.weight"].float())
            block.attn_norm.weight.copy_(tensors[f"{p}input_layernorm.weight"].float())
            block.hidden_norm.weight.copy_(tensors[f"{p}hidden_norm.weight"].float())
            block.qkv.weight.copy_(torch.cat([tensors[f"{p}self_attn.{n}_proj.weight"].float() for n in "qkv"]))
            block.o.weight.copy_(tensors[f"{p}self_attn.o_proj.weight"].float())
            block.mlp_norm.weight.copy_(tensors[f"{p}post_attention_layernorm.weight"].float())
            block.gate_up.weight.copy_(torch.cat([tensors[f"{p}mlp.{n}_proj.weight"].float() for n in ("gate", "up")]))
            block.down.weight.copy_(tensors[f"{p}mlp.down_proj.weight"].float())
            net.norm.weight.copy_(tensors["norm.weight"].float())
    except RuntimeError as exc:  # a shape that does not match the config
        raise refuse(f"its tensors do not match its config ({exc})") from None
    return net
