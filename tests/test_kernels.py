"""kernels.cpp, the lean backend's bf16 decode kernels, against plain torch references: the same
numbers up to the order of fp32 sums, with transformers' rounding points."""

import math
import shutil

import pytest
import torch
import torch.nn.functional as F

from helpers import tiny_gemma3, tiny_llama, tiny_llama_family
from specdec.modeling import kernels, rotate
from specdec.modeling.extension import cpu_flags


@pytest.fixture(scope="module")
def kern():
    if "avx512_bf16" not in cpu_flags() or shutil.which("c++") is None:
        pytest.skip("needs a CPU with AVX-512 BF16 and a C++ compiler (the lean backend then uses oneDNN)")
    module = kernels.load()
    assert module is not None, kernels.unavailable_reason()  # it must build wherever it can run
    return module


def bf16(*shape, seed=0, scale=1.0):
    return (torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale).to(torch.bfloat16)


def close_bf16(a: torch.Tensor, b: torch.Tensor, ulps: float = 2.0) -> bool:
    """Within a couple of bf16 roundings of each other (sums in another order may round apart)."""
    a, b = a.float(), b.float()
    return bool(((a - b).abs() <= ulps * 2.0 ** -8 * b.abs() + 1e-6 * b.abs().max()).all())


@pytest.mark.parametrize("rows", [1, 3, 4, 5, 8, 16])
@pytest.mark.parametrize("k,n", [(32, 64), (40, 7), (576, 130)])  # partial 32-chunks, partial 4-row blocks
def test_linear_matches_fp32_reference(kern, rows, k, n):
    x, w, residual = bf16(rows, k, seed=1), bf16(n, k, seed=2), bf16(rows, n, seed=3)
    exact = x.float() @ w.float().T  # bf16 products are exact in fp32
    assert close_bf16(kern.linear(x, w), exact.to(torch.bfloat16))
    with_residual = (exact.to(torch.bfloat16).float() + residual.float()).to(torch.bfloat16)
    assert close_bf16(kern.linear(x, w, residual), with_residual, ulps=4)


def test_linear_refuses_bad_input(kern):
    with pytest.raises(RuntimeError, match="bfloat16"):
        kern.linear(torch.zeros(1, 32), torch.zeros(4, 32))
    with pytest.raises(RuntimeError, match="columns"):
        kern.linear(bf16(1, 32), bf16(4, 40))


def test_rms_norm_rounds_like_llama_and_gemma(kern):
    x, w = bf16(5, 64, seed=4, scale=3.0), bf16(64, seed=5)
    x32 = F.rms_norm(x.float(), (64,), eps=1e-6)
    llama = w * x32.to(torch.bfloat16)
    assert close_bf16(kern.rms_norm(x, w, 1e-6), llama)
    w_gemma = 1.0 + w.float()
    gemma = (x32 * w_gemma).to(torch.bfloat16)
    assert close_bf16(kern.rms_norm(x, w_gemma, 1e-6), gemma)


@pytest.mark.parametrize("gelu", [False, True])
def test_act_mul(kern, gelu):
    gate_up = bf16(3, 96, seed=6)
    gate, up = gate_up.chunk(2, dim=-1)
    expected = (F.gelu(gate, approximate="tanh") if gelu else F.silu(gate)) * up
    assert torch.equal(kern.act_mul(gate_up, gelu), expected)


