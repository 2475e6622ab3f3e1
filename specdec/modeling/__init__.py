"""The one model implementation: a KV cache written by position, RoPE tables, and a decoder layer
that runs on ATen or on kernels.cpp. The lean backend (Llama, Mistral, Qwen2, Qwen3, Gemma-3 targets) and the trained
drafters' networks are both built from it."""

from .cache import KVCache
from .decoder import KERNEL_ROWS, Arch, Decoder, LayerWeights, Segment, Taps, causal_attend, layer_aten, rms_norm
from .rope import RopeTable, rotary_module_angles, rotate, theta_angles

__all__ = ["KVCache", "KERNEL_ROWS", "Arch", "Decoder", "LayerWeights", "Segment", "Taps", "causal_attend", "layer_aten",
           "rms_norm", "RopeTable", "rotary_module_angles", "rotate", "theta_angles"]
