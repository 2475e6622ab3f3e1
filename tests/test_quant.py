"""quant.cpp's products on GGUF blocks: the kernels give the dequantised weights' products up to the order of
fp32 sums, a row's result never depends on how many rows are multiplied together, and the packed int8
paths (AVX2, AVX-512 VNNI, AMX-INT8, AMX-BF16 prompt tiles) agree to the bit where they must."""

import os

import pytest
import torch

from helpers import SUPER, blocks_of, built_extension
from specdec.modeling import quant
from specdec.modeling.extension import Extension

KINDS = quant.KINDS


@pytest.fixture(scope="module")
def kernels():
    return built_extension(quant)




def test_quantize_rounds_each_block_to_its_own_scale():
    """Q8_0 of a float matrix: every weight within half a step of its block's scale (max |w| / 127; the
    scale is kept in float16, up to 127 * 2^-11 of a step more), the block layout the kernels read; a
    kind quant.cpp does not read is refused."""
    w = torch.randn(16, 96, generator=torch.Generator().manual_seed(1)) * torch.logspace(-3, 1, 16)[:, None]
    blocks = quant.quantize(w, "Q8_0")
    assert blocks.blocks.shape == (16, 3 * 34) and blocks.kind == KINDS["Q8_0"] and blocks.in_features == 96
    step = w.view(16, 3, 32).abs().amax(-1, keepdim=True) / 127
    error = (quant.dequantize(blocks).view(16, 3, 32) - w.view(16, 3, 32)).abs()
    assert torch.all(error <= step * (0.5 + 127 * 2**-11))
    assert quant.block_width("Q8_0") == 32 and quant.block_width("Q4_K") == 256
    with pytest.raises(ValueError, match="unknown block type"):
        quant.quantize(w, "Q2_K")


@pytest.mark.parametrize("name", KINDS)
def test_kernel_is_the_dequantised_product(kernels, name):
    g = torch.Generator().manual_seed(0)
    columns = 512 if KINDS[name] in SUPER else 96
    w = blocks_of(torch.randn(70, columns, generator=g), KINDS[name])
    dense = quant.dequantize(w).double()
    linear = quant.quant_linear(None)
    for rows in (1, 3, 8, 13):
        x = torch.randn(rows, columns, generator=g)
        ref = x.double() @ dense.T
        out = linear(x, w)
        assert out.shape == (rows, 70)
        assert (out.double() - ref).abs().max() <= 1e-5 * ref.abs().max()
    x3 = torch.randn(2, 5, columns, generator=g)  # leading dimensions are kept
    assert linear(x3, w).shape == (2, 5, 70)


@pytest.mark.parametrize("name", KINDS)
def test_rows_do_not_depend_on_how_many_are_multiplied(kernels, name):
    g = torch.Generator().manual_seed(1)
    columns = 256 if KINDS[name] in SUPER else 64
    w = blocks_of(torch.randn(48, columns, generator=g), KINDS[name])
    x = torch.randn(21, columns, generator=g)
    together = kernels.linear(x, w.blocks, w.kind, columns)
    for rows in range(1, 21):  # every tile size and remainder
        for start in (0, 21 - rows):
            part = kernels.linear(x[start : start + rows].contiguous(), w.blocks, w.kind, columns)
            assert torch.equal(part, together[start : start + rows]), (rows, start)


@pytest.mark.parametrize("name", KINDS)
def test_int8_activations_are_the_quantised_rows_product(kernels, name):
    """int8=True is the dequantised weights times the activations rounded per row and 32 columns to
    int8 (scale max|x| / 127), and stays row-invariant."""
    g = torch.Generator().manual_seed(3)
    columns = 512 if KINDS[name] in SUPER else 96
    w = blocks_of(torch.randn(40, columns, generator=g), KINDS[name])
    dense = quant.dequantize(w).double()
    x = torch.randn(11, columns, generator=g)
    groups = x.view(11, -1, 32)
    scale = groups.abs().amax(-1, keepdim=True) / 127
    rounded = (torch.round(groups / scale).clamp(-127, 127) * scale).view(11, columns)
    ref = rounded.double() @ dense.T
    out = kernels.linear(x, w.blocks, w.kind, columns, True)
    assert (out.double() - ref).abs().max() <= 1e-5 * ref.abs().max()
    float_out = kernels.linear(x, w.blocks, w.kind, columns, False)
    assert (out - float_out).abs().max() > 1e-4 * float_out.abs().max()  # it really rounds the activations
    for start, rows in ((0, 1), (3, 5), (2, 9)):
        part = kernels.linear(x[start : start + rows].contiguous(), w.blocks, w.kind, columns, True)
        assert torch.equal(part, out[start : start + rows])


