"""rowops.cpp, the float32 norms, q/k RoPE and act(gate)·up of the lean backend's ATen path, against
the ATen ops they replace, and the lean backend with them against transformers at a head size they serve."""

import pytest
import torch

from helpers import built_extension
from specdec.backends import TransformersBackend
from specdec.backends.lean import LeanBackend
from specdec.modeling import Arch, rms_norm, rotate, rowops


@pytest.fixture(scope="module")
def rows():
    return built_extension(rowops)


@pytest.mark.parametrize("gemma", [False, True])
def test_rms_norm_is_aten_rms_norm(rows, gemma):
    arch = Arch(n_heads=4, n_kv=2, head_dim=64, scale=0.125, eps=1e-6, gemma=gemma)
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(2, 7, 576, generator=g) * 3, torch.randn(576, generator=g)
    out = rows.rms_norm(x, w, arch.eps)
    assert out.shape == x.shape
    torch.testing.assert_close(out, rms_norm(x, w, arch), rtol=1e-6, atol=1e-6)
    assert torch.equal(rows.rms_norm(x[:, 3:4].contiguous(), w, arch.eps), out[:, 3:4])  # a row alone: the same


@pytest.mark.parametrize("head_dim,gemma", [(64, False), (256, True)])
def test_qk_rope_is_norms_then_rotate(rows, head_dim, gemma):
    n_heads, n_kv, t = 4, 2, 5
    g = torch.Generator().manual_seed(1)
    qkv = torch.randn(1, t, (n_heads + 2 * n_kv) * head_dim, generator=g)
    cos, sin = torch.randn(t, head_dim, generator=g), torch.randn(t, head_dim, generator=g)
    q_norm, k_norm = torch.rand(head_dim, generator=g) + 0.5, torch.rand(head_dim, generator=g) + 0.5
    arch = Arch(n_heads=n_heads, n_kv=n_kv, head_dim=head_dim, scale=0.1, eps=1e-6, gemma=gemma)
    heads = qkv.view(1, t, n_heads + 2 * n_kv, head_dim).transpose(1, 2)
    q, k, v = heads[:, :n_heads], heads[:, n_heads : n_heads + n_kv], heads[:, n_heads + n_kv :].clone()
    if gemma:
        q, k = rms_norm(q, q_norm, arch), rms_norm(k, k_norm, arch)
    q, k = rotate(q, cos, sin), rotate(k, cos, sin)
    empty = torch.empty(0)
    rows.qk_rope_(qkv, cos, sin, n_heads, n_kv, head_dim, q_norm if gemma else empty, k_norm if gemma else empty,
                  arch.eps)
    got = qkv.view(1, t, n_heads + 2 * n_kv, head_dim).transpose(1, 2)
    torch.testing.assert_close(got[:, :n_heads], q, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got[:, n_heads : n_heads + n_kv], k, rtol=1e-5, atol=1e-5)
    assert torch.equal(got[:, n_heads + n_kv :], v)  # values untouched


