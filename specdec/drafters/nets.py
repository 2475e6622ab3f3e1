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
- eagle3 (EAGLE-3, Li et al. 2025; the layout vLLM and SGLang load, see drafters/eagle3_format):
  g_t = fc([a_t ; b_t ; c_t]) from the hidden states entering three target layers (default 2, N/2,
  N-3); one layer whose attention reads [norm(emb(x_{t+1})) ; norm(g_t)] (2d wide) with g_t as
  the residual, giving a pre-norm output h; logits of x_{t+2} = norm(h) · W (its own head over S,
  trained, started from the target's rows); the next draft step feeds h back as g. Trained by
  "training-time test": every unrolled step attends as drafting does (`eagle3_unrolled`).

Each network runs batched over whole sequences (training) and one sequence with a KV cache written
by position (drafting), through the same code.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..modeling import Arch, Decoder, KVCache, LayerWeights, RopeTable, causal_attend, layer_aten, theta_angles
from ..modeling.decoder import attention
from ..modeling.packing import pack, packed_linear
from ..modeling.tree import TreeLayout

KINDS = ("draft-lm", "eagle", "eagle3", "medusa")


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
    attention_heads: int | None = None
    """Query heads (None: d_model // head_dim)."""
    kv_heads: int | None = None
    """Key/value heads (None: as many as query heads)."""
    eps: float = 1e-6
    """RMSNorm's epsilon."""
    aux_layers: list = field(default_factory=list)
    """eagle3: the target layers whose incoming hidden states it reads (0 = the embeddings)."""
    norm_before_residual: bool = False
    """eagle3: the residual is norm(g) rather than g (vLLM's speculators variant; EAGLE-3 and SGLang: False)."""
    max_positions: int = 8192
    """eagle3: the target's context length (written into exported configs)."""
    target: dict = field(default_factory=dict)
    """Identity of the target: name, model_type, tokenizer fingerprint, vocab width, hidden size."""
    recipe: dict = field(default_factory=dict)
    """How it was trained: data seed, prompts, steps, minutes, losses (for the record)."""

    @property
    def heads(self) -> int:
        return self.attention_heads or max(1, self.d_model // self.head_dim)

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
    specdec.modeling runs it, as it runs the target's layers. eagle3's layer (`eagle3=True`) reads
    2d wide into its QKV projection and has a second input norm for the fed-back hidden state."""

    def __init__(self, d: int, heads: int, head_dim: int, ffn: int, kv_heads: int | None = None, eps: float = 1e-6,
                 eagle3: bool = False):
        super().__init__()
        kv_heads = kv_heads or heads
        self.attn_norm = nn.RMSNorm(d, eps=eps)  # eagle3: the embeddings' norm (input_layernorm)
        if eagle3:
            self.hidden_norm = nn.RMSNorm(d, eps=eps)
        self.qkv = nn.Linear(2 * d if eagle3 else d, (heads + 2 * kv_heads) * head_dim, bias=False)
        self.o = nn.Linear(heads * head_dim, d, bias=False)
        self.mlp_norm = nn.RMSNorm(d, eps=eps)
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
        if config.kind == "eagle3":  # its own head over S, trained and saved (started from the target's rows)
            self.head = nn.Parameter(head.detach().clone())
        else:
            self.register_buffer("head", head.detach(), persistent=False)  # (|S|, d): target LM-head rows of S
        self.arch = Arch(n_heads=config.heads, n_kv=config.kv_heads or config.heads, head_dim=config.head_dim,
                         scale=config.head_dim ** -0.5, eps=config.eps)
        self._ropes: dict[tuple, RopeTable] = {}  # by (dtype, device)
        self.packed_head: torch.Tensor | None = None  # after pack()
        self.kernels = None  # kernels.cpp, after use_kernels()
        self.on_blocks: Decoder | None = None  # after use_blocks(): the decoder over int8 blocks
        self._fc_blocks = None  # fc's weight as blocks, after use_blocks()
        if config.kind == "draft-lm":
            self.blocks = nn.ModuleList(Block(d, config.heads, config.head_dim, config.ffn) for _ in range(config.layers))
            self.norm = nn.RMSNorm(d, eps=1e-6)
        elif config.kind == "eagle":
            self.fc = nn.Linear(2 * d, d, bias=True)
            self.blocks = nn.ModuleList(Block(d, config.heads, config.head_dim, config.ffn) for _ in range(config.layers))
            self.norm = nn.RMSNorm(d, eps=1e-6)
        elif config.kind == "eagle3":
            if len(config.aux_layers) < 1:
                raise ValueError("an eagle3 drafter reads at least one target layer: set aux_layers")
            self.fc = nn.Linear(len(config.aux_layers) * d, d, bias=False)
            self.blocks = nn.ModuleList([Block(d, config.heads, config.head_dim, config.ffn, config.kv_heads,
                                               config.eps, eagle3=True)])
            self.norm = nn.RMSNorm(d, eps=config.eps)
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

    @property
    def feature_layers(self) -> tuple[int, ...]:
        """The target features the net reads: () the final-norm ones (eagle, medusa), else the
        hidden states entering these layers (eagle3)."""
        return tuple(self.config.aux_layers) if self.config.kind == "eagle3" else ()

    def use_kernels(self, kern) -> DraftNet:
        """Draft (bf16, one sequence, a few positions) on kernels.cpp, as the target does: the same
        arithmetic up to the order of fp32 sums and rounding points."""
        self.kernels = kern
        return self

    def use_blocks(self, kind: str = "Q8_0") -> DraftNet:
        """Draft (float32, on the CPU) with every matrix as `kind` blocks on quant.cpp, activations
        quantised to int8 per row and group of 32, as the target's GGUF blocks run: one draft token
        reads ~1 byte a weight instead of bf16's 2, and a layer is one call (quant.layer_step).
        Inference only; the draft's numbers are its own (exactness never depends on them: the verifier
        uses the q the tokens were drawn from). Packed where quant.packed_int8() (AVX2 and F16C)."""
        from ..modeling import quant, rowops

        if self.head.dtype != torch.float32 or self.head.device.type != "cpu":
            raise ValueError("drafting on blocks takes a float32 net on the CPU: call .float() first")
        if not self.fits_blocks(kind):
            raise ValueError(f"the net's matrices are not whole {kind} blocks wide: keep its float weights")
        packed = quant.packed_int8()

        def blocks(weight: torch.Tensor):
            w = quant.quantize(weight, kind)
            return quant.pack_int8(w) if packed else w

        layers = []
        for block in getattr(self, "blocks", ()):
            w = block.weights()
            layers.append(LayerWeights(blocks(w.wqkv), blocks(w.wo), blocks(w.wgu), blocks(w.wdown),
                                       norms={name: v.detach() for name, v in w.norms.items()}))
        if hasattr(self, "fc"):  # the one dense layer outside the blocks (_dense)
            self._fc_blocks = blocks(self.fc.weight)
        self.packed_head = blocks(self.head)
        self.on_blocks = Decoder(self.arch, layers, self._rope(), quant.quant_linear(F.linear, int8=True),
                                 rows=rowops.load(), layer_step=quant.layer_step(self.arch, layers, int8=True))
        return self

    def fits_blocks(self, kind: str = "Q8_0") -> bool:
        """Whether every matrix the net drafts with is a whole number of `kind` blocks wide."""
        from ..modeling import quant

        width = quant.block_width(kind)
        return all(p.shape[-1] % width == 0 for p in self.parameters() if p.dim() == 2) \
            and self.head.shape[-1] % width == 0

    def _rope(self) -> RopeTable:
        """The RoPE table in the net's current dtype and device (built once for each)."""
        key = (self.head.dtype, self.head.device)
        if key not in self._ropes:
            self._ropes[key] = RopeTable(theta_angles(self.config.head_dim, self.config.rope_theta), *key)
        return self._ropes[key]

    def decoder(self) -> Decoder:
        """The blocks as a decoder in the net's current dtype and device (cheap: views of the weights)."""
        if self.on_blocks is not None:
            return self.on_blocks
        blocks = getattr(self, "blocks", ())
        return Decoder(self.arch, [block.weights() for block in blocks], self._rope(),
                       packed_linear if self.packed_head is not None else F.linear, self.kernels)

    def new_cache(self) -> KVCache:
        """An empty KV cache for drafting one sequence."""
        return self.decoder().new_cache()

    def _dense(self, layer: nn.Module, x: torch.Tensor, decoder: Decoder) -> torch.Tensor:
        if self._fc_blocks is not None and layer is self.fc:
            return decoder.linear(x, self._fc_blocks, layer.bias)
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
                    tree: TreeLayout | None = None, attn_input: torch.Tensor | None = None) -> torch.Tensor:
        """x (B, T, d) at positions start..: causal within x (training), or (B = 1) over a cache
        (with a tree layout: row i at start + depth, seeing the cache and its ancestors).
        attn_input: what the first layer's attention reads instead of norm(x) (eagle3)."""
        if cache is not None:
            return decoder.run(x[0], start, cache, tree, attn_input=None if attn_input is None else attn_input[0])[None]
        cos, sin = decoder.rope.span("default", start, start + x.shape[1])
        for i, layer in enumerate(decoder.layers):
            x = layer_aten(x, layer, self.arch, cos, sin, decoder.linear, causal_attend(self.arch),
                           attn_input=attn_input if i == 0 else None)
        return x

    # -- the kinds ------------------------------------------------------------------------------

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

    def _eagle3_inputs(self, hidden: torch.Tensor, next_tokens: torch.Tensor, decoder: Decoder
                       ) -> tuple[torch.Tensor, torch.Tensor]:
        """(the residual, what attention reads) for hidden g and the tokens that follow."""
        block = self.blocks[0]
        e = decoder.norm(self.embed_tokens(next_tokens), block.attn_norm.weight)
        g = decoder.norm(hidden, block.hidden_norm.weight)
        return (g if self.config.norm_before_residual else hidden), torch.cat([e, g], dim=-1)

    def eagle3(self, hidden: torch.Tensor, next_tokens: torch.Tensor, cache: KVCache | None = None,
               start: int = 0, tree: TreeLayout | None = None) -> torch.Tensor:
        """eagle3: (B, T, d) hidden g (`features_in` of the target's features, or an earlier step's
        output) and (B, T) tokens x_{t+1} -> (B, T, d) pre-norm output h (`draft_logits` reads it;
        the next step feeds it back as g)."""
        decoder = self.decoder()
        residual, attn_input = self._eagle3_inputs(hidden, next_tokens, decoder)
        return self._run_blocks(residual, cache, start, decoder, tree, attn_input)

    def eagle3_unrolled(self, features: torch.Tensor, tokens: torch.Tensor, steps: int) -> list[torch.Tensor]:
        """Training-time test: features (B, W, k*d) of the target at positions 0..W-1 and the tokens
        (B, W) there -> per step s, (B, W-1-s, |S|) logits: row t of step s drafts x_{t+s+2} on the
        chain that starts from the target's features at t and the tokens x_{t+1}..x_{t+s+1}, and it
        attends exactly as drafting does: to the rows built from the target's features at positions
        <= t (step 0) and to its own chain's rows of steps 1..s (one each), at position t + s."""
        decoder = self.decoder()
        layer, arch = decoder.layers[0], self.arch
        width = tokens.shape[1]
        g = self._dense(self.fc, features[:, :-1], decoder)  # row t: the target's features at t
        keys: list[torch.Tensor] = []
        values: list[torch.Tensor] = []
        out = []
        for s in range(steps):
            rows = width - 1 - s
            if rows <= 0:
                break
            g = g[:, :rows]
            residual, attn_input = self._eagle3_inputs(g, tokens[:, s + 1 : s + 1 + rows], decoder)
            cos, sin = decoder.rope.span("default", s, s + rows)
            mask = torch.cat([torch.ones(rows, rows, dtype=torch.bool, device=g.device).tril()]
                             + [torch.eye(rows, dtype=torch.bool, device=g.device)] * s, dim=1)

            def attend(q, k, v, rows=rows, mask=mask):
                keys.append(k)
                values.append(v)
                return attention(
                    q, torch.cat([x[:, :, :rows] for x in keys], dim=2), torch.cat([x[:, :, :rows] for x in values], dim=2),
                    attn_mask=mask, scale=arch.scale, enable_gqa=arch.n_kv != arch.n_heads)

            g = layer_aten(residual, layer, arch, cos, sin, decoder.linear, attend, attn_input=attn_input)
            out.append(self.draft_logits(g))
        return out

    # -- what the feature-reading drafters call, whatever the kind ----------------------------

    def features_in(self, features: torch.Tensor) -> torch.Tensor:
        """The target's recorded features as the net's first input: eagle3's fc, else themselves
        (in the net's dtype, which may differ from the target's: load_net)."""
        features = features.to(self.head.dtype)
        if self.config.kind != "eagle3":
            return features
        return self._dense(self.fc, features, self.decoder())

    def predict(self, inputs: torch.Tensor, next_tokens: torch.Tensor, cache: KVCache | None = None,
                start: int = 0, tree: TreeLayout | None = None) -> torch.Tensor:
        """One draft step: eagle's predicted feature, or eagle3's pre-norm output."""
        if self.config.kind == "eagle3":
            return self.eagle3(inputs, next_tokens, cache, start, tree)
        return self.eagle(inputs, next_tokens, cache, start, tree)

    def draft_logits(self, state: torch.Tensor) -> torch.Tensor:
        """(..., d) state from `predict` -> (..., |S|) draft logits."""
        if self.config.kind != "eagle3":
            return self.logits(state)
        decoder = self.decoder()
        return decoder.project(decoder.norm(state, self.norm.weight), self._head())

    def medusa_features(self, features: torch.Tensor) -> torch.Tensor:
        """medusa: (..., d) features f_t -> (K, ..., d); head k's output gives x_{t+1+k}'s logits."""
        return torch.stack([features + F.silu(head(features)) for head in self.medusa])
