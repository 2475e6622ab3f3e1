"""The lean backend's compute path is chosen in one function and named by one label."""

import pytest
import torch

from specdec.backends.compute_path import ComputePath, choose_path
from specdec.errors import SpecdecError
from specdec.modeling import kernels, quant

CPU = torch.device("cpu")


def test_labels_name_each_path():
    assert ComputePath(packed=True).label == "lean"
    assert ComputePath(kernels=True).label == "lean+kernels"
    assert ComputePath(kernels=True, tiles=True).label == "lean+tiles"
    assert ComputePath(blocks="gguf").label == "lean+gguf"
    assert ComputePath(blocks="q4_0", int8=True).label == "lean+q4_0-int8"
    assert ComputePath(blocks="gguf", int8=True, repacked_for="vnni").label == "lean+gguf-int8+vnni"


def test_float32_runs_on_onednn_and_never_on_the_bf16_kernels():
    path = choose_path("llama", torch.float32, CPU)
    assert not path.kernels and not path.tiles and path.blocks is None


def test_bf16_kernels_only_for_the_architectures_they_know():
    assert not choose_path("qwen3", torch.bfloat16, CPU).kernels
    assert not choose_path("llama", torch.bfloat16, CPU, use_kernels=False).kernels
    assert choose_path("llama", torch.bfloat16, CPU).kernels == (kernels.load() is not None)
    assert not choose_path("llama", torch.bfloat16, CPU, use_tiles=False).tiles


def test_blocks_need_float32_on_the_cpu():
    with pytest.raises(SpecdecError, match="float32"):
        choose_path("llama", torch.bfloat16, CPU, blocks="gguf")


@pytest.mark.skipif(quant.load() is None, reason="quant.cpp does not run here (needs AVX2, FMA and F16C)")
def test_int8_blocks_are_repacked_for_this_cpu_unless_asked_not_to():
    path = choose_path("llama", torch.float32, CPU, blocks="gguf", int8=True)
    assert path.repacked_for == quant.packed_isa()
    assert choose_path("llama", torch.float32, CPU, blocks="gguf", int8=True, repack=False).repacked_for is None
    assert choose_path("llama", torch.float32, CPU, blocks="gguf").repacked_for is None  # float32 activations


@pytest.mark.skipif(quant.load() is None, reason="quant.cpp does not run here (needs AVX2, FMA and F16C)")
def test_the_kv_cache_is_float16_with_int8_activations_only(monkeypatch):
    assert choose_path("llama", torch.float32, CPU, blocks="gguf", int8=True).half_cache
    assert not choose_path("llama", torch.float32, CPU, blocks="gguf").half_cache  # the float model's arithmetic
    assert not choose_path("llama", torch.float32, CPU, blocks="gguf", int8=True, half_cache=False).half_cache
    monkeypatch.setenv("SPECDEC_KV_CACHE", "f32")
    assert not choose_path("llama", torch.float32, CPU, blocks="gguf", int8=True).half_cache
