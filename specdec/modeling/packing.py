"""oneDNN's pre-packed linear on the CPU, for bfloat16 and float32 weights. Used where kernels.cpp
is not available. Measured on an AMD EPYC (AVX2, 2 vCPUs; SmolLM2-135M's 120 layer matrices,
streamed from memory): float32 19 ms for one row against F.linear's 33 ms, 24–32 ms for 2–8 rows
against 56–64 ms (F.linear switches from MKL's matrix-vector to its matrix product at two rows),
and the LM head 4.0 ms against 8.2 ms. Its rows do not depend on how many are multiplied together
(checked up to 600 rows), which F.linear's do. In bfloat16 it is bit-identical to F.linear and about
half the time for one row."""

from __future__ import annotations

import torch


def can_pack(dtype: torch.dtype = torch.bfloat16) -> bool:
    """Whether this torch build has oneDNN's pre-packed linear for `dtype` (CPU builds with mkldnn do)."""
    try:
        weight = torch.ops.mkldnn._reorder_linear_weight(torch.zeros(8, 8, dtype=dtype))
        torch.ops.mkldnn._linear_pointwise(torch.zeros(1, 8, dtype=dtype), weight, None, "none", [], "")
        return True
    except (AttributeError, RuntimeError):
        return False


def pack(weight: torch.Tensor) -> torch.Tensor:
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous())


def packed_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x @ weight.T (+ bias) for a weight from pack()."""
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")