def _reference_attention(qkv, n_heads, n_kv, hd, cos, sin, keys_before, values_before, start, window, scale, qn, kn):
    """The lean backend's ATen formulation: split, (Gemma) q/k norm, RoPE, append, masked SDPA."""
    n = qkv.shape[0]
    q = qkv[:, : n_heads * hd].view(n, n_heads, hd).transpose(0, 1)
    k = qkv[:, n_heads * hd : (n_heads + n_kv) * hd].view(n, n_kv, hd).transpose(0, 1)
    v = qkv[:, (n_heads + n_kv) * hd :].view(n, n_kv, hd).transpose(0, 1)
    if qn is not None:
        q = (F.rms_norm(q.float(), (hd,), eps=1e-6) * qn).to(torch.bfloat16)
        k = (F.rms_norm(k.float(), (hd,), eps=1e-6) * kn).to(torch.bfloat16)
    c, s = cos[start : start + n], sin[start : start + n]
    q, k = rotate(q, c, s), rotate(k, c, s)
    keys, values = torch.cat([keys_before, k], dim=1), torch.cat([values_before, v], dim=1)
    q_pos = torch.arange(start, start + n)[:, None]
    k_pos = torch.arange(start + n)[None]
    allowed = k_pos <= q_pos
    if window:
        allowed &= k_pos > q_pos - window
    out = F.scaled_dot_product_attention(q[None].float(), keys[None].float(), values[None].float(),
                                         attn_mask=allowed, scale=scale, enable_gqa=True)
    return out[0].transpose(0, 1).reshape(n, n_heads * hd), k, v


@pytest.mark.parametrize("hd,window,gemma", [(64, 0, False), (8, 0, False), (32, 6, True), (256, 0, True),
                                             (64, 6, False), (256, 6, True)])
@pytest.mark.parametrize("n", [1, 5])
def test_attend_matches_masked_sdpa_and_writes_the_cache(kern, hd, window, gemma, n):
    n_heads, n_kv, start, capacity = 4, 2, 11, 32
    qkv = bf16(n, (n_heads + 2 * n_kv) * hd, seed=7)
    angles = torch.arange(capacity)[:, None] * (10000.0 ** (-torch.arange(hd // 2) / (hd // 2)))[None]
    cos = torch.cat([angles.cos()] * 2, dim=-1).to(torch.bfloat16)
    sin = torch.cat([-angles.sin(), angles.sin()], dim=-1).to(torch.bfloat16)  # rotate_half's minus folded in
    k_cache, v_cache = bf16(n_kv, capacity, hd, seed=8), bf16(n_kv, capacity, hd, seed=9)
    before_k, before_v = k_cache[:, :start].clone(), v_cache[:, :start].clone()
    qn = (1.0 + torch.randn(hd) * 0.1) if gemma else None
    kn = (1.0 + torch.randn(hd) * 0.1) if gemma else None
    scale = 1 / math.sqrt(hd)
    out = kern.attend(qkv, n_heads, n_kv, cos, sin, k_cache, v_cache, start, window, scale, qn, kn, 1e-6)
    expected, k, v = _reference_attention(qkv, n_heads, n_kv, hd, cos, sin, before_k, before_v, start, window,
                                          scale, qn, kn)
    assert torch.equal(k_cache[:, start : start + n], k)  # RoPE'd keys, rounded as transformers does
    assert torch.equal(v_cache[:, start : start + n], v)
    assert torch.equal(k_cache[:, :start], before_k)  # earlier positions untouched
    assert (out.float() - expected).abs().max() <= 2.0 ** -7 * expected.abs().max()


@pytest.mark.parametrize("make", [tiny_llama, tiny_gemma3, lambda: tiny_llama_family("mistral", 40, sliding_window=8)],
                         ids=["llama", "gemma3", "mistral"])
def test_lean_bf16_runs_on_the_kernels_and_agrees_with_its_aten_path(kern, make):
    from specdec.backends.lean import LeanBackend

    model = make().to(torch.bfloat16)
    fast, aten = LeanBackend(model, use_tiles=False), LeanBackend(model, use_kernels=False)  # tiles: test_tiles.py
    assert (fast.path, aten.path) == ("lean+kernels", "lean")
    ids = torch.randint(0, 40, (40,), generator=torch.Generator().manual_seed(0))
    for chunk in (ids[:20], ids[20:21], ids[21:29], ids[29:30], ids[30:40]):  # prefill on ATen, steps on kernels
        a, b = fast.forward(chunk), aten.forward(chunk)
        assert (a - b).abs().max() <= 0.05 * max(1.0, b.abs().max())
