"""Builds and loads kernels.cpp, the lean backend's bfloat16 decode kernels, once per machine
(extension.py: cached under SPECDEC_CACHE/kernels, ~30 s the first time).

Where it cannot be built or the CPU lacks AVX-512 BF16, `load()` returns None and says why in
`unavailable_reason()`; the lean backend then runs its oneDNN path (the stats name the path).
SPECDEC_KERNELS=0 turns the kernels off.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

from .extension import Extension

_extension = Extension(Path(__file__).with_name("kernels.cpp"), needs="AVX-512 BF16", off_variable="SPECDEC_KERNELS",
                       fallback="The lean backend runs on oneDNN instead (about 2x slower per step).")


def load() -> ModuleType | None:
    """The compiled kernels, building them on first use; None where they cannot run here."""
    return _extension.load()


def unavailable_reason() -> str | None:
    """Why load() returned None (None when the kernels loaded or were not tried)."""
    return _extension.reason
