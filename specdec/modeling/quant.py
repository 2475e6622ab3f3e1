"""A GGUF file's own quantised weights as the lean backend's linear layers (quant.cpp).

`QuantWeight` holds a weight matrix as the file's blocks (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K: ggml's
layouts, each row its blocks back to back); `quant_linear` multiplies float32 activations with it, unpacking the
blocks in registers, and passes any other weight (a packed or plain float tensor) to the float path.
A fused projection whose parts have different block types (Gemma's Q5_0 q/k beside a Q8_0 v) is a
`QuantParts`: each part multiplied on its own, the outputs side by side.

The kernels need AVX2, FMA and F16C (quant.cpp); `load()` returns None elsewhere and `unavailable_reason()`
says why. SPECDEC_QUANT=0 turns them off.

With int8 activations, `pack_int8` rewrites each matrix once at load into the layout of quant.cpp's
packed kernels (codes in VNNI order per 16 output rows and group): vpdpbusd for up to 24 rows where the
CPU has AVX-512 VNNI, AMX-INT8 tiles for more where it has them, vpmaddubsw on AVX2 elsewhere, the same
numbers on each (`packed_isa()` says which runs); SPECDEC_QUANT_PACKED=0 keeps the unpacked AVX2 int8
kernels. A prompt's rows (a pass
that wants no logits) of packed blocks take AMX-BF16 tiles where the CPU has them: the matrix dequantised
to bfloat16 once a call, the rows rounded to bfloat16, float sums over all of K (the int8 tiles are bound
by their per-group float steps over hundreds of rows); every prompt row takes them whatever the chunk, so
a prompt's cache does not depend on how it was cut.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path
from types import ModuleType

import numpy as np
import torch

from .extension import Extension

KINDS = {"Q4_0": 2, "Q4_1": 3, "Q5_0": 6, "Q5_1": 7, "Q8_0": 8, "Q4_K": 12, "Q5_K": 13, "Q6_K": 14}
"""The ggml block types the kernels read, by name and type id."""
FLOAT_KINDS = {"F16": 1, "BF16": 30}
"""The unquantised matrix types the kernels also read (blocks/half_products.cpp: 2 bytes a weight, float32
activations whatever the int8 setting; rows a multiple of 8 weights)."""


def _configure(module: ModuleType) -> None:
    if os.environ.get("SPECDEC_VNNI", "1") == "0":
        module.set_vnni(False)


_extension = Extension(Path(__file__).with_name("quant.cpp"), needs="AVX2, FMA and F16C", off_variable="SPECDEC_QUANT",
                       fallback="GGUF targets run on their dequantised float weights instead.",
                       others=tuple(sorted((Path(__file__).parent / "blocks").glob("*.cpp"))), configure=_configure)


def load() -> ModuleType | None:
    """The compiled kernels, building them on first use; None where they cannot run here.
    SPECDEC_VNNI=0 keeps the packed products on AVX2 where the CPU has AVX-512 VNNI (an AVX2 host's path,
    to compare or reproduce it)."""
    return _extension.load()


def unavailable_reason() -> str | None:
    return _extension.reason


def packed_int8() -> bool:
    """Whether int8 activations run on the packed kernels here (AVX2 and F16C; vpdpbusd where the CPU has
    AVX-512 VNNI, AMX-INT8 for many rows where it has that)."""
    module = load()
    return module is not None and module.packed_supported() and os.environ.get("SPECDEC_QUANT_PACKED", "1") != "0"


def amx_int8() -> bool:
    """Whether the packed kernels take many rows on AMX-INT8 tiles here."""
    return packed_int8() and load().vnni() and load().amx_int8()


def packed_isa() -> str | None:
    """The instructions the packed kernels multiply with here: "amx" (AMX-INT8 for many rows, vpdpbusd for
    few), "vnni" (vpdpbusd), "avx2" (vpmaddubsw); None where they do not run."""
    if not packed_int8():
        return None
    return "amx" if amx_int8() else "vnni" if load().vnni() else "avx2"


@dataclass(frozen=True)
class QuantWeight:
    """An (out_features, in_features) weight as GGUF blocks: uint8 (out_features, bytes of a row's
    blocks), `kind` the ggml type id (KINDS); packed: the blocks in pack_int8's layout instead,
    (out_features / 16, bytes of 16 rows)."""

    blocks: torch.Tensor
    kind: int
    in_features: int
    packed: bool = False

    @property
    def out_features(self) -> int:
        return self.blocks.shape[0] * (16 if self.packed else 1)

    @cached_property
    def code(self) -> int:
        """The kind as quant.cpp's linear and stack_steps take it (the packed flag set for packed blocks);
        asked once a weight, not on every product."""
        return self.kind | load().packed_flag() if self.packed else self.kind

    def rows(self, index: torch.Tensor) -> QuantWeight:
        """The weight with its output rows taken in `index`'s order (whole rows of blocks)."""
        if self.packed:
            raise ValueError("packed blocks keep their row order: take rows before pack_int8")
        return QuantWeight(self.blocks[index].contiguous(), self.kind, self.in_features)


