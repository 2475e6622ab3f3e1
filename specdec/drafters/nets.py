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

from dataclasses import asdict, dataclass, field

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..modeling import Arch, Decoder, KVCache, LayerWeights, RopeTable, causal_attend, layer_aten, theta_angles
from ..modeling.packing import pack, packed_linear
from ..modeling.tree import TreeLayout

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
    def from_dict(data: dict) -> DraftConfig:
        known = {k: v for k, v in data.items() if k in DraftConfig.__dataclass_fields__}
        return DraftConfig(**known)


def head_dim_for(d_model: int) -> int:
    """64 where it divides the width (real models), else a quarter of it (tiny test models)."""
    return 64 if d_model >= 128 and d_model % 64 == 0 else max(1, d_model // 4)


class Block(nn.Module):
    """A pre-norm decoder layer's trainable weights (RoPE attention, SwiGLU MLP, fused projections);
    specdec.modeling runs it, as it runs the target's layers."""

    def __init__(self, d: int, heads: int, head_dim: int, ffn: int):
        super().__init__()
        self.attn_norm = nn.RMSNorm(d, eps=1e-6)
        self.qkv = nn.Linear(d, 3 * heads * head_dim, bias=False)
        self.o = nn.Linear(heads * head_dim, d, bias=False)
        self.mlp_norm = nn.RMSNorm(d, eps=1e-6)
        self.gate_up = nn.Linear(d, 2 * ffn, bias=False)
        self.down = nn.Linear(ffn, d, bias=False)

    def weights(self) -> LayerWeights:
        """The weights as the decoder reads them (pre-packed ones after DraftNet.pack())."""
        return LayerWeights(self.qkv.weight, self.o.weight, self.gate_up.weight, self.down.weight,
                            norms={"attn_in": self.attn_norm.weight, "mlp_in": self.mlp_norm.weight})


class PackedLinear(nn.Module):
    """An nn.Linear with its weight pre-packed for oneDNN, as the lean backend does:
    the same results, about half the time for a one-row product. Inference only."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        self.weight = pack(weight)
        self.bias = None if bias is None else bias.detach()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return packed_linear(x, self.weight, self.bias)


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
        self.arch = Arch(n_heads=config.heads, n_kv=config.heads, head_dim=config.head_dim,
                         scale=config.head_dim ** -0.5, eps=1e-6)
        self._ropes: dict[tuple, RopeTable] = {}  # by (dtype, device)
        self.packed_head: torch.Tensor | None = None  # after pack()
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

    def pack(self) -> DraftNet:
        """Pre-pack every weight (bfloat16 or float32) for oneDNN (drafting on CPU; not for training or saving)."""
        for module in list(self.modules()):
            for child_name, child in list(module.named_children()):
                if isinstance(child, nn.Linear):
                    setattr(module, child_name, PackedLinear(child.weight, child.bias))
        self.packed_head = pack(self.head)
        return self

    def use_kernels(self, kern) -> DraftNet:
        """Draft (bf16, one sequence, a few positions) on kernels.cpp, as the target does: the same
        arithmetic up to the order of fp32 sums and rounding points."""
        self.kernels = kern
        return self

    def decoder(self) -> Decoder:
        """The blocks as a decoder in the net's current dtype and device (cheap: views of the weights)."""
        key = (self.head.dtype, self.head.device)
        if key not in self._ropes:
            self._ropes[key] = RopeTable(theta_angles(self.config.head_dim, self.config.rope_theta), *key)
        blocks = getattr(self, "blocks", ())
        return Decoder(self.arch, [block.weights() for block in blocks], self._ropes[key],
                       packed_linear if self.packed_head is not None else F.linear, self.kernels)

    def new_cache(self) -> KVCache:
        """An empty KV cache for drafting one sequence."""
        return self.decoder().new_cache()

    def _dense(self, layer: nn.Module, x: torch.Tensor, decoder: Decoder) -> torch.Tensor:
        if not decoder.on_kernels(x):
            return layer(x)
        out = self.kernels.linear(x.reshape(-1, x.shape[-1]).contiguous(), layer.weight).view(*x.shape[:-1], -1)
        return out if layer.bias is None else out + layer.bias

    def _head(self) -> torch.Tensor:
        return self.head if self.packed_head is None else self.packed_head

    def logits(self, features: torch.Tensor) -> torch.Tensor:
        """(..., d) -> (..., |S|) through the target's LM-head rows of S."""
        out = self.decoder().project(features, self._head())
        if self.config.softcap:
            out = torch.tanh(out / self.config.softcap) * self.config.softcap
        return out

    def _run_blocks(self, x: torch.Tensor, cache: KVCache | None, start: int, decoder: Decoder,
                    tree: TreeLayout | None = None) -> torch.Tensor:
        """x (B, T, d) at positions start..: causal within x (training), or (B = 1) over a cache
        (with a tree layout: row i at start + depth, seeing the cache and its ancestors)."""
        if cache is not None:
            return decoder.run(x[0], start, cache, tree)[None]
        cos, sin = decoder.rope.span("default", start, start + x.shape[1])
        for layer in decoder.layers:
            x = layer_aten(x, layer, self.arch, cos, sin, decoder.linear, causal_attend(self.arch))
        return x

    # -- the three kinds ------------------------------------------------------------------------

    def lm(self, tokens: torch.Tensor, cache: KVCache | None = None, start: int = 0) -> torch.Tensor:
        """draft-lm: (B, T) tokens -> (B, T, |S|) logits of the next token."""
        decoder = self.decoder()
        h = self._run_blocks(self.embed_tokens(tokens), cache, start, decoder)
        return decoder.project(decoder.norm(h, self.norm.weight), self._head())

    def eagle(self, features: torch.Tensor, next_tokens: torch.Tensor, cache: KVCache | None = None,
              start: int = 0, tree: TreeLayout | None = None) -> torch.Tensor:
        """eagle: (B, T, d) features f_t and (B, T) tokens x_{t+1} -> (B, T, d) predicted f_{t+1}
        (over a cache, the rows may be a token tree: `tree`)."""
        decoder = self.decoder()
        x = self._dense(self.fc, torch.cat([features, self.embed_tokens(next_tokens)], dim=-1), decoder)
        return decoder.norm(self._run_blocks(x, cache, start, decoder, tree), self.norm.weight)

    def medusa_features(self, features: torch.Tensor) -> torch.Tensor:
        """medusa: (..., d) features f_t -> (K, ..., d); head k's output gives x_{t+1+k}'s logits."""
        return torch.stack([features + F.silu(head(features)) for head in self.medusa])
