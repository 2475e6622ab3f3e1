"""The networks of trained drafters, built around a target they borrow from.

All three kinds read tokens through the target's own frozen tables, so what is trained (and saved)
is small:

- input: the target's token embedding (times Gemma's sqrt(d) scale);
- output: a *draft vocabulary* S, the |S| ids the target emits most often, scored by the target's
  own LM-head rows. The draft gives probability 0 outside S, which exact verification allows (such
  tokens are never drafted; the target's residual still produces them). At |S| = 8192 the draft's
  head reads 1/6 of the bytes of SmolLM2's 49152-row head.

Kinds (x = tokens, f = the target's final-norm features, the vector its LM head reads):

- draft-lm: a small causal transformer over x (1-4 layers of width d), logits = norm(h) · W_S.
- eagle: f̂_{t+1} = Layer(fc([f_t ; emb(x_{t+1})])), logits of x_{t+2} = f̂_{t+1} · W_S (EAGLE, Li et
  al. 2024): drafting runs in feature space, feeding its own f̂ back.
- medusa: K heads on f_t, head k giving x_{t+1+k}: f + SiLU(W_k f + b_k), then · W_S (Medusa-1).

Each network runs batched over whole sequences (training) and one sequence with a KV cache written
by position (drafting), through the same code.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..backends.lean import KERNEL_ROWS, rotate

KINDS = ("draft-lm", "eagle", "medusa")


@dataclass
class DraftConfig:
    kind: str
    d_model: int
    """The target's hidden size (the draft works in the same width, so tables are shared)."""
    layers: int = 1
    ffn: int = 1536
    medusa_heads: int = 4
    head_dim: int = 64
    rope_theta: float = 10000.0
    embed_scale: float = 1.0
    softcap: float | None = None
    """The target's final-logit soft cap (Gemma), applied to eagle's logits as the target does."""
    target: dict = field(default_factory=dict)
    """Identity of the target: name, model_type, tokenizer fingerprint, vocab width, hidden size."""
    recipe: dict = field(default_factory=dict)
    """How it was trained: data seed, prompts, steps, minutes, losses (for the record)."""

    @property
    def heads(self) -> int:
        return max(1, self.d_model // self.head_dim)

    def to_dict(self) -> dict:
        return asdict(self)

    @staticmethod
    def from_dict(data: dict) -> "DraftConfig":
        known = {k: v for k, v in data.items() if k in DraftConfig.__dataclass_fields__}
        return DraftConfig(**known)


def head_dim_for(d_model: int) -> int:
    """64 where it divides the width (real models), else a quarter of it (tiny test models)."""
    return 64 if d_model >= 128 and d_model % 64 == 0 else max(1, d_model // 4)


class Rotary:
    """RoPE tables (half-split layout, as Llama), grown on demand."""

    def __init__(self, head_dim: int, theta: float):
        self.head_dim, self.theta = head_dim, theta
        self.cos = self.sin = torch.zeros(0, head_dim)

    def table(self, end: int, dtype: torch.dtype, device) -> tuple[torch.Tensor, torch.Tensor]:
        if self.cos.shape[0] < end or self.cos.dtype != dtype or self.cos.device != device:
            n = max(end, 2 * self.cos.shape[0], 256)
            inv = 1.0 / (self.theta ** (torch.arange(0, self.head_dim, 2, dtype=torch.float32) / self.head_dim))
            angles = torch.outer(torch.arange(n, dtype=torch.float32), inv)
            angles = torch.cat([angles, angles], dim=-1)
            half = self.head_dim // 2
            sin = angles.sin()
            self.cos = angles.cos().to(dtype=dtype, device=device)
            self.sin = torch.cat([-sin[:, :half], sin[:, half:]], dim=-1).to(dtype=dtype, device=device)
        return self.cos[:end], self.sin[:end]


class KVCache:
    """Per-layer keys and values of one sequence, written by position; rollback moves `length`."""

    def __init__(self):
        self.k: list[torch.Tensor] = []
        self.v: list[torch.Tensor] = []
        self.length = 0

    def ensure(self, layers: int, heads: int, head_dim: int, end: int, dtype, device) -> None:
        capacity = self.k[0].shape[1] if self.k else 0
        if end <= capacity:
            return
        new = max(end, 2 * capacity, 256)
        for store in (self.k, self.v):
            for i in range(layers):
                grown = torch.zeros(heads, new, head_dim, dtype=dtype, device=device)
                if i < len(store):
                    grown[:, :capacity] = store[i][:, :capacity]
                    store[i] = grown
                else:
                    store.append(grown)


class Block(nn.Module):
    """A pre-norm decoder layer: RoPE attention and a SwiGLU MLP, fused projections."""

    def __init__(self, d: int, heads: int, head_dim: int, ffn: int):
        super().__init__()
        self.heads, self.head_dim = heads, head_dim
        self.attn_norm = nn.RMSNorm(d, eps=1e-6)
        self.qkv = nn.Linear(d, 3 * heads * head_dim, bias=False)
        self.o = nn.Linear(heads * head_dim, d, bias=False)
        self.mlp_norm = nn.RMSNorm(d, eps=1e-6)
        self.gate_up = nn.Linear(d, 2 * ffn, bias=False)
        self.down = nn.Linear(ffn, d, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: KVCache | None = None,
                layer: int = 0, start: int = 0) -> torch.Tensor:
        """x (B, T, d) at positions start..start+T; with a cache (B = 1) attends to what it holds too."""
        b, t, _ = x.shape
        qkv = self.qkv(self.attn_norm(x)).view(b, t, 3, self.heads, self.head_dim)
        q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))  # (B, H, T, hd)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        if cache is None:
            attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            end = start + t
            cache.k[layer][:, start:end] = k[0]
            cache.v[layer][:, start:end] = v[0]
            keys, values = cache.k[layer][None, :, :end], cache.v[layer][None, :, :end]
            mask = None
            if t > 1:
                mask = torch.arange(end, device=x.device)[None] <= torch.arange(start, end, device=x.device)[:, None]
            attn = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
        x = x + self.o(attn.transpose(1, 2).reshape(b, t, -1))
        gate, up = self.gate_up(self.mlp_norm(x)).chunk(2, dim=-1)
        return x + self.down(F.silu(gate) * up)

    def step(self, kern, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: KVCache, layer: int,
             start: int) -> torch.Tensor:
        """forward() for drafting on the lean backend's kernels.cpp: h (T, d) bf16 at positions
        start.., cos/sin the whole tables from position 0; writes the cache the same way."""
        eps = self.attn_norm.eps
        qkv = kern.linear(kern.rms_norm(h, self.attn_norm.weight, eps), self.qkv.weight)
        attn = kern.attend(qkv, self.heads, self.heads, cos, sin, cache.k[layer], cache.v[layer], start, 0,
                           self.head_dim ** -0.5, None, None, eps)
        h = kern.linear(attn, self.o.weight, h)
        gated = kern.act_mul(kern.linear(kern.rms_norm(h, self.mlp_norm.weight, eps), self.gate_up.weight), False)
        return kern.linear(gated, self.down.weight, h)