@pytest.mark.parametrize("gemma", [False, True], ids=["silu", "gelu-tanh"])
def test_act_mul_is_the_activation_times_up(rows, gemma):
    arch = Arch(n_heads=4, n_kv=2, head_dim=64, scale=0.125, eps=1e-6, gemma=gemma)
    g = torch.Generator().manual_seed(2)
    gu = torch.randn(3, 2, 2 * 1536, generator=g) * 4  # wide enough to reach the exponential's clamps
    gate, up = gu.chunk(2, dim=-1)
    out = rows.act_mul(gu, gemma)
    assert out.shape == gate.shape
    torch.testing.assert_close(out, arch.act(gate) * up, rtol=2e-6, atol=2e-6)
    assert torch.equal(rows.act_mul(gu[1:2, 1:2].contiguous(), gemma), out[1:2, 1:2])  # a row alone: the same


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_lean_with_rowops_gives_transformers_logits(rows, arch):
    """Head size 64: the fused q/k path serves (the tiny models elsewhere have head size 8)."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    if arch == "llama":
        model = LlamaForCausalLM(LlamaConfig(vocab_size=40, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                             num_attention_heads=2, num_key_value_heads=1))
    else:
        model = Gemma3ForCausalLM(Gemma3TextConfig(vocab_size=40, hidden_size=128, intermediate_size=256,
                                                   num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                                                   head_dim=64, sliding_window=8, layer_types=["sliding_attention",
                                                                                               "full_attention"]))
    model.eval()
    lean, hf = LeanBackend(model), TransformersBackend(model)
    assert lean.decoder.rows is not None
    ids = torch.randint(0, 40, (24,), generator=torch.Generator().manual_seed(2))
    for chunk in (ids[:10], ids[10:11], ids[11:16], ids[16:24]):
        a, b = lean.forward(chunk), hf.forward(chunk)
        assert (a - b).abs().max() <= 1e-4 * max(1.0, b.abs().max())


def _reference_attention(q, keys, values, visible, scale):
    """float64 softmax(q k^T scale) v over the visible keys: q (Hq, T, hd), keys (Hkv, n, hd)."""
    groups = q.shape[0] // keys.shape[0]
    k, v = keys.double().repeat_interleave(groups, 0), values.double().repeat_interleave(groups, 0)
    scores = (q.double() @ k.transpose(1, 2)) * scale
    scores = scores.masked_fill(~visible, float("-inf"))
    return (scores.softmax(-1) @ v).transpose(0, 1).float()  # (T, Hq, hd)


@pytest.mark.parametrize("head_dim,n_heads,n_kv", [(64, 6, 2), (256, 4, 1), (96, 2, 2)])
@pytest.mark.parametrize("layout", ["causal", "window", "tree"])
@pytest.mark.parametrize("cache", [torch.float32, torch.float16], ids=["f32-cache", "f16-cache"])
def test_attend_is_softmax_attention_and_a_query_alone_scores_the_same(rows, head_dim, n_heads, n_kv, layout, cache):
    """attend writes the new keys and values into the cache (float32, or float16 rounded as torch's
    .half() rounds) and attends causally (or as a mask says) over what the cache holds; a query's output
    is the same to the bit alone as in a block of 37 (blocks of 16 queries, chunks of keys), and on
    AVX-512 lanes as on AVX2 ones."""
    g = torch.Generator().manual_seed(head_dim + len(layout))
    start, t, capacity = 150, 37, 256
    q = torch.randn(1, n_heads, t, head_dim, generator=g)
    k, v = torch.randn(1, n_kv, t, head_dim, generator=g), torch.randn(1, n_kv, t, head_dim, generator=g)
    k_cache = torch.randn(n_kv, capacity, head_dim, generator=g).to(cache)
    v_cache = torch.randn(n_kv, capacity, head_dim, generator=g).to(cache)
    lo = 20 if layout == "window" else 0
    q_pos, k_pos = torch.arange(start, start + t)[:, None], torch.arange(lo, start + t)[None]
    visible = k_pos <= q_pos
    if layout == "window":
        visible &= k_pos > q_pos - 100
    if layout == "tree":  # the context, then a random subset of the earlier new rows (a tree's ancestors)
        visible[:, start - lo:] &= torch.rand(t, t, generator=g) < 0.5
        visible[:, start - lo:] |= torch.eye(t, dtype=torch.bool)
    scale = head_dim**-0.5
    out = rows.attend(q, k, v, k_cache, v_cache, start, lo, visible, scale)
    assert torch.equal(k_cache[:, start : start + t], k[0].to(cache))
    assert torch.equal(v_cache[:, start : start + t], v[0].to(cache))
    want = _reference_attention(q[0], k_cache[:, lo : start + t].float(), v_cache[:, lo : start + t].float(), visible,
                                scale)
    torch.testing.assert_close(out[0], want, rtol=1e-5, atol=2e-6)
    for i in (0, 15, 16, 36):  # a query alone (the cache already holds every new key)
        end = start + i + 1
        alone = rows.attend(q[:, :, i : i + 1], k[:, :, i : i + 1], v[:, :, i : i + 1], k_cache, v_cache, start + i, lo,
                            visible[i : i + 1, : end - lo].contiguous(), scale)
        assert torch.equal(alone[0, 0], out[0, i])
    previous = rows.set_wide_lanes(False)  # AVX2 lanes (out had AVX-512's where the CPU has them)
    try:
        assert torch.equal(rows.attend(q, k, v, k_cache, v_cache, start, lo, visible, scale), out)
    finally:
        rows.set_wide_lanes(previous)
