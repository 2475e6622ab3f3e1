"""A lean forward pass for the Llama and Gemma-3 architectures, on the same weights as transformers.

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
- otherwise (fp32, prefill, no kernels) ATen ops; without the kernels, bf16 weights are pre-packed
  for oneDNN (`mkldnn._reorder_linear_weight`, bit-identical, ~1.8x faster than F.linear on one row);
- no mask at all for one position; for several, one small boolean block (with Gemma-3's sliding
  window where a layer has one).

It must give transformers' logits for the same weights and dtype (tests/test_lean.py checks it);
architectures it does not know run on the transformers backend instead (`make_backend`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from . import kernels
from .base import Backend

SUPPORTED = ("llama", "gemma3_text")
KERNEL_ROWS = 16
"""Steps of up to this many positions run on kernels.cpp (decode and verification); longer ones
(prefill) on ATen's GEMM, which is faster where there is arithmetic to do."""


@dataclass
class _Layer:
    wqkv: torch.Tensor  # (Hq*hd + 2*Hkv*hd, d)
    wo: torch.Tensor  # (d, Hq*hd)
    wgu: torch.Tensor  # (2*ffn, d)
    wdown: torch.Tensor  # (d, ffn)
    norms: dict  # name -> weight (Gemma's "1 + w" already folded in)
    rope: str  # which RoPE table ("default", or Gemma's "sliding_attention"/"full_attention")
    window: int | None  # sliding window, None for full attention


def can_pack() -> bool:
    """Whether this torch build has oneDNN's pre-packed linear (CPU builds with mkldnn do)."""
    try:
        weight = torch.ops.mkldnn._reorder_linear_weight(torch.zeros(8, 8, dtype=torch.bfloat16))
        torch.ops.mkldnn._linear_pointwise(torch.zeros(1, 8, dtype=torch.bfloat16), weight, None, "none", [], "")
        return True
    except (AttributeError, RuntimeError):
        return False