packed_only = pytest.mark.skipif("not quant.packed_int8()",
                                 reason="the packed int8 kernels need AVX2, FMA and F16C")


@packed_only
@pytest.mark.parametrize("name", KINDS)
def test_packed_int8_is_the_quantised_rows_product(kernels, name):
    """pack_int8 keeps the blocks' weights: the packed product is the dequantised weights times the
    activations rounded per row and group (32; Q6_K's 16, its scales' span) to int8, and a row's result
    depends on that row alone — on vpdpbusd (few rows: tiles of 16, then one of the rest) as on AMX
    (more than 24), to the bit."""
    g = torch.Generator().manual_seed(4)
    kind = KINDS[name]
    columns, group = (512 if kind in SUPER else 96), (16 if kind == KINDS["Q6_K"] else 32)
    w = blocks_of(torch.randn(48, columns, generator=g), kind)
    packed = quant.pack_int8(w)
    assert packed.packed and packed.out_features == 48 and quant.shape(packed) == (48, columns)
    dense = quant.dequantize(w).double()
    x = torch.randn(40, columns, generator=g)
    groups = x.view(40, -1, group)
    scale = groups.abs().amax(-1, keepdim=True) / 127
    rounded = (torch.round(groups / scale).clamp(-127, 127) * scale).view(40, columns)
    ref = rounded.double() @ dense.T
    linear = quant.quant_linear(None, int8=True)
    together = linear(x, packed)
    assert (together.double() - ref).abs().max() <= 1e-5 * ref.abs().max()
    for rows in (1, 2, 3, 4, 5, 8, 13, 16, 17, 24, 25, 33):
        for start in (0, 40 - rows):
            part = linear(x[start : start + rows].contiguous(), packed)
            assert torch.equal(part, together[start : start + rows]), (rows, start)


@pytest.mark.skipif("not quant.amx_int8()", reason="AMX-INT8 tiles are not granted on this CPU")
def test_packed_rows_are_the_same_on_vnni_and_amx(kernels):
    """The integer sums are exact on either instruction and the float steps are one function: forcing
    every row count onto one path or the other changes no bit."""
    g = torch.Generator().manual_seed(6)
    for kind in KINDS.values():
        columns = 512 if kind in SUPER else 128
        w = quant.pack_int8(blocks_of(torch.randn(32, columns, generator=g), kind))
        x = torch.randn(20, columns, generator=g)
        default = kernels.set_packed_rows(1000)
        try:
            on_vnni = kernels.linear(x, w.blocks, w.code, columns, True)
            kernels.set_packed_rows(0)
            on_amx = kernels.linear(x, w.blocks, w.code, columns, True)
        finally:
            kernels.set_packed_rows(default)
        assert torch.equal(on_vnni, on_amx), kind


