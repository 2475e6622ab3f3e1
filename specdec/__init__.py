"""specdec: lossless speculative decoding for Hugging Face causal LMs (p = target, q = draft).

The names below load on first use, so `specdec --help` and the config classes do not pay for
importing torch and transformers.
"""

from __future__ import annotations

import importlib

from .config import SamplingParams, SpecConfig
from .errors import SpecdecError

_LAZY = {"SpecDec": "api", "Result": "api", "SpeculativeEngine": "decoding.engine", "Generation": "decoding.engine"}

__all__ = ["SpecDec", "Result", "SamplingParams", "SpecConfig", "SpeculativeEngine", "Generation", "SpecdecError"]
__version__ = "0.1.0"


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module 'specdec' has no attribute {name!r}")