def rotate(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """RoPE: x·cos + rotate_half(x)·sin, with rotate_half's minus already in signed_sin."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((x[..., half:], x[..., :half]), dim=-1) * signed_sin


def supports(model) -> bool:
    return getattr(model.config, "model_type", None) in SUPPORTED


class LeanBackend(Backend):
    path = "lean"
    """"lean+kernels" when the bf16 steps run on kernels.cpp, "lean" when on oneDNN (fp32, or no kernels)."""

    def __init__(self, model, use_kernels: bool = True):
        super().__init__()
        config = model.config
        self.model = model  # the transformers model the weights come from (peers and drafters reuse it)
        self.model_type = config.model_type
        self.gemma = self.model_type == "gemma3_text"
        self.device = model.device
        self.dtype = next(model.parameters()).dtype
        self.vocab_size = model.get_output_embeddings().weight.shape[0]
        self.max_length = config.max_position_embeddings
        self.eps = config.rms_norm_eps
        self.n_heads, self.n_kv = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.scale = (config.query_pre_attn_scalar ** -0.5) if self.gemma else 1 / math.sqrt(self.head_dim)
        self.softcap = getattr(config, "final_logit_softcapping", None)
        self.act = (lambda x: F.gelu(x, approximate="tanh")) if self.gemma else F.silu
        inner = model.model
        bf16_cpu = self.dtype == torch.bfloat16 and self.device.type == "cpu"
        self.kernels = kernels.load() if bf16_cpu and use_kernels else None
        self.packed = bf16_cpu and self.kernels is None and can_pack()
        if self.kernels is not None:
            self.path = "lean+kernels"
            self.fast_rows = KERNEL_ROWS
        with torch.no_grad():
            self.embed = inner.embed_tokens.weight.detach()
            self.embed_scale = (torch.tensor(config.hidden_size ** 0.5, dtype=self.dtype) if self.gemma else None)
            self.lm_head = self._pack(model.get_output_embeddings().weight)
            self.final_norm = self._norm_weight(inner.norm.weight)
            self.layers = [self._layer(layer, i, config) for i, layer in enumerate(inner.layers)]
        self._rotary = inner.rotary_emb
        self._rope_kinds = sorted({layer.rope for layer in self.layers})
        self._rope: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        self._capacity = 0
        self.k_cache: list[torch.Tensor] = []
        self.v_cache: list[torch.Tensor] = []

    def numeric_path(self, rows: int) -> str:
        if self.kernels is not None and rows <= KERNEL_ROWS:
            return "kernels.cpp"
        return "oneDNN (pre-packed)" if self.packed else "ATen"

    def _norm_weight(self, w: torch.Tensor) -> torch.Tensor:
        # Gemma's RMSNorm multiplies by (1 + w) in float32 before casting; Llama's by w after casting.
        return (1.0 + w.detach().float()) if self.gemma else w.detach()

    def _layer(self, layer, index: int, config) -> _Layer:
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
            kind, window = "default", None
        return _Layer(
            wqkv=self._pack(torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight])),
            wo=self._pack(attn.o_proj.weight),
            wgu=self._pack(torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight])),
            wdown=self._pack(mlp.down_proj.weight), norms=norms, rope=kind, window=window)

    def _pack(self, weight: torch.Tensor) -> torch.Tensor:
        weight = weight.detach().contiguous()
        return torch.ops.mkldnn._reorder_linear_weight(weight) if self.packed else weight

    def _linear(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """x @ weight.T, through oneDNN's pre-packed kernel when the weights were packed."""
        if self.packed:
            return torch.ops.mkldnn._linear_pointwise(x, weight, None, "none", [], "")
        return F.linear(x, weight)

    def _rms(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        x32 = F.rms_norm(x.float(), x.shape[-1:], eps=self.eps)  # x * rsqrt(mean(x^2) + eps) in float32
        if self.gemma:
            return (x32 * weight).to(x.dtype)
        return weight * x32.to(x.dtype)

    def _ensure(self, length: int) -> None:
        """Grow the KV cache and RoPE tables (by doubling) to hold `length` positions."""
        if length <= self._capacity:
            return
        capacity = min(max(length, 2 * self._capacity, 256), self.max_length or length)
        positions = torch.arange(capacity, device=self.device)[None]
        probe = torch.zeros(1, dtype=self.dtype, device=self.device)
        for kind in self._rope_kinds:
            cos, sin = (self._rotary(probe, positions) if kind == "default" else self._rotary(probe, positions, kind))
            half = sin.shape[-1] // 2
            signed_sin = torch.cat([-sin[0, :, :half], sin[0, :, half:]], dim=-1)  # folds rotate_half's minus in
            self._rope[kind] = (cos[0], signed_sin)  # (capacity, hd)
        shape = (self.n_kv, capacity, self.head_dim)
        old = self._capacity
        new_k = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in self.layers]
        new_v = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in self.layers]
        for i in range(len(self.k_cache)):
            new_k[i][:, :old] = self.k_cache[i][:, :old]
            new_v[i][:, :old] = self.v_cache[i][:, :old]
        self.k_cache, self.v_cache, self._capacity = new_k, new_v, capacity

    def _reset(self) -> None:
        pass  # positions are overwritten; nothing to free

    def _rollback(self, length: int) -> None:
        pass  # the length moves back (Backend.held); rejected slots are overwritten next round

    @torch.inference_mode()
    def _forward(self, ids: torch.Tensor, start: int) -> torch.Tensor:
        n, end = ids.shape[0], start + ids.shape[0]
        self._ensure(end)
        h = self.embed[ids.to(self.device)]  # (n, d)
        if self.embed_scale is not None:
            h = h * self.embed_scale
        on_kernels = self.kernels is not None and n <= KERNEL_ROWS
        features = self._layers_on_kernels(h, start) if on_kernels else self._layers_on_aten(h, start, end)
        self._store_hidden(start, features)
        lm_head = self.kernels.linear(features, self.lm_head) if on_kernels else self._linear(features, self.lm_head)
        logits = lm_head.float()  # (n, V)
        if self.softcap:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits

    def _layers_on_kernels(self, h: torch.Tensor, start: int) -> torch.Tensor:
        """The decoder layers on kernels.cpp: nine calls a layer, bf16. Returns the final-norm features."""
        kern, eps, gemma = self.kernels, self.eps, self.gemma
        for i, layer in enumerate(self.layers):
            norms = layer.norms
            qkv = kern.linear(kern.rms_norm(h, norms["attn_in"], eps), layer.wqkv)
            cos, sin = self._rope[layer.rope]
            attn = kern.attend(qkv, self.n_heads, self.n_kv, cos, sin, self.k_cache[i], self.v_cache[i], start,
                               layer.window or 0, self.scale, norms.get("q"), norms.get("k"), eps)
            if gemma:
                h = h + kern.rms_norm(kern.linear(attn, layer.wo), norms["attn_out"], eps)
            else:
                h = kern.linear(attn, layer.wo, h)  # h + attn @ wo.T, rounded as transformers does
            gated = kern.act_mul(kern.linear(kern.rms_norm(h, norms["mlp_in"], eps), layer.wgu), gemma)
            if gemma:
                h = h + kern.rms_norm(kern.linear(gated, layer.wdown), norms["mlp_out"], eps)
            else:
                h = kern.linear(gated, layer.wdown, h)
        return kern.rms_norm(h, self.final_norm, eps)

    def _layers_on_aten(self, h: torch.Tensor, start: int, end: int) -> torch.Tensor:
        """The decoder layers as ATen ops (any dtype, any number of positions). Returns the final-norm features."""
        n = end - start
        rope = {kind: (cos[start:end], sin[start:end]) for kind, (cos, sin) in self._rope.items()}  # (n, hd)
        q_pos = torch.arange(start, end, device=self.device)[:, None]  # (n, 1)
        masks: dict = {}
        hq, hkv, hd = self.n_heads * self.head_dim, self.n_kv * self.head_dim, self.head_dim
        for i, layer in enumerate(self.layers):
            lo = 0 if layer.window is None else max(0, start - layer.window + 1)
            if layer.window not in masks:
                if n == 1 and (layer.window is None or end - lo <= layer.window):
                    masks[layer.window] = None
                else:
                    k_pos = torch.arange(lo, end, device=self.device)[None]  # (1, end - lo)
                    allowed = k_pos <= q_pos
                    if layer.window is not None:
                        allowed &= k_pos > q_pos - layer.window
                    masks[layer.window] = allowed  # (n, end - lo)
            x = self._rms(h, layer.norms["attn_in"])
            qkv = self._linear(x, layer.wqkv)  # (n, hq + 2 hkv)
            q = qkv[:, :hq].view(n, self.n_heads, hd).transpose(0, 1)  # (Hq, n, hd)
            k = qkv[:, hq : hq + hkv].view(n, self.n_kv, hd).transpose(0, 1)  # (Hkv, n, hd)
            v = qkv[:, hq + hkv :].view(n, self.n_kv, hd).transpose(0, 1)
            if self.gemma:
                q, k = self._rms(q, layer.norms["q"]), self._rms(k, layer.norms["k"])
            cos, sin = rope[layer.rope]
            q, k = rotate(q, cos, sin), rotate(k, cos, sin)
            self.k_cache[i][:, start:end] = k
            self.v_cache[i][:, start:end] = v
            keys, values = self.k_cache[i][:, lo:end], self.v_cache[i][:, lo:end]  # (Hkv, end - lo, hd)
            attn = F.scaled_dot_product_attention(q[None], keys[None], values[None], attn_mask=masks[layer.window],
                                                  scale=self.scale, enable_gqa=True)  # (1, Hq, n, hd)
            o = self._linear(attn[0].transpose(0, 1).reshape(n, hq), layer.wo)  # (n, d)
            if self.gemma:
                o = self._rms(o, layer.norms["attn_out"])
            h = h + o
            x = self._rms(h, layer.norms["mlp_in"])
            gate, up = self._linear(x, layer.wgu).chunk(2, dim=-1)
            m = self._linear(self.act(gate) * up, layer.wdown)
            if self.gemma:
                m = self._rms(m, layer.norms["mlp_out"])
            h = h + m
        return self._rms(h, self.final_norm)  # (n, d): what the LM head reads


def make_backend(model, prefer: str = "auto") -> Backend:
    """The lean path for architectures it knows (unless prefer="transformers"), else transformers."""
    from .hf import TransformersBackend

    if prefer not in ("auto", "lean", "transformers"):
        raise ValueError(f"unknown backend {prefer!r}: use auto, lean or transformers")
    if prefer != "transformers" and supports(model):
        return LeanBackend(model)
    if prefer == "lean":
        from ..errors import SpecdecError

        raise SpecdecError(f"the lean backend knows {', '.join(SUPPORTED)}, not {model.config.model_type!r}: "
                           "use --backend transformers")
    return TransformersBackend(model)
