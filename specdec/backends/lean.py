"""A lean forward pass for the Llama and Gemma-3 architectures, on the same weights as transformers.

Every target step pays Python dispatch across all layers; transformers adds cache bookkeeping,
mask construction and module hooks on top (~45 ms per SmolLM2-135M step here, of which the
weights' memory traffic is ~14 ms). This module does only the arithmetic, the way gpt-fast's
model.py does:

- fused projections: one matmul for Q, K and V, one for the MLP's gate and up;
- a KV cache preallocated (grown by doubling) and written by position, so rollback is free: the
  length moves back and rejected slots are overwritten next round;
- RoPE tables computed once by the model's own rotary module (any rope type it supports);
- bfloat16 weights pre-packed once for oneDNN (`mkldnn._reorder_linear_weight`): measured here,
  a (3072, 576) projection of one row takes 98 us packed vs 182 us through F.linear, with
  bit-identical results;
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

from .base import Backend

SUPPORTED = ("llama", "gemma3_text")


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

    def __init__(self, model):
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
        self.packed = self.dtype == torch.bfloat16 and self.device.type == "cpu" and can_pack()
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
        weight = weight.detach()
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
        features = self._rms(h, self.final_norm)  # (n, d): what the LM head reads
        self._store_hidden(start, features)
        logits = self._linear(features, self.lm_head).float()  # (n, V)
        if self.softcap:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits


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