@dataclass(frozen=True)
class QuantParts:
    """A fused projection whose parts are quantised differently: outputs concatenated in order."""

    parts: tuple[QuantWeight, ...]


def fuse(weights: list[QuantWeight]) -> QuantWeight | QuantParts:
    """One weight whose rows are `weights`' rows in order (one kernel call when the block types agree)."""
    if len({(w.kind, w.in_features) for w in weights}) == 1:
        return QuantWeight(torch.cat([w.blocks for w in weights]).contiguous(), weights[0].kind, weights[0].in_features)
    return QuantParts(tuple(weights))


def pack_int8(w: QuantWeight | QuantParts) -> QuantWeight | QuantParts:
    """The weight in the packed kernels' layout (each part of a QuantParts), where its output rows are
    a multiple of 16; else as it is (the AVX2 int8 kernels take it)."""
    if isinstance(w, QuantParts):
        return QuantParts(tuple(pack_int8(part) for part in w.parts))
    if w.packed or w.out_features % 16 or w.kind in FLOAT_KINDS.values():
        return w
    return replace(w, blocks=load().pack_int8(w.blocks, w.kind, w.in_features), packed=True)


def shape(w: QuantWeight | QuantParts) -> tuple[int, int]:
    """(out_features, in_features) of the matrix the blocks stand for."""
    parts = w.parts if isinstance(w, QuantParts) else (w,)
    return sum(p.out_features for p in parts), parts[0].in_features


def quant_linear(fallback: Callable, int8: bool = False) -> Callable:
    """A linear(x, w) that runs GGUF weights on the kernels and hands anything else to `fallback`.
    int8: quantise the activations per row and group of 32 to int8 (llama.cpp's Q8 dot products:
    integer products, faster, and no longer the float model's exact weights times exact activations)."""
    module = load()

    def linear(x: torch.Tensor, w, bias: torch.Tensor | None = None) -> torch.Tensor:
        if isinstance(w, QuantWeight):
            out = module.linear(x, w.blocks, w.code, w.in_features, int8)
        elif isinstance(w, QuantParts):
            out = torch.cat([module.linear(x, part.blocks, part.code, part.in_features, int8) for part in w.parts],
                            dim=-1)
        else:
            return fallback(x, w, bias)
        return out if bias is None else out + bias

    return linear


_EMPTY = torch.empty(0)


class LayerSteps:
    """The decoder layers on GGUF blocks, every layer of a pass of one or more sequences in one call
    (quant.cpp's stack_steps, each layer layer_steps: layer_aten's arithmetic with rowops.cpp, to the
    bit). The weights and the model's shapes are handed to the C++ side once, here; each sequence's caches
    once per cache storage (KVCache.bound)."""

    def __init__(self, module, arch, held: list, int8: bool):
        self.module, self.arch, self.int8 = module, arch, int8
        self.stack = module.LayerStack([b for b, _, _, _ in held], [k for _, k, _, _ in held], [n for _, _, n, _ in held],
                                       [bias for _, _, _, bias in held], arch.n_heads, arch.n_kv, arch.head_dim, arch.eps,
                                       arch.scale, arch.gemma, int8)

    def set_layout(self, rope_of: list[int], window_of: list[int]) -> None:
        """Which of run's RoPE tables (rope_of[i]) and attention windows (window_of[i]) layer i takes; set
        once, by the decoder that runs the layers."""
        self.stack.set_layout(rope_of, window_of)

    def run(self, h: torch.Tensor, tables: list[tuple[torch.Tensor, torch.Tensor]], sequences: list[tuple],
            windows: list[list[tuple[int, torch.Tensor]]], taps: list[int]) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """h (T, d), each sequence's rows in turn, through every layer. tables: (cos, sin) at each row's
        position for each RoPE table; sequences: (KVCache, start, rows, prompt) each (prompt: a prompt
        chunk, no logits wanted); windows: for each attention window, (lo, visible) per sequence (which
        table and window each layer takes: set_layout); taps: layers whose inputs to return too. Returns h
        after the last layer and the tapped inputs in the order asked."""
        make = self.module.SequenceCaches
        caches = [cache.bound(make) for cache, _, _, _ in sequences]
        out = self.module.stack_steps(
            self.stack, h.contiguous(), [c.contiguous() for c, _ in tables], [s.contiguous() for _, s in tables], caches,
            [start for _, start, _, _ in sequences], [[lo for lo, _ in w] for w in windows], [[v for _, v in w] for w in windows],
            [rows for _, _, rows, _ in sequences], [prompt for _, _, _, prompt in sequences], taps)
        return out[0], out[1:]


