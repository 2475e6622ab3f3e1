"""A lean forward pass for the Llama, Mistral, Qwen2, Qwen3 and Gemma-3 architectures, on the same weights as
transformers.

Every target step pays Python dispatch across all layers; transformers adds cache bookkeeping,
mask construction and module hooks on top (~45 ms per SmolLM2-135M step here, of which the
weights' memory traffic is ~14 ms). This module does only the arithmetic, the way gpt-fast's
model.py does:

- fused projections: one matmul for Q, K and V, one for the MLP's gate and up;
- a KV cache preallocated (grown by doubling) and written by position, so rollback is free: the
  length moves back and rejected slots are overwritten next round;
- RoPE tables computed once by the model's own rotary module (any rope type it supports);
- in bfloat16, steps of up to KERNEL_ROWS positions (decode, verification) run on kernels.cpp:
  a prefetching AVX-512 BF16 matrix-vector product that streams the weights at memory speed, and
  fused RMSNorm, RoPE + cache write + attention, act*up; nine calls a layer instead of ~30 ops.
  Measured (scripts/bench_step.py): one SmolLM2-135M step 16 ms vs 31 ms on oneDNN's GEMM;
- otherwise (fp32, prefill, no kernels) ATen ops, the weights pre-packed for oneDNN
  (`mkldnn._reorder_linear_weight`: in bf16 bit-identical to F.linear and ~1.8x faster on one row;
  in fp32 1.7x faster on one row, 2-2.5x on 2-8, and row-invariant; see modeling/packing.py);
- no mask at all for one position; for several, one small boolean block (with Gemma-3's sliding
  window where a layer has one).

The layers themselves live in specdec.modeling (shared with the trained drafters); this module
reads a transformers model's weights into them. It must give transformers' logits for the same
weights and dtype (tests/test_lean.py checks it);
architectures it does not know run on the transformers backend instead (`make_backend`).
"""

from __future__ import annotations

import copy
import math
from pathlib import Path

import torch

from ..config import BACKENDS, QUANTISED_WEIGHTS
from ..errors import SpecdecError
from ..modeling import (
    KERNEL_ROWS,
    Arch,
    Decoder,
    LayerWeights,
    RopeTable,
    Segment,
    Taps,
    kernels,
    quant,
    rotary_module_angles,
    rowops,
)
from ..modeling.packing import pack, packed_linear
from .base import Backend, Step
from .compute_path import ComputePath, choose_path
from .gguf import GGUFWeights, QuantisedWeights, choose_weights, quantised_weights

SUPPORTED = ("llama", "mistral", "qwen2", "qwen3", "gemma3_text")
"""transformers' model_type of each architecture the lean path runs: Llama's layer, with a bias on the QKV
projection (Qwen2), per-head q/k norms (Qwen3), sliding windows (Mistral, Qwen2's layer_types), or Gemma-3's."""


def unsupported_reason(model) -> str | None:
    """Why the lean path cannot run `model` (None: it can)."""
    kind = getattr(model.config, "model_type", None)
    if kind not in SUPPORTED:
        return f"the lean backend knows {', '.join(SUPPORTED)}, not {kind!r}"
    act = getattr(model.config, "hidden_activation" if kind == "gemma3_text" else "hidden_act", None)
    if act != ("gelu_pytorch_tanh" if kind == "gemma3_text" else "silu"):
        return f"this {kind} model's activation is {act!r}, which the lean backend does not compute"
    layer = model.model.layers[0]
    if layer.self_attn.o_proj.bias is not None or any(
            getattr(layer.mlp, name).bias is not None for name in ("gate_proj", "up_proj", "down_proj")):
        return f"this {kind} model has biases on its attention output or MLP, which the lean backend does not add"
    return None


def supports(model) -> bool:
    return unsupported_reason(model) is None


