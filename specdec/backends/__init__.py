"""Model adapters behind one small interface: prefill/forward by position, roll back by length."""

from .base import Backend
from .hf import TransformersBackend
from .lean import LeanBackend, make_backend

__all__ = ["Backend", "TransformersBackend", "LeanBackend", "make_backend"]
