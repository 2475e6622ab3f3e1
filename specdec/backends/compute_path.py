"""The lean backend's compute path, chosen in one function (`choose_path`) from the model's dtype, device
and architecture, the blocks its linear layers read, the activations and the CPU. The backend runs what
the path says and names it in the stats (`ComputePath.label`), so what runs is decided, and can be read,
in one place.

  float32 / bfloat16 weights   oneDNN's packed linear (`packed`); in bfloat16 on an AVX-512 BF16 CPU the
                               passes run on kernels.cpp instead (`kernels`), on AMX-BF16 tiles where the
                               CPU and kernel grant them (`tiles`)
  blocks (GGUF, Q8_0, Q4_0)    quant.cpp on float32 activations, or on int8 activations (`int8`): then
                               repacked at load for the CPU's int8 products (`repacked_for`: AVX2,
                               AVX-512 VNNI, AMX-INT8 for many rows), and then with the KV cache in
                               float16 (`half_cache`), as llama.cpp keeps it
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from ..errors import SpecdecError
from ..modeling import kernels, quant
from ..modeling.packing import can_pack

ON_KERNELS = ("llama", "mistral", "gemma3_text")
"""The architectures whose bf16 passes kernels.cpp runs (the others' bf16 passes run on ATen, the weights
pre-packed)."""


@dataclass(frozen=True)
class ComputePath:
    kernels: bool = False
    """bf16 passes on kernels.cpp (AVX-512 BF16 dot products, fused norm, RoPE and attention)."""
    tiles: bool = False
    """kernels.cpp with the weights packed for AMX-BF16 tiles: every pass on it, prefill included."""
    packed: bool = False
    """The float weights pre-packed for oneDNN (the path without kernels.cpp)."""
    blocks: str | None = None
    """What the linear layers' blocks are: "gguf" (a GGUF file's own), "q8_0" or "q4_0" (the float weights
    quantised at load); None for float weights."""
    int8: bool = False
    """The blocks multiply activations quantised to int8 per 32 values (llama.cpp's way)."""
    repacked_for: str | None = None
    """The int8 products the blocks are repacked for at load: "amx" (AMX-INT8 for many rows, AVX-512 VNNI
    for few), "vnni" or "avx2"; None: the file's own layout (quant.cpp's AVX2 products on it)."""
    half_cache: bool = False
    """The KV cache holds float16 (llama.cpp's default) instead of the model's dtype: half the memory, and
    half the bytes a step reads a position of context. Taken with int8 activations, the path that already
    trades the float model's exact arithmetic for speed; float32 activations keep a float32 cache."""

    @property
    def label(self) -> str:
        """What the stats print: lean, lean+kernels, lean+tiles, lean+gguf, lean+gguf-int8+vnni, ..."""
        if self.blocks is not None:
            label = f"lean+{self.blocks}" + ("-int8" if self.int8 else "")
            return label + (f"+{self.repacked_for}" if self.repacked_for else "")
        return "lean+tiles" if self.tiles else "lean+kernels" if self.kernels else "lean"


def choose_path(model_type: str, dtype: torch.dtype, device: torch.device, blocks: str | None = None,
                int8: bool = False, use_kernels: bool = True, use_tiles: bool = True,
                repack: bool = True, half_cache: bool = True) -> ComputePath:
    """The path a model of `model_type` in `dtype` on `device` runs on here, its linear layers on `blocks`
    (None: its float weights) times int8 activations where `int8`. use_kernels, use_tiles, repack and
    half_cache turn kernels.cpp, its AMX tiles, the int8 repacking and the float16 KV cache off (to compare
    paths); SPECDEC_KERNELS=0, SPECDEC_TILES=0, SPECDEC_QUANT_PACKED=0 and SPECDEC_KV_CACHE=f32 do the
    same from outside. A SpecdecError says what stands
    in the way of blocks that cannot run here."""
    on_cpu = device.type == "cpu"
    if blocks is not None:
        if dtype != torch.float32 or not on_cpu:
            raise SpecdecError("GGUF weights run on the CPU with float32 activations: load the model in float32")
        if quant.load() is None:
            raise SpecdecError(f"the GGUF kernels cannot run here: {quant.unavailable_reason()}")
        repacked_for = quant.packed_isa() if int8 and repack else None
        half = int8 and half_cache and os.environ.get("SPECDEC_KV_CACHE", "").lower() not in ("f32", "float32")
        return ComputePath(packed=can_pack(dtype), blocks=blocks, int8=int8, repacked_for=repacked_for,
                           half_cache=half)
    kern = (kernels.load() if dtype == torch.bfloat16 and on_cpu and use_kernels and model_type in ON_KERNELS
            else None)
    if kern is not None:
        return ComputePath(kernels=True, tiles=kern.tiles and use_tiles)
    return ComputePath(packed=on_cpu and dtype in (torch.bfloat16, torch.float32) and can_pack(dtype))
