"""oneDNN's pre-packed linear for bfloat16 weights on the CPU: bit-identical to F.linear, about
half the time for a one-row product. Used where kernels.cpp is not available."""

from __future__ import annotations

import torch


def can_pack() -> bool:
    """Whether this torch build has oneDNN's pre-packed linear (CPU builds with mkldnn do)."""
    try:
        weight = torch.ops.mkldnn._reorder_linear_weight(torch.zeros(8, 8, dtype=torch.bfloat16))
        torch.ops.mkldnn._linear_pointwise(torch.zeros(1, 8, dtype=torch.bfloat16), weight, None, "none", [], "")
        return True
    except (AttributeError, RuntimeError):
        return False


def pack(weight: torch.Tensor) -> torch.Tensor:
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous())


def packed_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x @ weight.T (+ bias) for a weight from pack()."""
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")