class LeanBackend(Backend):
    path = "lean"
    """The compute path's label (ComputePath.label): lean+tiles, lean+kernels, lean, lean+gguf-int8+vnni, ..."""

    def __init__(self, model, use_kernels: bool = True, gguf: Path | GGUFWeights | QuantisedWeights | None = None,
                 int8_activations: bool = False, use_tiles: bool = True, compute: ComputePath | None = None):
        """gguf: the GGUF file `model` was converted from (or its blocks, read), or its own weights quantised
        (QuantisedWeights), which then serve as the linear layers' and LM head's weights (float32 models
        only; see backends/gguf.py);
        compute: the path to run on (compute_path.choose_path); without it the backend asks choose_path
        for one, with int8_activations (multiply the blocks with activations quantised to int8) and
        use_kernels / use_tiles (False: keep off kernels.cpp, or its AMX tiles, e.g. to compare paths)."""
        super().__init__()
        config = model.config
        self.model = model  # the transformers model the weights come from (peers and drafters reuse it)
        self.gemma = config.model_type == "gemma3_text"
        # a GGUF file's model is on the meta device but for its norms: its weights are the file's blocks (gguf_file.py)
        self.device = torch.device("cpu") if model.device.type == "meta" else model.device
        self.dtype = next(model.parameters()).dtype
        self.vocab_size = model.get_output_embeddings().weight.shape[0]
        self.max_length = config.max_position_embeddings
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        attn = model.model.layers[0].self_attn
        self.arch = Arch(n_heads=config.num_attention_heads, n_kv=config.num_key_value_heads, head_dim=head_dim,
                         scale=(config.query_pre_attn_scalar ** -0.5) if self.gemma else 1 / math.sqrt(head_dim),
                         eps=config.rms_norm_eps, gemma=self.gemma,
                         head_norms=not self.gemma and getattr(attn, "q_norm", None) is not None)
        self.softcap = getattr(config, "final_logit_softcapping", None)
        inner = model.model
        if compute is None:
            named = gguf.kind.lower() if isinstance(gguf, QuantisedWeights) else "gguf" if gguf is not None else None
            compute = choose_path(config.model_type, self.dtype, self.device, named, int8_activations, use_kernels,
                                  use_tiles)
        elif (compute.blocks is None) != (gguf is None):
            raise ValueError("a compute path on blocks needs the blocks (gguf), and blocks need a path on them")
        self.compute = compute
        self.path = compute.label
        self.packed, self.tiles = compute.packed, compute.tiles
        kern = kernels.load() if compute.kernels else None
        self._pack_tiles = kern.pack if self.tiles else None  # before the decoder exists: _weight packs with it
        if kern is not None:
            # on tiles every pass is on the one path, prefill included: as many rows as the model holds
            self.fast_rows = config.max_position_embeddings if self.tiles else KERNEL_ROWS
            self.cheap_rows = self.tiles
        self.gguf = None
        if gguf is not None:
            self.gguf = gguf if isinstance(gguf, GGUFWeights | QuantisedWeights) else GGUFWeights.read(Path(gguf))
        # int8 activations on the packed kernels (AVX2, AVX-512 VNNI, AMX-INT8 for many rows): the blocks
        # repacked once here
        self._pack_int8 = compute.repacked_for is not None
        self.params_on_blocks = self.params_total = 0
        linear = packed_linear if self.packed else torch.nn.functional.linear
        with torch.no_grad():
            embed = inner.embed_tokens.weight
            self.embed = self._file().embedding() if embed.is_meta else embed.detach()
            self.embed_scale = (torch.tensor(config.hidden_size ** 0.5, dtype=self.dtype) if self.gemma else None)
            head = model.get_output_embeddings().weight
            self.lm_head = self._weight(head, self.gguf.lm_head() if self.gguf else None,
                                        dense=lambda: self._file().dense_head())
            self.final_norm = self._norm_weight(inner.norm.weight)
            layers = []
            for i, layer in enumerate(inner.layers):
                layers.append(self._layer(layer, i, config))
                self._release_file_pages()
        kinds = sorted({layer.rope for layer in layers})
        rope = RopeTable(rotary_module_angles(inner.rotary_emb, kinds, self.dtype, self.device), self.dtype,
                         self.device, self.max_length)
        step = None
        if self.gguf is not None:
            linear = quant.quant_linear(linear, compute.int8)
            step = quant.layer_step(self.arch, layers, compute.int8)
        rows = rowops.load() if self.dtype == torch.float32 and self.device.type == "cpu" else None
        self.decoder = Decoder(self.arch, layers, rope, linear, kern, rows, step,
                               kernel_rows=None if self.tiles else KERNEL_ROWS,
                               cache_dtype=torch.float16 if compute.half_cache and rows is not None else None)
        self.cache = self.decoder.new_cache(self.max_length)
        self._release_file_pages()
        if self.gguf is not None:
            quant.return_freed_memory()  # the fused copies the packing made and freed

    def _release_file_pages(self) -> None:
        """The blocks were repacked into memory: the file's pages read for them need not stay resident."""
        if self._pack_int8 and isinstance(self.gguf, GGUFWeights) and self.gguf.file is not None:
            self.gguf.file.release_pages()

    def _file(self) -> GGUFWeights:
        """The GGUF file the weights are read from, where the model holds no float weights (a .gguf target)."""
        if not isinstance(self.gguf, GGUFWeights) or self.gguf.file is None:
            raise SpecdecError("this model's weights are a GGUF file's blocks and run on quant.cpp only: "
                               "use --weights auto (or gguf, gguf-int8) and --dtype float32 or auto")
        return self.gguf

    @property
    def kernels(self):
        return self.decoder.kernels

    def numeric_path(self, rows: int) -> str:
        if self.gguf is not None:
            share = self.params_on_blocks / self.params_total
            if self._pack_int8:
                kernels = {"amx": "AVX-512 VNNI, AMX-INT8 for many rows", "vnni": "AVX-512 VNNI",
                           "avx2": "AVX2"}[self.compute.repacked_for]
                return (f"{self._blocks_named()} x int8 activations on quant.cpp ({kernels}; {share:.0%} of the "
                        f"weights){self._cache_named()}")
            activations = "int8" if self.compute.int8 else "float32"
            return (f"{self._blocks_named()} x {activations} activations on quant.cpp ({share:.0%} of the weights)"
                    f"{self._cache_named()}")
        if self.tiles:
            return "kernels.cpp (AMX tiles)"
        if self.kernels is not None and rows <= KERNEL_ROWS:
            return "kernels.cpp"
        return "oneDNN (pre-packed)" if self.packed else "ATen"

    def _cache_named(self) -> str:
        return "; KV cache float16" if self.decoder.cache_dtype == torch.float16 else ""

    def _blocks_named(self) -> str:
        if isinstance(self.gguf, QuantisedWeights):
            return f"{self.gguf.kind} blocks (the float weights quantised at load)"
        return "GGUF blocks"

    def _norm_weight(self, w: torch.Tensor) -> torch.Tensor:
        # Gemma's RMSNorm multiplies by (1 + w) in float32 before casting; Llama's by w after casting.
        return (1.0 + w.detach().float()) if self.gemma else w.detach()

    def _layer(self, layer, index: int, config) -> LayerWeights:
        attn, mlp = layer.self_attn, layer.mlp
        norms = {"attn_in": self._norm_weight(layer.input_layernorm.weight)}
        if self.gemma:
            norms.update(attn_out=self._norm_weight(layer.post_attention_layernorm.weight),
                         mlp_in=self._norm_weight(layer.pre_feedforward_layernorm.weight),
                         mlp_out=self._norm_weight(layer.post_feedforward_layernorm.weight),
                         q=self._norm_weight(attn.q_norm.weight), k=self._norm_weight(attn.k_norm.weight))
            kind = config.layer_types[index]
            window = config.sliding_window if kind == "sliding_attention" else None
        else:
            norms["mlp_in"] = self._norm_weight(layer.post_attention_layernorm.weight)
            if self.arch.head_norms:
                norms.update(q=self._norm_weight(attn.q_norm.weight), k=self._norm_weight(attn.k_norm.weight))
            kind, window = "default", sliding_window(config, index)
        blocks = self.gguf.layer if self.gguf else (lambda *_, **__: None)
        heads = {"q": config.num_attention_heads, "k": config.num_key_value_heads}

        def dense(*parts):  # the float weight of parts the model holds none of (a .gguf target): from the file
            return lambda: torch.cat([self._file().dense_layer(index, p, heads.get(p)) for p in parts])

        qkv = [blocks(index, part, heads[part] if part in heads else None) for part in ("q", "k", "v")]
        gate_up = [blocks(index, part) for part in ("gate", "up")]
        return LayerWeights(
            wqkv=self._weight(torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]), *qkv,
                              dense=dense("q", "k", "v")),
            wo=self._weight(attn.o_proj.weight, blocks(index, "o"), dense=dense("o")),
            wgu=self._weight(torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]), *gate_up, dense=dense("gate", "up")),
            wdown=self._weight(mlp.down_proj.weight, blocks(index, "down"), dense=dense("down")), norms=norms, rope=kind,
            window=window, bqkv=qkv_bias(attn))

    def _weight(self, weight: torch.Tensor, *blocks: quant.QuantWeight | None, dense=None):
        """A matrix as the decoder multiplies it: the GGUF blocks of its parts when every part has
        blocks quant.cpp reads (several parts fused), else the float weight, pre-packed for oneDNN
        where it can be (`dense()` makes it where the model holds none: a .gguf target's other block types)."""
        if self.gguf is not None:
            chosen = quant.fuse(list(blocks)) if blocks and all(b is not None for b in blocks) else None
            self.params_total += weight.numel()
            if chosen is not None and quant.shape(chosen) != tuple(weight.shape):
                raise SpecdecError(f"the GGUF file's blocks hold a {quant.shape(chosen)} matrix where the model has "
                                   f"{tuple(weight.shape)}: it is not the file this model was converted from")
            if chosen is not None:
                self.params_on_blocks += weight.numel()
                return quant.pack_int8(chosen) if self._pack_int8 else chosen
        if weight.is_meta:
            if dense is None:
                raise SpecdecError("a weight of this GGUF model has no blocks the kernels read and no float copy")
            weight = dense()
        if self._pack_tiles is not None:
            return self._pack_tiles(weight)
        return pack(weight) if self.packed else weight.detach().contiguous()

    def _reset(self) -> None:
        self.cache.length = 0  # positions are overwritten; nothing to free

    def _rollback(self, length: int) -> None:
        self.cache.length = length  # rejected slots are overwritten next round

    supports_trees = True
    """Tree passes run where chains of their size run (kernels.cpp attends through the tree's mask)."""

    def _forward_tree(self, ids: torch.Tensor, layout, start: int) -> torch.Tensor:
        return self._forward(ids, start, layout)

    def _keep(self, start: int, slots: list[int]) -> None:
        self.decoder.keep(self.cache, start, slots)

    @torch.inference_mode()
    def _forward(self, ids: torch.Tensor, start: int, tree=None, logits: bool = True) -> torch.Tensor | None:
        taps = Taps(self.hidden_layers) if self.record_hidden and self.hidden_layers else None
        hidden = self.decoder.run(self._embed(ids), start, self.cache, tree, prompt=not logits, taps=taps)
        features = self.decoder.norm(hidden, self.final_norm)
        if taps is not None:
            taps.see(len(self.decoder.layers), features)  # "layer N": the final-norm output, as transformers'
        self._store_hidden(start, features if taps is None else taps.features())
        return self._logits(features) if logits else None

    def append(self, ids: torch.Tensor) -> None:
        self._forward(ids, self.length, logits=False)  # a prompt: no LM head (49152 x 576 a row for SmolLM2)
        self.held.extend(ids.tolist())

    def _embed(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.embed[ids.to(self.device)]  # (n, d)
        return h * self.embed_scale if self.embed_scale is not None else h

    def _logits(self, features: torch.Tensor) -> torch.Tensor:
        logits = self.decoder.project(features, self.lm_head).float()  # (n, V)
        if self.softcap:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits

    can_fork = True

    def fork(self) -> LeanBackend:
        twin = copy.copy(self)  # the weights, RoPE tables and decoder are shared
        Backend.__init__(twin)
        twin.cache = self.decoder.new_cache(self.max_length)
        return twin

    @torch.inference_mode()
    def forward_many(self, work: list[tuple[Backend, Step]]) -> list[torch.Tensor | None]:
        """Several sequences' steps (chains, trees, prompt chunks) in one pass: the linear layers read
        the weights once for all their rows, attention runs per sequence (on ATen; on GGUF blocks, in
        quant.cpp's layer call)."""
        if len(work) < 2:
            return super().forward_many(work)
        from ..modeling.tree import TreeLayout

        segments = [Segment(sequence.cache, sequence.length, step.rows,
                            None if step.parents is None else TreeLayout.of(step.parents), prompt=not step.wants_logits)
                    for sequence, step in work]
        layers = {sequence.hidden_layers for sequence, _ in work if sequence.record_hidden and sequence.hidden_layers}
        if len(layers) > 1:
            raise ValueError(f"the sequences of one pass record different layers' features: {sorted(layers)}")
        taps = Taps(layers.pop()) if layers else None
        h = self.decoder.run_many(self._embed(torch.cat([step.ids for _, step in work])), segments, taps=taps)
        rows = [s.rows for s in segments]
        normed = self.decoder.norm(h, self.final_norm)
        features = normed.split(rows)
        if taps is not None:
            taps.see(len(self.decoder.layers), normed)
        tapped = taps.features().split(rows) if taps is not None else features
        for (sequence, step), segment, part, layer_inputs in zip(work, segments, features, tapped):
            sequence._store_hidden(segment.start, layer_inputs if sequence.hidden_layers else part)
            sequence.held.extend(step.ids.tolist())
        wanted = [i for i, (_, step) in enumerate(work) if step.wants_logits]
        out: list[torch.Tensor | None] = [None] * len(work)
        if wanted:
            logits = self._logits(torch.cat([features[i] for i in wanted]))
            for i, part in zip(wanted, logits.split([segments[i].rows for i in wanted])):
                out[i] = part
        return out


def sliding_window(config, index: int) -> int | None:
    """Layer `index`'s attention window as transformers applies it: by config.layer_types where the config
    has them (Qwen2: "sliding_attention" layers when use_sliding_window), else config.sliding_window on every
    layer (Mistral; None: full attention)."""
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None:
        return config.sliding_window if layer_types[index] == "sliding_attention" else None
    return getattr(config, "sliding_window", None)


def qkv_bias(attn) -> torch.Tensor | None:
    """The Q, K and V projections' biases as one (Qwen2), None where they have none."""
    biases = [attn.q_proj.bias, attn.k_proj.bias, attn.v_proj.bias]
    if all(b is None for b in biases):
        return None
    if any(b is None for b in biases):
        raise SpecdecError("a model whose Q, K and V projections have a bias on some but not all is not supported "
                           "by the lean backend: use --backend transformers")
    return torch.cat([b.detach() for b in biases])


def make_backend(model, prefer: str = "auto", gguf: Path | None = None, int8_activations: bool = False) -> Backend:
    """The lean path for architectures it knows (unless prefer="transformers"), else transformers.
    gguf: read the linear layers' weights from this GGUF file's blocks (lean only; backends/gguf.py),
    with int8 activations if asked."""
    from .hf import TransformersBackend

    if prefer not in BACKENDS:
        raise ValueError(f"unknown backend {prefer!r}: use {', '.join(BACKENDS)}")
    if prefer != "transformers" and supports(model):
        return LeanBackend(model, gguf=gguf, int8_activations=int8_activations)
    if prefer == "lean":
        raise SpecdecError(f"{unsupported_reason(model)}: use --backend transformers")
    return TransformersBackend(model)


def quantised_backend(model, choice: str, dtype: torch.dtype, prefer: str = "auto") -> LeanBackend:
    """The lean backend on `model`'s float weights quantised at load to the blocks `choice` names (config.
    QUANTISED_WEIGHTS: `--weights q8_0` / `q4_0`, and self-q4's drafts for a target without a GGUF file), int8
    activations; or a clear error saying what stands in the way."""
    reason = unsupported_reason(model)
    if reason is not None and prefer != "transformers":
        raise SpecdecError(f"--weights {choice}: {reason}, and only the lean backend runs quantised weights")
    return LeanBackend(model, gguf=quantised_weights(choice, model, dtype, prefer), int8_activations=True)


def target_backend(loaded, prefer: str = "auto", weights: str = "auto", dtype_choice="auto") -> Backend:
    """The backend a LoadedModel target runs on: make_backend's choice, its linear layers on the
    GGUF file's blocks where `weights` (config.WEIGHTS) says so (backends/gguf.choose_weights)."""
    if prefer not in BACKENDS:
        raise ValueError(f"unknown backend {prefer!r}: use {', '.join(BACKENDS)}")
    if getattr(loaded, "blocks_only", False):  # a .gguf target: its weights are the file's blocks, nothing else
        if weights not in ("auto", "gguf", "gguf-int8"):
            raise SpecdecError(f"--weights {weights}: a .gguf target runs on the file's own blocks (--weights auto, gguf "
                               "or gguf-int8); for float or requantised weights give a Hugging Face directory")
        if prefer == "transformers":
            raise SpecdecError("a .gguf target runs on the lean backend (its blocks on quant.cpp): use --backend auto")
        gguf = choose_weights("gguf-int8" if weights == "auto" else weights, loaded.gguf, loaded.dtype, dtype_choice,
                              "lean", asked_by=f"the .gguf target ({weights} weights)")
        return make_backend(loaded.model, "lean", gguf=gguf, int8_activations=weights in ("auto", "gguf-int8"))
    if weights in QUANTISED_WEIGHTS:
        return quantised_backend(loaded.model, weights, loaded.dtype, prefer)
    runs_on = prefer if supports(loaded.model) else "transformers"
    gguf = choose_weights(weights, loaded.gguf, loaded.dtype, dtype_choice, runs_on)
    # auto: int8 activations on the blocks, measured faster at every row count (quant.cpp)
    return make_backend(loaded.model, prefer, gguf=gguf, int8_activations=weights in ("auto", "gguf-int8"))
