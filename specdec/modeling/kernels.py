"""Builds and loads kernels.cpp, the lean backend's bfloat16 decode kernels, once per machine.

The build (torch.utils.cpp_extension with ninja and the system C++ compiler, ~30 s on 2 cores) is
cached under the specdec cache (SPECDEC_CACHE, default ~/.cache/specdec)/kernels, keyed by the
source, torch, Python and the CPU's flags, so later processes load it in well under a second.
Where it cannot be built or the CPU lacks AVX-512 BF16, `load()` returns None and says why in
`unavailable_reason()`; the lean backend then runs its oneDNN path (the stats name the path).
SPECDEC_KERNELS=0 turns the kernels off.
"""

from __future__ import annotations

import hashlib
import os
import platform
import sys
import warnings
from pathlib import Path
from types import ModuleType

import torch

from ..paths import cache_dir

SOURCE = Path(__file__).with_name("kernels.cpp")

_module: ModuleType | None = None
_reason: str | None = None
_tried = False


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    return platform.processor()


def _build_key() -> str:
    digest = hashlib.sha256()
    for part in (SOURCE.read_bytes(), torch.__version__.encode(), sys.version.encode(), _cpu_flags().encode()):
        digest.update(part)
    return digest.hexdigest()[:12]


def load() -> ModuleType | None:
    """The compiled kernels, building them on first use; None where they cannot run here."""
    global _module, _reason, _tried
    if _tried:
        return _module
    _tried = True
    if os.environ.get("SPECDEC_KERNELS", "1") == "0":
        _reason = "turned off by SPECDEC_KERNELS=0"
        return None
    if platform.machine() not in ("x86_64", "AMD64"):
        _reason = f"the kernels need an x86-64 CPU with AVX-512 BF16, this is {platform.machine()}"
        return None
    key = _build_key()
    build_dir = cache_dir() / "kernels" / key
    try:
        build_dir.mkdir(parents=True, exist_ok=True)
        try:  # torch looks for the ninja executable on PATH; the pip package keeps it beside Python
            import ninja

            os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + os.environ.get("PATH", "")
        except ImportError:
            pass
        from torch.utils.cpp_extension import load as build

        if not any(build_dir.glob("*.so")):
            print("specdec: building the CPU kernels once for this machine (~30 s) ...", file=sys.stderr, flush=True)
        module = build(name=f"specdec_kernels_{key}", sources=[str(SOURCE)], build_directory=str(build_dir),
                       extra_cflags=["-O3", "-fopenmp"], extra_ldflags=["-fopenmp"], verbose=False)
    except Exception as error:  # a missing compiler or headers: fall back, and say why
        detail = str(error).strip().splitlines()[-1] if str(error).strip() else repr(error)
        _reason = f"could not build {SOURCE.name} ({detail}); it needs a C++ compiler (g++) and Python's headers"
        warnings.warn(f"specdec: {_reason}. The lean backend runs on oneDNN instead (about 2x slower per step).",
                      stacklevel=2)
        return None
    if not module.supported():
        _reason = "this CPU lacks AVX-512 BF16"
        return None
    _module = module
    return _module


def unavailable_reason() -> str | None:
    """Why load() returned None (None when the kernels loaded or were not tried)."""
    return _reason
