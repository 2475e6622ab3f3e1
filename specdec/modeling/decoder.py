"""The decoder layer both the targets (Llama, Mistral, Qwen2, Qwen3, Gemma-3) and the trained drafters are built from.

One layer: RMSNorm -> fused QKV (Qwen2: + bias) -> (Gemma, Qwen3: q/k norms) -> RoPE -> attention -> output projection
(Gemma: norm after) -> residual -> RMSNorm -> fused gate/up -> act(gate)·up -> down (Gemma: norm
after) -> residual. It runs on two paths with the same rounding points as transformers:

- ATen ops, any dtype, any batch and length: training (causal, no cache), prefill, fp32, and bf16
  without the kernels. Linear layers go through a `linear(x, weight)` the owner chooses
  (F.linear, or oneDNN's pre-packed product from `packing`).
- kernels.cpp (bf16): nine calls a layer, streaming the weights at memory speed, for passes of up to
  KERNEL_ROWS positions on AVX-512 BF16 dot products, or of any number (decode, verification, token
  trees, several sequences, prefill) where the weights are packed for AMX tiles. Its numbers do not
  depend on how many positions a pass scores, nor on whether they sit in a chain or a tree.

`Decoder` runs a stack of layers over one or more `KVCache`s and picks the path by the number of
positions.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from .cache import KVCache
from .rope import RopeTable, rotate
from .tree import TreeLayout

if TYPE_CHECKING:
    from .quant import LayerSteps

KERNEL_ROWS = 16
"""Without AMX tiles, steps of up to this many positions run on kernels.cpp (decode and verification);
longer ones (prefill) on ATen's GEMM, which is faster where there is arithmetic to do."""

