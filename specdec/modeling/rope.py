"""Rotary position embeddings: tables of cos and signed sin by position, grown on demand.

The tables hold rotate_half's minus inside the sine ("signed sin"), so rotating is two products
and a swap of halves; kernels.cpp reads the same tables.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .cache import grown_capacity

Angles = Callable[[int], dict[str, tuple[torch.Tensor, torch.Tensor]]]
"""positions -> {kind: (cos, sin)}, each (positions, head_dim): how a model computes its RoPE."""


def rotate(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """RoPE: x·cos + rotate_half(x)·sin, with rotate_half's minus already in signed_sin."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((x[..., half:], x[..., :half]), dim=-1) * signed_sin


def theta_angles(head_dim: int, theta: float) -> Angles:
    """Llama's default RoPE (half-split layout) with base `theta`, computed in float32."""
    def angles(positions: int) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
        phase = torch.outer(torch.arange(positions, dtype=torch.float32), inv)
        phase = torch.cat([phase, phase], dim=-1)
        return {"default": (phase.cos(), phase.sin())}
    return angles


def rotary_module_angles(rotary, kinds: list[str], dtype: torch.dtype, device: torch.device) -> Angles:
    """The angles of a transformers model's own rotary module (any rope type it supports); kinds
    other than "default" name Gemma-3's per-layer-type tables."""
    def angles(positions: int) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        index = torch.arange(positions, device=device)[None]
        probe = torch.zeros(1, dtype=dtype, device=device)
        tables = {}
        for kind in kinds:
            cos, sin = rotary(probe, index) if kind == "default" else rotary(probe, index, kind)
            tables[kind] = (cos[0], sin[0])
        return tables
    return angles


class RopeTable:
    """cos and signed-sin tables, (capacity, head_dim) per kind, in one dtype and device; grown by
    doubling (to at most `max_length` positions) when a longer sequence needs them."""

    def __init__(self, angles: Angles, dtype: torch.dtype, device: torch.device, max_length: int | None = None):
        self.angles, self.dtype, self.device, self.max_length = angles, dtype, device, max_length
        self.capacity = 0
        self.tables: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}

    def ensure(self, end: int) -> None:
        if end <= self.capacity:
            return
        capacity = grown_capacity(end, self.capacity, self.max_length)
        for kind, (cos, sin) in self.angles(capacity).items():
            half = sin.shape[-1] // 2
            signed_sin = torch.cat([-sin[:, :half], sin[:, half:]], dim=-1)
            cast = dict(device=self.device, dtype=self.dtype)
            self.tables[kind] = (cos.to(**cast), signed_sin.to(**cast))
        self.capacity = capacity

    def full(self, kind: str = "default") -> tuple[torch.Tensor, torch.Tensor]:
        """The whole tables from position 0 (what kernels.cpp indexes itself)."""
        return self.tables[kind]

    def span(self, kind: str, start: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(end - start, head_dim) cos and signed sin of positions start..end-1."""
        self.ensure(end)
        cos, sin = self.tables[kind]
        return cos[start:end], sin[start:end]