def layer_step(arch, layers: list, int8: bool = False) -> LayerSteps | None:
    """The decoder's layers in one quant.cpp call a pass (LayerSteps), or None where some projection is
    not on blocks, the shapes are not ones rowops.cpp takes, or the kernels cannot run here. Llama's layer,
    with Qwen2's QKV bias, Qwen3's head norms (in float32 rounded as Gemma's) or Gemma-3's layer."""
    module = load()
    if module is None or arch.head_dim % 16 or (arch.n_heads * arch.head_dim) % 8:
        return None
    held = []
    for layer in layers:
        projections = (layer.wqkv, layer.wo, layer.wgu, layer.wdown)
        if not all(isinstance(w, QuantWeight | QuantParts) for w in projections):
            return None
        parts = [w.parts if isinstance(w, QuantParts) else (w,) for w in projections]
        if parts[0][0].in_features % 8 or sum(p.out_features for p in parts[2]) % 16:
            return None
        names = ("attn_in", "mlp_in", "q", "k", "attn_out", "mlp_out")  # a norm the layer lacks: an empty tensor
        norms = [layer.norms[name].float().contiguous() if name in layer.norms else _EMPTY for name in names]
        bias = _EMPTY if layer.bqkv is None else layer.bqkv.float().contiguous()
        held.append(([[p.blocks for p in ps] for ps in parts], [[p.code for p in ps] for ps in parts], norms, bias))
    return LayerSteps(module, arch, held, int8)


def return_freed_memory() -> None:
    """Give the memory freed after repacking back to the OS (glibc keeps freed blocks of tens of MB in its
    heap: a 1.2 GB model left ~0.6 GB resident that nothing used). A no-op where the C library has no
    malloc_trim."""
    import ctypes
    import ctypes.util

    try:
        ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def block_width(kind: str) -> int:
    """How many weights one block of `kind` holds (a row's length must be a multiple)."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    return GGML_QUANT_SIZES[GGMLQuantizationType((KINDS | FLOAT_KINDS)[kind])][0]


def quantize(weight: torch.Tensor, kind: str = "Q8_0") -> QuantWeight:
    """A float matrix (out_features, in_features) as blocks of `kind` (gguf-py's reference
    quantisation: ggml's own rounding), for weights that come from no GGUF file (a drafter's)."""
    from gguf import GGMLQuantizationType
    from gguf.quants import quantize as reference

    kinds = KINDS | FLOAT_KINDS
    if kind not in kinds:
        raise ValueError(f"unknown block type {kind!r}: use one of {', '.join(kinds)}")
    values = weight.detach().float().contiguous().numpy()
    blocks = reference(values, GGMLQuantizationType(kinds[kind]))
    return QuantWeight(torch.from_numpy(blocks.view(np.uint8).reshape(weight.shape[0], -1).copy()), kinds[kind],
                       weight.shape[1])


def dequantize(w: QuantWeight) -> torch.Tensor:
    """The float32 weight the blocks stand for (gguf-py's reference dequantisation)."""
    from gguf.quants import dequantize as reference

    if w.packed:
        raise ValueError("dequantize takes the file's blocks, not packed ones")
    values = reference(w.blocks.numpy(), w.kind)
    return torch.from_numpy(values.reshape(w.out_features, w.in_features).copy())
