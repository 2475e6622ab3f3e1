"""specdec: lossless speculative decoding for Hugging Face causal LMs (p = target, q = draft)."""

from .api import Result, SpecDec
from .config import SamplingParams, SpecConfig
from .engine import Generation, SpeculativeEngine
from .errors import SpecdecError

__all__ = ["SpecDec", "Result", "SamplingParams", "SpecConfig", "SpeculativeEngine", "Generation", "SpecdecError"]
__version__ = "0.1.0"