class PackedLinear(nn.Module):
    """An nn.Linear with its bfloat16 weight pre-packed for oneDNN, as the lean backend does:
    the same results, about half the time for a one-row product. Inference only."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        self.weight = torch.ops.mkldnn._reorder_linear_weight(weight.detach())
        self.bias = None if bias is None else bias.detach()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "none", [], "")


class DraftNet(nn.Module):
    """One trained drafter's network. `embed` and `head` are the target's (frozen, not saved);
    `vocab` lists the draft vocabulary S (saved)."""

    def __init__(self, config: DraftConfig, vocab: torch.Tensor, embed: torch.Tensor, head: torch.Tensor):
        super().__init__()
        self.config = config
        d = config.d_model
        self.register_buffer("vocab", vocab.long().clone())
        self.register_buffer("embed", embed.detach(), persistent=False)  # (V_in, d)
        self.register_buffer("head", head.detach(), persistent=False)  # (|S|, d): target LM-head rows of S
        self.rotary = Rotary(config.head_dim, config.rope_theta)
        self.head_linear: nn.Module | None = None  # the packed head, after pack()
        self.kernels = None  # kernels.cpp, after use_kernels()
        if config.kind == "draft-lm":
            self.blocks = nn.ModuleList(Block(d, config.heads, config.head_dim, config.ffn) for _ in range(config.layers))
            self.norm = nn.RMSNorm(d, eps=1e-6)
        elif config.kind == "eagle":
            self.fc = nn.Linear(2 * d, d, bias=True)
            self.blocks = nn.ModuleList([Block(d, config.heads, config.head_dim, config.ffn)])
            self.norm = nn.RMSNorm(d, eps=1e-6)
        elif config.kind == "medusa":
            self.medusa = nn.ModuleList(nn.Linear(d, d, bias=True) for _ in range(config.medusa_heads))
            for head in self.medusa:  # start as the identity residual: every head begins as the target's head
                nn.init.zeros_(head.weight)
                nn.init.zeros_(head.bias)
        else:
            raise ValueError(f"unknown drafter kind {config.kind!r}: use one of {', '.join(KINDS)}")

    # -- pieces ---------------------------------------------------------------------------------

    def embed_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        e = self.embed[tokens]
        return e * self.config.embed_scale if self.config.embed_scale != 1.0 else e

    def pack(self) -> "DraftNet":
        """Pre-pack every bfloat16 weight for oneDNN (drafting on CPU; not for training or saving)."""
        for name, module in list(self.named_modules()):
            for child_name, child in list(module.named_children()):
                if isinstance(child, nn.Linear):
                    setattr(module, child_name, PackedLinear(child.weight, child.bias))
        self.head_linear = PackedLinear(self.head, None)
        return self

    def use_kernels(self, kern) -> "DraftNet":
        """Draft (bf16, one sequence, a few positions) on the lean backend's kernels.cpp, as the
        target does: the same arithmetic up to the order of fp32 sums and rounding points."""
        self.kernels = kern
        return self

    def _fast(self, x: torch.Tensor) -> bool:
        """Whether x (1, T, ...) is a drafting step the kernels take."""
        return (self.kernels is not None and x.dtype == torch.bfloat16 and x.dim() == 3 and x.shape[0] == 1
                and x.shape[1] <= KERNEL_ROWS)

    def _dense(self, layer: nn.Linear, x: torch.Tensor) -> torch.Tensor:
        if not self._fast(x):
            return layer(x)
        out = self.kernels.linear(x[0].contiguous(), layer.weight)
        return (out if layer.bias is None else out + layer.bias)[None]

    def _final_norm(self, h: torch.Tensor) -> torch.Tensor:
        if not self._fast(h):
            return self.norm(h)
        return self.kernels.rms_norm(h[0].contiguous(), self.norm.weight, self.norm.eps)[None]

    def _read_head(self, h: torch.Tensor) -> torch.Tensor:
        if self.kernels is not None and h.dtype == torch.bfloat16 and 0 < h.numel() <= KERNEL_ROWS * h.shape[-1]:
            return self.kernels.linear(h.reshape(-1, h.shape[-1]).contiguous(), self.head).view(*h.shape[:-1], -1)
        return self.head_linear(h) if self.head_linear is not None else F.linear(h, self.head)

    def logits(self, features: torch.Tensor) -> torch.Tensor:
        """(..., d) -> (..., |S|) through the target's LM-head rows of S."""
        out = self._read_head(features)
        if self.config.softcap:
            out = torch.tanh(out / self.config.softcap) * self.config.softcap
        return out

    def _run_blocks(self, x: torch.Tensor, cache: KVCache | None, start: int) -> torch.Tensor:
        end = start + x.shape[1]
        cos, sin = self.rotary.table(end, x.dtype, x.device)
        cos, sin = cos[start:end], sin[start:end]
        if cache is not None:
            cache.ensure(len(self.blocks), self.config.heads, self.config.head_dim, end, x.dtype, x.device)
        if cache is not None and self._fast(x):
            table_cos, table_sin = self.rotary.table(end, x.dtype, x.device)
            h = x[0].contiguous()
            for i, block in enumerate(self.blocks):
                h = block.step(self.kernels, h, table_cos, table_sin, cache, i, start)
            cache.length = end
            return h[None]
        for i, block in enumerate(self.blocks):
            x = block(x, cos, sin, cache, i, start)
        if cache is not None:
            cache.length = end
        return x

    # -- the three kinds ------------------------------------------------------------------------

    def lm(self, tokens: torch.Tensor, cache: KVCache | None = None, start: int = 0) -> torch.Tensor:
        """draft-lm: (B, T) tokens -> (B, T, |S|) logits of the next token."""
        h = self._run_blocks(self.embed_tokens(tokens), cache, start)
        return self._read_head(self._final_norm(h))

    def eagle(self, features: torch.Tensor, next_tokens: torch.Tensor, cache: KVCache | None = None,
              start: int = 0) -> torch.Tensor:
        """eagle: (B, T, d) features f_t and (B, T) tokens x_{t+1} -> (B, T, d) predicted f_{t+1}."""
        x = self._dense(self.fc, torch.cat([features, self.embed_tokens(next_tokens)], dim=-1))
        return self._final_norm(self._run_blocks(x, cache, start))

    def medusa_features(self, features: torch.Tensor) -> torch.Tensor:
        """medusa: (..., d) features f_t -> (K, ..., d); head k's output gives x_{t+1+k}'s logits."""
        return torch.stack([features + F.silu(head(features)) for head in self.medusa])