@packed_only
@pytest.mark.parametrize("name", KINDS)
def test_packed_int8_at_the_largest_codes(kernels, name):
    """Every code at its largest and every activation at +127: the integer sums at their bounds (the AVX2
    products add int16 pair sums of several steps before widening, as far as that cannot overflow)."""
    kind = KINDS[name]
    columns = 512 if kind in SUPER else 128
    weight = torch.ones(32, columns)
    weight[:, ::32] = -1.0  # each group's largest magnitude first and negative: the others take the top code
    w = blocks_of(weight, kind)
    if kind in SUPER:  # every code byte 0xFF (Q4_K's nibbles 15, Q5_K's codes 31, Q6_K's 63), the scales kept
        raw = w.blocks.view(32, columns // 256, -1).clone()
        codes = {KINDS["Q4_K"]: slice(16, 144), KINDS["Q5_K"]: slice(16, 176)}.get(kind, slice(0, 192))
        raw[:, :, codes] = 255
        w = quant.QuantWeight(raw.view(32, -1).contiguous(), kind, columns)
    x = torch.ones(5, columns)
    ref = x.double() @ quant.dequantize(w).double().T  # ones are exact in int8 (127 / 127)
    out = quant.quant_linear(None, int8=True)(x, quant.pack_int8(w))
    assert (out.double() - ref).abs().max() <= 1e-5 * ref.abs().max()


@pytest.mark.skipif("not quant.packed_int8() or not quant.load().vnni()",
                    reason="needs AVX-512 VNNI to compare with (this CPU runs the AVX2 products only)")
def test_packed_rows_are_the_same_on_avx2_and_vnni(kernels):
    """vpmaddubsw's int16 pair sums, added before vpmaddwd only as far as they cannot overflow (and Q8_0's
    sign trick with 128 sum(x) added back), are vpdpbusd's integer sums, and the float steps the same:
    every block type, every row count, to the bit."""
    g = torch.Generator().manual_seed(7)
    for kind in KINDS.values():
        columns = 512 if kind in SUPER else 128
        w = quant.pack_int8(blocks_of(torch.randn(32, columns, generator=g), kind))
        x = torch.randn(37, columns, generator=g) * 4
        on_vnni = kernels.linear(x, w.blocks, w.code, columns, True)
        previous = kernels.set_vnni(False)
        try:
            assert not kernels.vnni()
            for rows in (37, 1, 9):
                on_avx2 = kernels.linear(x[:rows].contiguous(), w.blocks, w.code, columns, True)
                assert torch.equal(on_avx2, on_vnni[:rows]), (kind, rows)
        finally:
            kernels.set_vnni(previous)


@pytest.mark.skipif("not quant.packed_int8() or not quant.load().vnni()",
                    reason="needs AVX-512 VNNI to turn off (this CPU runs the AVX2 products only)")
def test_specdec_vnni_0_runs_the_avx2_products():
    """SPECDEC_VNNI=0 gives a process an AVX2 host's int8 path (what the path label then says)."""
    import subprocess
    import sys

    probe = "from specdec.modeling import quant; print(quant.packed_isa(), quant.load().vnni())"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "SPECDEC_VNNI": "0"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["avx2", "False"]


@packed_only
@pytest.mark.skipif("not quant.packed_int8() or not quant.load().amx_bf16()",
                    reason="the prompt rows' bfloat16 tiles need AMX-BF16 and the packed blocks (AVX-512 VNNI)")
@pytest.mark.parametrize("name", list(KINDS))
def test_prompt_rows_on_bf16_tiles_are_the_bfloat16_product(kernels, name):
    """Prompt rows (no logits) of packed blocks take AMX-BF16 tiles: the weights dequantised and the rows
    rounded to bfloat16, float sums; a row's result depends on that row alone, whatever the chunk."""
    g = torch.Generator().manual_seed(9)
    kind = KINDS[name]
    columns = 512 if kind in SUPER else 96
    w = blocks_of(torch.randn(48, columns, generator=g), kind)
    packed = quant.pack_int8(w)
    x = torch.randn(70, columns, generator=g)
    ref = x.bfloat16().double() @ quant.dequantize(w).bfloat16().double().T
    together = kernels.linear(x, packed.blocks, packed.code, columns, True, True)
    assert (together.double() - ref).abs().max() <= 1e-6 * ref.abs().max()
    for rows in (1, 5, 16, 17, 33, 64):
        for start in (0, 70 - rows):
            part = kernels.linear(x[start : start + rows].contiguous(), packed.blocks, packed.code, columns, True, True)
            assert torch.equal(part, together[start : start + rows]), (rows, start)
    previous = kernels.set_prompt_tiles(False)  # off: prompt rows take the int8 kernels like any others
    try:
        assert torch.equal(kernels.linear(x, packed.blocks, packed.code, columns, True, True),
                           kernels.linear(x, packed.blocks, packed.code, columns, True))
    finally:
        kernels.set_prompt_tiles(previous)


@pytest.mark.skipif("not quant.amx_int8() or not quant.load().amx_bf16()",
                    reason="AMX-INT8 and AMX-BF16 tiles are not granted on this CPU")
def test_tile_products_hand_back_the_tiles_as_found(kernels):
    """llama.cpp's AMX kernels configure a thread's tiles once and then assume them (a bench with its rows
    died of SIGILL after specdec's products ran on the same thread): each product restores the
    configuration it found."""
    assert kernels.tiles_left_as_found()


@packed_only
@pytest.mark.parametrize("name", KINDS)
def test_packed_blocks_read_about_the_files_bytes(kernels, name):
    """Decoding reads every weight once a token, so the packed layout may not grow the file: each type
    within 3 % of its blocks' bytes (Q4_K's superblock d and dmin once a 16 columns, 1.028x; as float32
    products a group it read 1.33x)."""
    kind = KINDS[name]
    columns = 512 if kind in SUPER else 96
    w = blocks_of(torch.randn(32, columns, generator=torch.Generator().manual_seed(6)), kind)
    ratio = quant.pack_int8(w).blocks.numel() / w.blocks.numel()
    assert 1.0 <= ratio <= 1.03, f"{name}: the packed blocks are {ratio:.3f}x the file's"


def test_packing_takes_whole_blocks_of_16_rows(kernels):
    w = blocks_of(torch.randn(20, 64), 3)
    assert quant.pack_int8(w) is w  # 20 rows: left to the AVX2 int8 kernels
    with pytest.raises(RuntimeError, match="multiple of 16"):
        kernels.pack_int8(w.blocks, w.kind, 64)
    packed = quant.pack_int8(blocks_of(torch.randn(16, 64), 3))
    with pytest.raises(ValueError, match="packed"):
        packed.rows(torch.arange(16))
    # a wrong in_features is refused; without AVX-512 VNNI, the packed layout itself is
    with pytest.raises(RuntimeError, match="layout" if quant.packed_int8() else "need AVX-512"):
        kernels.linear(torch.randn(2, 96), packed.blocks, packed.code, 96, True)


def test_parts_of_different_kinds_side_by_side(kernels):
    g = torch.Generator().manual_seed(2)
    a, b = blocks_of(torch.randn(8, 32, generator=g), 3), blocks_of(torch.randn(4, 32, generator=g), 8)
    fused = quant.fuse([a, b])
    assert isinstance(fused, quant.QuantParts) and quant.shape(fused) == (12, 32)
    same = quant.fuse([a, a])
    assert isinstance(same, quant.QuantWeight) and quant.shape(same) == (16, 32)
    x = torch.randn(3, 32, generator=g)
    out = quant.quant_linear(None)(x, fused)
    assert torch.equal(out, torch.cat([kernels.linear(x, a.blocks, 3, 32), kernels.linear(x, b.blocks, 8, 32)], -1))


def test_kernel_rejects_bad_shapes(kernels):
    w = blocks_of(torch.randn(4, 64), 3)
    with pytest.raises(RuntimeError, match="features"):
        kernels.linear(torch.randn(2, 32), w.blocks, w.kind, 64)
    with pytest.raises(RuntimeError, match="float32"):
        kernels.linear(torch.randn(2, 64).bfloat16(), w.blocks, w.kind, 64)
    with pytest.raises(RuntimeError, match="block type"):
        kernels.linear(torch.randn(2, 64), w.blocks, 12, 64)


def test_extension_turned_off_says_why(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECDEC_TEST_OFF", "0")
    ext = Extension(quant._extension.source, needs="AVX2", off_variable="SPECDEC_TEST_OFF", fallback="")
    assert ext.load() is None and "SPECDEC_TEST_OFF=0" in ext.reason


def test_a_build_killed_midway_does_not_block_later_loads(kernels):
    """torch's build lock is a file its builder deletes when done: a build killed midway left it behind, and
    every later process waited on it forever without a word. A load now takes it for a leftover (no other
    specdec process holds the build's flock) and goes on."""
    import subprocess
    import sys

    leftover = quant._extension.build_dir() / "lock"
    leftover.touch()
    load = "from specdec.modeling import quant; assert quant.load() is not None"
    done = subprocess.run([sys.executable, "-c", load], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert not leftover.exists()


@pytest.mark.parametrize("name", quant.FLOAT_KINDS)
def test_f16_and_bf16_matrices_are_their_float_product_whatever_the_rows(kernels, name):
    """An unquantised GGUF matrix runs as it is (2 bytes a weight): its product with float32 activations is
    the float product of its weights (int8 activations asked for or not), a row's result the same alone as
    among 13, and it is never repacked."""
    g = torch.Generator().manual_seed(7)
    w = quant.quantize(torch.randn(70, 96, generator=g), name)
    assert w.blocks.dtype == torch.uint8 and w.blocks.shape == (70, 192)
    dense = quant.dequantize(w).double()
    x = torch.randn(13, 96, generator=g)
    for int8 in (False, True):
        out = quant.quant_linear(None, int8=int8)(x, w)
        ref = x.double() @ dense.T
        assert (out.double() - ref).abs().max() <= 1e-6 * ref.abs().max()
        assert all(torch.equal(quant.quant_linear(None, int8=int8)(x[i : i + 1], w)[0], out[i]) for i in range(13))
    assert quant.pack_int8(w) is w
