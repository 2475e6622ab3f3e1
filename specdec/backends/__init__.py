"""Model adapters behind one small interface: prefill/forward by position, roll back by length."""

from .base import Backend, Step
from .hf import TransformersBackend
from .lean import LeanBackend, make_backend, target_backend

__all__ = ["Backend", "Step", "TransformersBackend", "LeanBackend", "make_backend", "target_backend"]