Linear = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class Arch:
    """What every layer of a model shares."""

    n_heads: int
    n_kv: int
    head_dim: int
    scale: float
    """Attention's query scale (1/sqrt(head_dim), or Gemma's query_pre_attn_scalar^-1/2)."""
    eps: float
    gemma: bool = False
    """Gemma-3's layer: (1 + w) norms in float32, q/k norms, norms after attention and MLP, tanh GELU."""
    head_norms: bool = False
    """Qwen3's RMSNorm over each head of q and k before RoPE (rounded as Llama's norms; Gemma-3 has them too)."""

    @property
    def qk_norm(self) -> bool:
        """Whether q and k are normed per head before RoPE (weights norms["q"], norms["k"])."""
        return self.gemma or self.head_norms

    def act(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(x, approximate="tanh") if self.gemma else F.silu(x)


@dataclass
class LayerWeights:
    wqkv: torch.Tensor  # (Hq*hd + 2*Hkv*hd, d)
    wo: torch.Tensor  # (d, Hq*hd)
    wgu: torch.Tensor  # (2*ffn, d)
    wdown: torch.Tensor  # (d, ffn)
    norms: dict[str, torch.Tensor] = field(default_factory=dict)
    """attn_in and mlp_in; Gemma also q, k, attn_out, mlp_out (its "1 + w" folded in, float32); Qwen3 q, k."""
    rope: str = "default"
    """Which RoPE table ("default", or Gemma's "sliding_attention"/"full_attention")."""
    window: int | None = None
    """Sliding window, None for full attention."""
    bqkv: torch.Tensor | None = None
    """The fused QKV projection's bias (Qwen2), None without one. layer_aten and quant.cpp's layer add it;
    kernels.cpp does not (LeanBackend keeps such models' bf16 passes on ATen)."""


@dataclass
class Segment:
    """One sequence's rows in a pass: `rows` new positions from `start` on, written into `cache`
    (with a tree layout, row i sits at start + depth and sees its ancestors)."""

    cache: KVCache
    start: int
    rows: int
    tree: TreeLayout | None = None
    prompt: bool = False
    """A chunk of a prompt (no logits wanted). Off the GGUF blocks its attention runs on ATen's SDPA,
    faster over many rows than rowops.cpp's, while every pass that produces logits attends on rowops.cpp
    (where it runs), one implementation whatever the row count; on the blocks prompt chunks take the
    layer call too, so a prompt's cache does not depend on how it was cut (int8 activations would turn
    SDPA's last bits into different tokens), and their products take bfloat16 tiles where the CPU has
    AMX (quant.py)."""

    @property
    def end(self) -> int:
        return self.start + self.rows

    def positions(self) -> torch.Tensor:
        return torch.arange(self.start, self.end) if self.tree is None else self.start + self.tree.depth


_NONE = torch.empty(0)  # rowops.cpp's "no norm weight"
_ALL_VISIBLE = torch.empty(0, dtype=torch.bool)  # rowops.cpp's "no mask: every key in range is visible"
_NO_TREE, _NO_MASK = torch.empty(0, dtype=torch.long), torch.empty(0, dtype=torch.bool)  # kernels.cpp's "a chain"


def rms_norm(x: torch.Tensor, weight: torch.Tensor, arch: Arch, rows=None) -> torch.Tensor:
    """RMSNorm rounded as transformers does: Gemma multiplies by (1 + w) in float32 before casting,
    Llama by w after casting. `rows`: rowops.cpp, for float32 rows in one call."""
    if rows is not None and x.dtype == torch.float32 and x.shape[-1] % 8 == 0:
        return rows.rms_norm(x, weight, arch.eps)
    x32 = F.rms_norm(x.float(), x.shape[-1:], eps=arch.eps)
    if arch.gemma:
        return (x32 * weight).to(x.dtype)
    return weight * x32.to(x.dtype)


Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
"""(q (B, Hq, T, hd), k, v (B, Hkv, T, hd)) -> (B, Hq, T, hd): causal attention, or attention
over a cache the new keys are written into."""


def layer_aten(h: torch.Tensor, w: LayerWeights, arch: Arch, cos: torch.Tensor, sin: torch.Tensor,
               linear: Linear, attend: Attend, rows=None, attn_input: torch.Tensor | None = None) -> torch.Tensor:
    """One decoder layer as ATen ops: h (B, T, d) at the positions cos/sin (T, hd) belong to.
    `rows`: rowops.cpp, which does the float32 norms, the q/k norms + RoPE and act(gate)·up one call each.
    `attn_input`: what the QKV projection reads instead of norm(h) (EAGLE-3's first layer:
    [norm(embedding); norm(h)], 2d wide); h stays the residual."""
    b, t, _ = h.shape
    hd = arch.head_dim
    hq, hkv = arch.n_heads * hd, arch.n_kv * hd
    x = rms_norm(h, w.norms["attn_in"], arch, rows) if attn_input is None else attn_input
    qkv = linear(x, w.wqkv)  # (B, T, hq + 2 hkv)
    if w.bqkv is not None:
        qkv = qkv + w.bqkv
    fused = rows is not None and qkv.dtype == torch.float32 and hd % 16 == 0 and qkv.is_contiguous()
    if fused:  # q/k norms and RoPE in place, before the heads are split
        rows.qk_rope_(qkv, cos, sin, arch.n_heads, arch.n_kv, hd, w.norms["q"] if arch.qk_norm else _NONE,
                      w.norms["k"] if arch.qk_norm else _NONE, arch.eps)
    q = qkv[..., :hq].view(b, t, arch.n_heads, hd).transpose(1, 2)  # (B, Hq, T, hd)
    k = qkv[..., hq : hq + hkv].view(b, t, arch.n_kv, hd).transpose(1, 2)  # (B, Hkv, T, hd)
    v = qkv[..., hq + hkv :].view(b, t, arch.n_kv, hd).transpose(1, 2)
    if not fused:
        if arch.qk_norm:
            q, k = rms_norm(q, w.norms["q"], arch), rms_norm(k, w.norms["k"], arch)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
    o = linear(attend(q, k, v).transpose(1, 2).reshape(b, t, hq), w.wo)
    if arch.gemma:
        o = rms_norm(o, w.norms["attn_out"], arch, rows)
    h = h + o
    gu = linear(rms_norm(h, w.norms["mlp_in"], arch, rows), w.wgu)
    if rows is not None and gu.dtype == torch.float32 and gu.shape[-1] % 16 == 0:
        m = linear(rows.act_mul(gu, arch.gemma), w.wdown)  # act(gate) * up in one call
    else:
        gate, up = gu.chunk(2, dim=-1)
        m = linear(arch.act(gate) * up, w.wdown)
    if arch.gemma:
        m = rms_norm(m, w.norms["mlp_out"], arch, rows)
    return h + m


def _split_attend(attends: list[Attend], rows: list[int]) -> Attend:
    """One Attend over rows stacked by segment: each segment's queries, keys and values go to its own."""
    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        parts = zip(attends, q.split(rows, dim=2), k.split(rows, dim=2), v.split(rows, dim=2))
        return torch.cat([one(qi, ki, vi) for one, qi, ki, vi in parts], dim=2)
    return attend


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **options) -> torch.Tensor:
    """F.scaled_dot_product_attention, in float32 under CPU autocast (training in bf16: the CPU's bf16
    attention measured ~4x slower than its float32 one, while the products around it gain)."""
    if q.device.type == "cpu" and torch.is_autocast_enabled("cpu"):
        with torch.autocast("cpu", enabled=False):
            return F.scaled_dot_product_attention(q.float(), k.float(), v.float(), **options)
    return F.scaled_dot_product_attention(q, k, v, **options)


