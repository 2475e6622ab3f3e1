"""Builds and loads kernels.cpp, the lean backend's bfloat16 kernels, once per machine
(extension.py: cached under SPECDEC_CACHE/kernels, ~30 s the first time).

Two linear products: `linear` (AVX-512 BF16 dot products on weights in their natural layout, bound by
arithmetic from ~5 rows) and, where the CPU has AMX and the kernel grants it, `linear_tiles` on
weights packed once into the tile layout (`TileWeight`): 16-32 rows then cost about what one does.
`Kernels.linear` takes either. Where kernels.cpp cannot be built or the CPU lacks AVX-512 BF16,
`load()` returns None and says why in `unavailable_reason()`; the lean backend then runs its oneDNN
path (the stats name the path). SPECDEC_KERNELS=0 turns the kernels off, SPECDEC_TILES=0 the tiles.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import torch

from .extension import Extension, cpu_flags

_extension = Extension(Path(__file__).with_name("kernels.cpp"), needs="AVX-512 BF16", off_variable="SPECDEC_KERNELS",
                       fallback="The lean backend runs on oneDNN instead (about 2x slower per step).",
                       others=tuple(sorted((Path(__file__).parent / "bf16").glob("*.cpp"))))


@dataclass(frozen=True)
class TileWeight:
    """An (out_features, in_features) bf16 weight packed for AMX tiles (kernels.cpp's pack_tiles:
    pairs of 16 output columns, 32 inputs a tile, zero-padded)."""

    packed: torch.Tensor
    out_features: int
    in_features: int


class Kernels:
    """kernels.cpp, its linear taking a natural-layout weight or a TileWeight."""

    def __init__(self, module: ModuleType):
        self.module = module
        self.tiles_reason: str | None = None
        """Why the tiles do not run here (None where they do)."""
        if os.environ.get("SPECDEC_TILES", "1") == "0":
            self.tiles_reason = "turned off by SPECDEC_TILES=0"
        elif not {"amx_bf16", "amx_tile"} <= cpu_flags():
            self.tiles_reason = "this CPU has no AMX tiles (amx_bf16, amx_tile)"
        elif not module.tiles_supported():
            self.tiles_reason = "the kernel did not grant the AMX tile state (Linux >= 5.16 grants it on request)"

    @property
    def tiles(self) -> bool:
        return self.tiles_reason is None

    def pack(self, weight: torch.Tensor) -> TileWeight:
        w = weight.detach().to(torch.bfloat16).contiguous()
        return TileWeight(self.module.pack_tiles(w), w.shape[0], w.shape[1])

    def linear(self, x: torch.Tensor, w, residual: torch.Tensor | None = None) -> torch.Tensor:
        if isinstance(w, TileWeight):
            return self.module.linear_tiles(x, w.packed, w.out_features, residual)
        return self.module.linear(x, w, residual)

    def __getattr__(self, name: str):
        return getattr(self.module, name)


_kernels: Kernels | None = None


def load() -> Kernels | None:
    """The compiled kernels, building them on first use; None where they cannot run here."""
    global _kernels
    module = _extension.load()
    if module is not None and (_kernels is None or _kernels.module is not module):
        _kernels = Kernels(module)
    return _kernels if module is not None else None


def unavailable_reason() -> str | None:
    """Why load() returned None (None when the kernels loaded or were not tried)."""
    return _extension.reason
