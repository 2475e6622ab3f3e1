"""A GGUF file's blocks as the lean backend's weights: a built-in target's (`--weights gguf`) or a .gguf target's.

The built-in models are 4-bit GGUF files; transformers loads them by dequantising to float, and a
float32 step then reads 4 bytes a weight (SmolLM2-135M: ~540 MB a token) where the file holds ~0.6
(~100 MB). This module reads the file's blocks for the linear layers and the LM head and hands them to
modeling/quant.cpp, which unpacks them in registers. The blocks dequantise to exactly the float32
weights transformers loaded (tests/test_quant.py checks every matrix), so the model is the same and
only float32 rounding differs (the order of the sums, and where each group's scale is applied);
activations stay float32.

Matrices whose block type the kernels do not read keep their float weights (a .gguf target's are
dequantised from the file for those matrices alone); the backend's `numeric_path` says how much of the
model ran on blocks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from ..config import BUILTIN_TARGETS, QUANTISED_WEIGHTS, WEIGHTS
from ..errors import SpecdecError
from ..gguf_file import GGUFFile, is_gguf_path, readable_types
from ..modeling import quant

_LAYER_NAMES = {"q": "attn_q", "k": "attn_k", "v": "attn_v", "o": "attn_output", "gate": "ffn_gate", "up": "ffn_up",
                "down": "ffn_down"}


def _unpermute(w: quant.QuantWeight, heads: int) -> quant.QuantWeight:
    """Undo llama.cpp's rotary permutation of a Llama q or k projection's output rows (what
    transformers' GGUF loader does to the dequantised matrix; rows of blocks move whole)."""
    n = w.out_features
    half = n // heads // 2
    order = torch.arange(n).reshape(heads, half, 2).transpose(1, 2).reshape(n)
    return w.rows(order)


@dataclass
class GGUFWeights:
    """The blocks of one GGUF file that quant.cpp reads, by GGUF tensor name, memory-mapped from the file
    (gguf_file.GGUFFile indexes it once and caches the index, so a second load parses nothing)."""

    path: Path | None
    arch: str
    tensors: dict[str, quant.QuantWeight]
    skipped: dict[str, str] = field(default_factory=dict)  # name -> block type the kernels do not read
    file: GGUFFile | None = None

    @classmethod
    def read(cls, path: Path | GGUFFile) -> GGUFWeights:
        file = path if isinstance(path, GGUFFile) else GGUFFile.open(path)
        tensors, skipped = {}, {}
        names = readable_types()
        for name, entry in file.tensors.items():
            if len(entry.shape) != 2:
                continue
            on_kernels = entry.kind in quant.KINDS.values() or (entry.kind in quant.FLOAT_KINDS.values()
                                                                  and entry.shape[1] % 8 == 0)
            if on_kernels:
                tensors[name] = quant.QuantWeight(torch.from_numpy(file.raw(name)), entry.kind, entry.shape[1])
            else:
                skipped[name] = names.get(entry.kind, str(entry.kind))
        return cls(file.path, file.arch, tensors, skipped, file)

    def layer(self, index: int, part: str, heads: int | None = None) -> quant.QuantWeight | None:
        """A layer's projection (q, k, v, o, gate, up, down) in transformers' row order, or None when
        the file's block type for it is not one the kernels read."""
        w = self.tensors.get(f"blk.{index}.{_LAYER_NAMES[part]}.weight")
        if w is not None and heads is not None and self.arch == "llama":
            w = _unpermute(w, heads)
        return w

    def _head_name(self) -> str:
        return "output.weight" if "output.weight" in self.tensors or "output.weight" in self.skipped else "token_embd.weight"

    def lm_head(self) -> quant.QuantWeight | None:
        """The output projection (the token embedding where the file ties them)."""
        return self.tensors.get(self._head_name())

    def dense_layer(self, index: int, part: str, heads: int | None = None) -> torch.Tensor:
        """A layer's projection dequantised to float32 (a block type the kernels do not read), in
        transformers' row order."""
        w = self._dense(f"blk.{index}.{_LAYER_NAMES[part]}.weight")
        if heads is not None and self.arch == "llama":
            n = w.shape[0]
            w = w.reshape(heads, n // heads // 2, 2, -1).transpose(1, 2).reshape(n, -1)
        return w

    def dense_head(self) -> torch.Tensor:
        return self._dense(self._head_name())

    def _dense(self, name: str) -> torch.Tensor:
        if self.file is None:
            raise SpecdecError(f"tensor {name} has no blocks the kernels read, and no file to dequantise it from")
        return self.file.dense(name)

    def embedding(self) -> EmbeddingRows:
        """The token embedding, rows dequantised as they are looked up."""
        if self.file is None or "token_embd.weight" not in self.file.tensors:
            raise SpecdecError("the GGUF file holds no token embedding (token_embd.weight)")
        return EmbeddingRows(self.file, "token_embd.weight")


class EmbeddingRows:
    """A GGUF file's token embedding as blocks: `rows[ids]` dequantises just those rows to float32 (the
    whole table in float32 would be 0.5-2 GB for a 7 B model's vocabulary)."""

    def __init__(self, file: GGUFFile, name: str):
        self.blocks = file.raw(name)
        self.kind = file.tensors[name].kind
        self.shape = file.tensors[name].shape
        self.device = torch.device("cpu")
        self.dtype = torch.float32

    def __getitem__(self, ids: torch.Tensor) -> torch.Tensor:
        from gguf.quants import dequantize

        flat = ids.reshape(-1).numpy()
        values = dequantize(np.ascontiguousarray(self.blocks[flat]), self.kind)
        return torch.from_numpy(np.array(values, dtype=np.float32).reshape(*ids.shape, self.shape[1]))


class QuantisedWeights:
    """A float model's linear layers and LM head quantised at load to one GGUF block type (`--weights q8_0`,
    `q4_0`), served to the lean backend as GGUFWeights serves a file's: by layer and projection, in
    transformers' row order. Matrices that are not a whole number of blocks wide keep their float weights
    (the backend's numeric_path says how much ran on blocks)."""

    def __init__(self, model, kind: str):
        self.kind = kind
        width = quant.block_width(kind)

        def blocks(weight: torch.Tensor) -> quant.QuantWeight | None:
            return quant.quantize(weight, kind) if weight.shape[-1] % width == 0 else None

        names = {"q": "self_attn.q_proj", "k": "self_attn.k_proj", "v": "self_attn.v_proj", "o": "self_attn.o_proj",
                 "gate": "mlp.gate_proj", "up": "mlp.up_proj", "down": "mlp.down_proj"}
        with torch.no_grad():
            self.layers = [{part: blocks(layer.get_submodule(name).weight) for part, name in names.items()}
                           for layer in model.model.layers]
            self.head = blocks(model.get_output_embeddings().weight)

    def layer(self, index: int, part: str, heads: int | None = None) -> quant.QuantWeight | None:
        return self.layers[index][part]

    def lm_head(self) -> quant.QuantWeight | None:
        return self.head


def quantised_weights(choice: str, model, dtype: torch.dtype, backend: str) -> QuantisedWeights:
    """`--weights q8_0` or `q4_0`: the model's float weights as those blocks, or a clear error saying what
    stands in the way."""
    problems = []
    if dtype != torch.float32:
        problems.append(f"the blocks run with float32 activations, and the dtype is {str(dtype).removeprefix('torch.')} "
                        "(use --dtype float32 or auto)")
    if backend == "transformers":
        problems.append("the transformers backend runs float weights only (use --backend lean or auto, for an "
                        "architecture the lean backend runs)")
    if not problems and quant.load() is None:
        problems.append(f"the GGUF kernels cannot run here: {quant.unavailable_reason()}")
    if problems:
        raise SpecdecError(f"--weights {choice}: " + "; ".join(problems))
    return QuantisedWeights(model, QUANTISED_WEIGHTS[choice])


def load_dtype(dtype: str, weights: str, target: str, backend: str = "auto", device: str = "cpu",
               blocks_drafter: bool = False) -> str:
    """The dtype to load `target` in: `dtype`, except that `--dtype auto` loads a built-in GGUF target for
    the lean backend in float32 (the only dtype the blocks take) where the blocks are asked for
    (`--weights gguf` or `gguf-int8`, or a drafter that drafts on them: `blocks_drafter`, self-q4), and,
    under `--weights auto`, where quant.cpp's packed int8 kernels run (AVX2 and F16C): its blocks with int8
    activations then run plain decoding ~2x faster than bf16 on kernels.cpp (AVX-512 BF16, AMX tiles
    included: docs/benchmarks.md's log), and on AVX2-only CPUs float32 is what `auto` loads anyway. Any target loads in
    float32 under `--dtype auto` where its own weights are quantised to blocks (`--weights q8_0`, `q4_0`, or
    self-q4 for a target without a GGUF file)."""
    if dtype == "auto" and (weights in QUANTISED_WEIGHTS or blocks_drafter) and backend != "transformers" \
            and device == "cpu":
        return "float32"  # the blocks take float32 activations, whatever the target
    if is_gguf_path(target):  # a .gguf target runs on its blocks only, which take float32 activations
        return "float32" if dtype == "auto" else dtype
    if dtype != "auto" or target not in BUILTIN_TARGETS or backend == "transformers" or device != "cpu":
        return dtype
    if weights in ("gguf", "gguf-int8") or (weights == "auto" and quant.packed_int8()):  # blocks_drafter: above
        return "float32"
    return dtype


def choose_weights(choice: str, gguf_path: Path | None, dtype: torch.dtype, dtype_choice: str, backend: str,
                   asked_by: str | None = None) -> Path | None:
    """The GGUF file the lean backend should read its weights from, or None for float weights.

    `auto` takes the blocks (with int8 activations: target_backend) only where they were measured
    faster than the float path: float32 activations chosen by --dtype auto (a CPU without AVX-512
    BF16, where kernels.cpp cannot run, or one with AVX-512 VNNI: load_dtype), the lean backend, a
    built-in GGUF target and a CPU that runs quant.cpp. `gguf` and `gguf-int8` insist, and say what
    stands in the way (naming `asked_by`, e.g. a
    drafter that needs the blocks)."""
    if choice not in WEIGHTS:
        raise SpecdecError(f"unknown --weights {choice!r}: use {', '.join(WEIGHTS)}")
    if choice == "float" or choice in QUANTISED_WEIGHTS:  # the latter: quantised_weights
        return None
    insist = choice != "auto"
    problems = []
    if gguf_path is None:
        problems.append("the target is not a GGUF model (a built-in, smollm2-135m or gemma3-270m, or a .gguf file)")
    if dtype != torch.float32:
        problems.append(f"GGUF blocks run with float32 activations, and the dtype is {str(dtype).removeprefix('torch.')} "
                        "(use --dtype float32 or auto)")
    if backend == "transformers":
        problems.append("the transformers backend runs float weights only (use --backend lean or auto)")
    if not insist:
        if problems or dtype_choice != "auto" or quant.load() is None:
            return None
        return gguf_path
    if not problems and quant.load() is None:
        problems.append(f"the GGUF kernels cannot run here: {quant.unavailable_reason()}")
    if problems:
        raise SpecdecError(f"{asked_by or '--weights ' + choice}: " + "; ".join(problems))
    return gguf_path