def causal_attend(arch: Arch) -> Attend:
    """Attention within the sequence (training, no cache)."""
    return lambda q, k, v: attention(q, k, v, is_causal=True, scale=arch.scale, enable_gqa=arch.n_kv != arch.n_heads)


@dataclass
class KernelPass:
    """What kernels.cpp's attention needs of a pass's segments, built once a pass: starts, row
    counts, and per window size each segment's tree (positions, first visible slot, mask; empty for
    a chain)."""

    segments: list[Segment]
    tiles: bool = False
    """Attention's scores on AMX tiles too (the weights are on tiles, and head_dim is 64, 128 or 256)."""
    starts: list[int] = field(init=False)
    rows: list[int] = field(init=False)
    trees: dict = field(init=False, default_factory=dict)

    def __post_init__(self):
        self.starts = [s.start for s in self.segments]
        self.rows = [s.rows for s in self.segments]
        self._masks: dict = {}

    def tree_args(self, window: int | None) -> tuple[list, list, list]:
        if window not in self.trees:
            views = [(s.positions(), *visible_slots(s, window, self._masks, key)) if s.tree is not None
                     else (_NO_TREE, 0, _NO_MASK) for key, s in enumerate(self.segments)]
            self.trees[window] = tuple(list(column) for column in zip(*views))
        return self.trees[window]


def layer_kernels(kern, h: torch.Tensor, w: LayerWeights, arch: Arch, rope: RopeTable, work: KernelPass, index: int,
                  attn_input: torch.Tensor | None = None) -> torch.Tensor:
    """One decoder layer on kernels.cpp: h (T, d) bf16 holding each segment's rows in turn; writes
    each segment's keys and values into its cache. The linear layers see all rows at once; attention
    runs per segment (a tree's rows at their depths, seeing their ancestors), all segments in one call.
    attn_input: as layer_aten's."""
    eps, gemma, norms = arch.eps, arch.gemma, w.norms
    x = kern.rms_norm(h, norms["attn_in"], eps) if attn_input is None else attn_input.contiguous()
    qkv = kern.linear(x, w.wqkv)
    cos, sin = rope.full(w.rope)
    positions, los, visibles = work.tree_args(w.window)
    attn = kern.attend_many(qkv, arch.n_heads, arch.n_kv, cos, sin, [s.cache.k[index] for s in work.segments],
                            [s.cache.v[index] for s in work.segments], work.starts, work.rows, w.window or 0,
                            arch.scale, norms.get("q"), norms.get("k"), eps, positions, los, visibles, work.tiles)
    if gemma:
        h = h + kern.rms_norm(kern.linear(attn, w.wo), norms["attn_out"], eps)
    else:
        h = kern.linear(attn, w.wo, h)  # h + attn @ wo.T, rounded as transformers does
    gated = kern.act_mul(kern.linear(kern.rms_norm(h, norms["mlp_in"], eps), w.wgu), gemma)
    if gemma:
        return h + kern.rms_norm(kern.linear(gated, w.wdown), norms["mlp_out"], eps)
    return kern.linear(gated, w.wdown, h)


