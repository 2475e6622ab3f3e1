"""The KV cache of one sequence: keys and values per layer, written by position.

Rollback is free: the caller moves `length` back and the rejected slots are overwritten by the
next round. Storage grows by doubling (to at most `max_length` positions).
"""

from __future__ import annotations

import math
import mmap

import torch


def grown_capacity(end: int, capacity: int, max_length: int | None) -> int:
    """Room for `end` positions, doubling what there is (at least 256), capped at max_length
    unless `end` itself is longer."""
    grown = max(end, 2 * capacity, 256)
    return max(end, min(grown, max_length)) if max_length else grown


def zeroed(count: int, shape: tuple, dtype: torch.dtype, device: torch.device) -> list[torch.Tensor]:
    """`count` zero tensors of `shape`; on the CPU views of one anonymous mapping, whose pages the OS maps
    on first write, a small page at a time: the slots a cache has not reached take no memory (torch.zeros
    writes every page, and numpy's zeros asks for huge pages, which a write into each head's rows maps
    whole)."""
    if device.type != "cpu":
        return [torch.zeros(shape, dtype=dtype, device=device) for _ in range(count)]
    size = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    if count * size == 0:
        return [torch.zeros(shape, dtype=dtype) for _ in range(count)]
    flat = torch.frombuffer(mmap.mmap(-1, count * size), dtype=torch.uint8).view(dtype)  # the tensor holds the map
    return list(flat.view(count, *shape).unbind(0))


class KVCache:
    def __init__(self, layers: int, kv_heads: int, head_dim: int, dtype: torch.dtype, device: torch.device,
                 max_length: int | None = None):
        self.layers, self.kv_heads, self.head_dim = layers, kv_heads, head_dim
        self.dtype, self.device, self.max_length = dtype, device, max_length
        self.k: list[torch.Tensor] = []
        self.v: list[torch.Tensor] = []
        self.capacity = 0
        self.length = 0
        """Positions 0..length-1 hold valid entries."""
        self._bound: dict = {}

    def bound(self, make):
        """make(k, v): an extension's handle on this cache's tensors (quant.cpp's SequenceCaches), made once
        and again only after the storage grows (passing the 2 x layers tensors at every call cost more than
        the call's own work outside its layers)."""
        handle = self._bound.get(make)
        if handle is None:
            handle = self._bound[make] = make(self.k, self.v)
        return handle

    def ensure(self, end: int) -> None:
        """Room for positions 0..end-1, keeping what the cache holds."""
        if end <= self.capacity:
            return
        capacity = grown_capacity(end, self.capacity, self.max_length)
        shape = (self.kv_heads, capacity, self.head_dim)
        old = self.capacity
        grown = zeroed(2 * self.layers, shape, self.dtype, self.device)
        grown_k, grown_v = grown[: self.layers], grown[self.layers :]
        kept = min(old, self.length)  # the slots past the length hold nothing a later pass reads
        for i in range(len(self.k)):
            grown_k[i][:, :kept] = self.k[i][:, :kept]
            grown_v[i][:, :kept] = self.v[i][:, :kept]
        self.k, self.v, self.capacity = grown_k, grown_v, capacity
        self._bound.clear()  # handles on the old tensors
