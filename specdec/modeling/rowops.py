"""Builds and loads rowops.cpp: float32 RMSNorm and q/k RMSNorm + RoPE in one call each, for the
lean backend's ATen path on CPUs without kernels.cpp (AVX2 and FMA; extension.py builds it once).

`load()` returns None where it cannot run (`unavailable_reason()` says why); the decoder then uses
ATen ops. SPECDEC_ROWOPS=0 turns it off.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

from .extension import Extension

_extension = Extension(Path(__file__).with_name("rowops.cpp"), needs="AVX2 and FMA", off_variable="SPECDEC_ROWOPS",
                       fallback="The lean backend's float32 norms and RoPE run as ATen ops instead.")


def load() -> ModuleType | None:
    return _extension.load()


def unavailable_reason() -> str | None:
    return _extension.reason