def visible_slots(segment: Segment, window: int | None, masks: dict, key) -> tuple[int, torch.Tensor | None]:
    """The first cache slot the segment's queries may see, and which of the slots from there each
    sees ((rows, end - lo) bool; None: all, causally); built once per segment (`key`), window and pass."""
    cache, start, end, tree = segment.cache, segment.start, segment.end, segment.tree
    lo = 0 if window is None else max(0, start - window + 1)
    if (key, window) not in masks:
        n = end - start
        if tree is None and n == 1 and (window is None or end - lo <= window):
            masks[key, window] = None
        else:
            positions = segment.positions().to(cache.device)
            q_pos = positions[:, None]  # (n, 1)
            k_pos = torch.cat([torch.arange(lo, start, device=cache.device), positions])[None]
            if tree is None:
                allowed = k_pos <= q_pos
            else:  # the context before the root, then the tree's own rows as the layout allows
                allowed = tree.visible(start - lo).to(cache.device)
            if window is not None:
                allowed &= k_pos > q_pos - window
            masks[key, window] = allowed  # (n, end - lo)
    return lo, masks[key, window]


class Taps:
    """Which layers' inputs a pass also returns (EAGLE-3 reads the target's residual stream where
    it enters layers such as 2, N/2 and N-3; layer 0's input is the embeddings): after the pass,
    `states` holds them by layer index."""

    def __init__(self, layers: tuple[int, ...]):
        if len(set(layers)) != len(layers):
            raise ValueError(f"layers {layers} repeat an index")
        self.layers = tuple(layers)
        self.states: dict[int, torch.Tensor] = {}

    def see(self, index: int, h: torch.Tensor) -> None:
        if index in self.layers:
            self.states[index] = h

    def features(self) -> torch.Tensor:
        """(..., len(layers) * d): the states, concatenated in the order `layers` names them."""
        return torch.cat([self.states[i] for i in self.layers], dim=-1)


