"""Model adapters behind one small interface: prefill/forward by position, roll back by length."""

from .base import Backend
from .hf import TransformersBackend

__all__ = ["Backend", "TransformersBackend"]