class Decoder:
    """A stack of decoder layers run over one sequence's KV cache (or several, `run_many`): on
    kernels.cpp for bf16 passes of up to `kernel_rows` positions when `kernels` is given (any number
    when the weights are AMX tiles), on ATen otherwise."""

    def __init__(self, arch: Arch, layers: list[LayerWeights], rope: RopeTable, linear: Linear = F.linear,
                 kernels=None, rows=None, layer_step: LayerSteps | None = None, kernel_rows: int | None = KERNEL_ROWS,
                 cache_dtype: torch.dtype | None = None):
        """kernels: kernels.cpp (bf16 steps); rows: rowops.cpp (float32 norms and RoPE on ATen passes);
        layer_step: every layer of a pass of one or more sequences in one call with layer_aten's
        arithmetic to the bit (quant.layer_step, on GGUF blocks), taken for every float32 pass it can run;
        kernel_rows: the most rows a pass takes to the kernels (None: any, for weights on AMX tiles,
        whose cost hardly grows with the rows and whose numbers do not depend on them); cache_dtype: what
        the KV cache holds (None: the model's dtype; float16 beside float32 passes, read by rowops.cpp)."""
        self.arch, self.layers, self.rope, self.linear, self.kernels = arch, layers, rope, linear, kernels
        self.rows = rows
        self.cache_dtype = cache_dtype or rope.dtype
        self.layer_step = layer_step if rows is not None else None
        self.kernel_rows = kernel_rows
        # the RoPE tables and attention windows the layers use, each once, and which each layer takes
        self._rope_kinds = sorted({layer.rope for layer in layers})
        self._rope_of = [self._rope_kinds.index(layer.rope) for layer in layers]
        self._windows = list(dict.fromkeys(layer.window for layer in layers))
        self._window_of = [self._windows.index(layer.window) for layer in layers]
        if self.layer_step is not None:  # the tables and windows _run_stack hands it, in this order
            self.layer_step.set_layout(self._rope_of, self._window_of)

    def new_cache(self, max_length: int | None = None) -> KVCache:
        return KVCache(len(self.layers), self.arch.n_kv, self.arch.head_dim, self.cache_dtype, self.rope.device,
                       max_length)

    def on_kernels(self, h: torch.Tensor) -> bool:
        """Whether h (T, d) or (1, T, d) takes the kernels."""
        return (self.kernels is not None and h.dtype == torch.bfloat16
                and (self.kernel_rows is None or h.numel() <= self.kernel_rows * h.shape[-1]))

    def run(self, h: torch.Tensor, start: int, cache: KVCache, tree: TreeLayout | None = None,
            prompt: bool = False, attn_input: torch.Tensor | None = None, taps: Taps | None = None) -> torch.Tensor:
        """h (T, d) at positions start..start+T-1 through every layer; writes their keys and values
        into cache slots start..start+T-1 and sets its length to start + T. With a tree, row i sits
        at position start + depth and sees the cache before `start` and its own ancestors.
        attn_input: what the first layer's QKV projection reads (layer_aten); taps: layer inputs
        to keep."""
        return self.run_many(h, [Segment(cache, start, h.shape[0], tree, prompt)], attn_input, taps)

    def run_many(self, h: torch.Tensor, segments: list[Segment], attn_input: torch.Tensor | None = None,
                 taps: Taps | None = None) -> torch.Tensor:
        """Several sequences in one pass (ATen): h (R, d) holds each segment's rows in turn. The
        linear layers see all R rows at once (one read of the weights for every sequence);
        attention runs per segment over its own cache. Each segment is written into its cache as
        `run` would, and the cache's length set to the segment's end."""
        if sum(s.rows for s in segments) != h.shape[0]:
            raise ValueError(f"the segments hold {sum(s.rows for s in segments)} rows, h has {h.shape[0]}")
        for s in segments:
            s.cache.ensure(s.end)
            self.rope.ensure(s.end)
        if self.on_kernels(h):
            return self._run_kernels(h, segments, attn_input, taps)
        single = len(segments) == 1 and segments[0].tree is None
        positions = None if single else torch.cat([s.positions() for s in segments])  # a chain's: its RoPE span
        masks: dict = {}
        x = h[None]
        # prompt chunks too: their attention then runs per query as a decoding step's does, so a prompt's
        # keys and values do not depend on how it was cut into chunks (SDPA's do, in the last bits: with
        # int8 activations a batched request could then differ from the same request alone)
        if self.layer_step is not None and attn_input is None and h.dtype == torch.float32:
            return self._run_stack(h, segments, positions, single, masks, taps)
        for i, layer in enumerate(self.layers):
            if taps is not None:
                taps.see(i, x[0])
            if single:
                cos, sin = self.rope.span(layer.rope, segments[0].start, segments[0].end)
            else:
                cos, sin = (table[positions.to(table.device)] for table in self.rope.full(layer.rope))
            attends = [self._cached_attend(s, i, layer.window, masks, j) for j, s in enumerate(segments)]
            x = layer_aten(x, layer, self.arch, cos, sin, self.linear, attends[0] if len(attends) == 1
                           else _split_attend(attends, [s.rows for s in segments]), self.rows,
                           attn_input[None] if i == 0 and attn_input is not None else None)
        for s in segments:
            s.cache.length = s.end
        return x[0]

    def _run_stack(self, h: torch.Tensor, segments: list[Segment], positions: torch.Tensor | None, single: bool, masks: dict,
                   taps: Taps | None) -> torch.Tensor:
        """Every layer in one quant.cpp call (LayerSteps): the same numbers as layer_aten, to the bit."""
        tables = []
        for kind in self._rope_kinds:
            if single:
                tables.append(self.rope.span(kind, segments[0].start, segments[0].end))
            else:
                tables.append(tuple(table[positions.to(table.device)] for table in self.rope.full(kind)))
        windows = []
        for window in self._windows:
            seen = []
            for j, s in enumerate(segments):
                lo, mask = visible_slots(s, window, masks, j)
                seen.append((lo, _ALL_VISIBLE if mask is None else mask))
            windows.append(seen)
        wanted = [i for i in taps.layers if i < len(self.layers)] if taps is not None else []
        sequences = [(s.cache, s.start, s.rows, s.prompt) for s in segments]
        out, tapped = self.layer_step.run(h, tables, sequences, windows, wanted)
        for i, state in zip(wanted, tapped):
            taps.see(i, state)
        for s in segments:
            s.cache.length = s.end
        return out

    def _run_kernels(self, h: torch.Tensor, segments: list[Segment], attn_input: torch.Tensor | None,
                     taps: Taps | None) -> torch.Tensor:
        hd = self.arch.head_dim
        work = KernelPass(segments, tiles=self.kernel_rows is None and hd % 64 == 0 and hd <= 256)
        h = h.contiguous()
        for i, layer in enumerate(self.layers):
            if taps is not None:
                taps.see(i, h)
            h = layer_kernels(self.kernels, h, layer, self.arch, self.rope, work, i, attn_input if i == 0 else None)
        for s in segments:
            s.cache.length = s.end
        return h

    def _cached_attend(self, segment: Segment, index: int, window: int | None, masks: dict, key: int) -> Attend:
        """Write the segment's new keys and values at slots start..end-1 of its cache, then attend to
        the slots each query may see: earlier positions within the window, and (in a tree) its
        ancestors. The mask is built once per segment, window size and pass."""
        cache, start, end = segment.cache, segment.start, segment.end
        lo, mask = visible_slots(segment, window, masks, key)
        on_rows = cache.k[index].dtype in (torch.float32, torch.float16)
        rows = self.rows if self.rows is not None and on_rows and not segment.prompt else None

        def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            if rows is not None and q.shape[-1] % 8 == 0:  # the cache writes and attention in one call
                visible = mask if mask is not None else _ALL_VISIBLE
                return rows.attend(q, k, v, cache.k[index], cache.v[index], start, lo, visible,
                                   self.arch.scale).transpose(1, 2)
            cache.k[index][:, start:end] = k[0]
            cache.v[index][:, start:end] = v[0]
            keys, values = cache.k[index][None, :, lo:end], cache.v[index][None, :, lo:end]
            if keys.dtype != q.dtype:  # a float16 cache beside float32 passes: what it holds, widened
                keys, values = keys.to(q.dtype), values.to(q.dtype)
            return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=self.arch.scale,
                                                  enable_gqa=self.arch.n_kv != self.arch.n_heads)
        return attend

    def keep(self, cache: KVCache, start: int, slots: list[int]) -> None:
        """Move the keys and values in `slots` (in order) to slots start.., e.g. a tree's accepted
        path; the cache's length becomes start + len(slots)."""
        if slots and slots != list(range(start, start + len(slots))):
            source = torch.tensor(slots, device=cache.device)
            for store in (cache.k, cache.v):
                for layer in store:
                    layer[:, start : start + len(slots)] = layer[:, source]
        cache.length = start + len(slots)

    def norm(self, h: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """A final RMSNorm of h (T, d) or (B, T, d), on the kernels where the step runs on them."""
        if self.on_kernels(h):
            return self.kernels.rms_norm(h.reshape(-1, h.shape[-1]).contiguous(), weight, self.arch.eps).view(h.shape)
        return rms_norm(h, weight, self.arch, self.rows)

    def project(self, h: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """h @ weight.T (an LM head), on the kernels where the step runs on them."""
        if self.on_kernels(h):
            flat = h.reshape(-1, h.shape[-1]).contiguous()
            return self.kernels.linear(flat, weight).view(*h.shape[:-1], -1)
        return self.linear(h, weight)
