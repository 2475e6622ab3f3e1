"""A built-in target's GGUF blocks as the lean backend's weights (`--weights gguf`).

The built-in models are 4-bit GGUF files; transformers loads them by dequantising to float, and a
float32 step then reads 4 bytes a weight (SmolLM2-135M: ~540 MB a token) where the file holds ~0.6
(~100 MB). This module reads the file's blocks for the linear layers and the LM head and hands them to
modeling/quant.cpp, which unpacks them in registers. The blocks dequantise to exactly the float32
weights transformers loaded (tests/test_quant.py checks every matrix), so the model is the same and
only float32 rounding differs (the order of the sums, and where each group's scale is applied);
activations stay float32.

Matrices whose block type the kernels do not read keep their float weights; the backend's
`numeric_path` says how much of the model ran on blocks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..config import BUILTIN_TARGETS, QUANTISED_WEIGHTS, WEIGHTS
from ..errors import SpecdecError
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


_COPY_FORMAT = 2


def _cached_copy(path: Path) -> Path:
    """Where GGUFWeights.read keeps its copy of `path`'s blocks: one per file, named by its name, size
    and where it lies. The copy records the file's modification time, so a changed file (a package
    reinstalled) is read again and its copy replaced, not joined by another (keyed by the time, every
    reinstall left a 96 MB copy behind)."""
    import hashlib

    from ..paths import cache_dir

    where = hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:12]
    return cache_dir() / "gguf-blocks" / f"{path.stem}-{path.stat().st_size}-{where}.safetensors"


def _copy_metadata(copy: Path) -> dict:
    import json

    from safetensors import safe_open

    with safe_open(str(copy), framework="pt") as f:
        return json.loads(f.metadata()["specdec"])


def _prune_copies(folder: Path, keep: Path) -> None:
    """Delete the copies of files that no longer exist (an uninstalled package) and those of the
    layout before (named by the file's time)."""
    for other in folder.glob("*.safetensors"):
        if other == keep:
            continue
        try:
            source = _copy_metadata(other).get("source")
        except Exception:  # unreadable, or not specdec's
            source = None
        if source is None or not Path(source).exists():
            other.unlink(missing_ok=True)
            other.with_name(other.name + ".lock").unlink(missing_ok=True)


@dataclass
class GGUFWeights:
    """The blocks of one GGUF file that quant.cpp reads, by GGUF tensor name."""

    path: Path
    arch: str
    tensors: dict[str, quant.QuantWeight]
    skipped: dict[str, str] = field(default_factory=dict)  # name -> block type the kernels do not read

    @classmethod
    def read(cls, path: Path) -> GGUFWeights:
        """The file's blocks, from a copy cached after the first read (gguf's reader parses every
        metadata field, the tokenizer's strings included: 3.7 s for SmolLM2's file here, 16.5 s for
        Gemma-3's, where the copy loads in 0.01 s); the copy is keyed by the file's size and time."""
        path = Path(path)
        copy = _cached_copy(path)
        if copy.is_file():
            try:
                return cls._load_copy(path, copy)
            except Exception:  # unreadable or from another layout: read the file again and rewrite it
                pass
        weights = cls._parse(path)
        weights._save_copy(copy)
        return weights

    def _save_copy(self, copy: Path) -> None:
        import json
        import os
        import tempfile

        from safetensors.torch import save_file

        from ..paths import locked

        meta = {"format": _COPY_FORMAT, "arch": self.arch, "skipped": self.skipped,
                "source": str(self.path.resolve()), "mtime_ns": self.path.stat().st_mtime_ns,
                "kinds": {name: w.kind for name, w in self.tensors.items()},
                "in_features": {name: w.in_features for name, w in self.tensors.items()}}
        try:
            copy.parent.mkdir(parents=True, exist_ok=True)
            with locked(copy):
                handle, tmp = tempfile.mkstemp(prefix=f".{copy.stem}-", suffix=".tmp", dir=copy.parent)
                os.close(handle)
                try:
                    save_file({name: w.blocks for name, w in self.tensors.items()}, tmp,
                              metadata={"specdec": json.dumps(meta)})
                    os.replace(tmp, copy)
                finally:
                    Path(tmp).unlink(missing_ok=True)
                _prune_copies(copy.parent, copy)
        except OSError:  # a read-only cache: the next load reads the file again
            pass

    @classmethod
    def _load_copy(cls, path: Path, copy: Path) -> GGUFWeights:
        import json

        from safetensors import safe_open

        with safe_open(str(copy), framework="pt") as f:
            meta = json.loads(f.metadata()["specdec"])
            if meta["format"] != _COPY_FORMAT:
                raise ValueError("another layout")
            if meta["mtime_ns"] != path.stat().st_mtime_ns:
                raise ValueError("the file changed since")
            tensors = {name: quant.QuantWeight(f.get_tensor(name), int(meta["kinds"][name]),
                                               int(meta["in_features"][name])) for name in f.keys()}
        return cls(path, meta["arch"], tensors, dict(meta["skipped"]))

    @classmethod
    def _parse(cls, path: Path) -> GGUFWeights:
        import gguf

        reader = gguf.GGUFReader(str(path))
        arch = bytes(reader.fields["general.architecture"].parts[-1]).decode()
        tensors, skipped = {}, {}
        for tensor in reader.tensors:
            if len(tensor.shape) != 2:
                continue
            kind = int(tensor.tensor_type)
            if kind in quant.KINDS.values():
                tensors[tensor.name] = quant.QuantWeight(torch.from_numpy(tensor.data.copy()), kind, int(tensor.shape[0]))
            else:
                skipped[tensor.name] = tensor.tensor_type.name
        return cls(path, arch, tensors, skipped)

    def layer(self, index: int, part: str, heads: int | None = None) -> quant.QuantWeight | None:
        """A layer's projection (q, k, v, o, gate, up, down) in transformers' row order, or None when
        the file's block type for it is not one the kernels read."""
        w = self.tensors.get(f"blk.{index}.{_LAYER_NAMES[part]}.weight")
        if w is not None and heads is not None and self.arch == "llama":
            w = _unpermute(w, heads)
        return w

    def lm_head(self) -> quant.QuantWeight | None:
        """The output projection (the token embedding where the file ties them)."""
        if "output.weight" in self.tensors or "output.weight" in self.skipped:
            return self.tensors.get("output.weight")
        return self.tensors.get("token_embd.weight")


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
    included: docs/results.md), and on AVX2-only CPUs float32 is what `auto` loads anyway. Any target loads in
    float32 under `--dtype auto` where its own weights are quantised to blocks (`--weights q8_0`, `q4_0`, or
    self-q4 for a target without a GGUF file)."""
    if dtype == "auto" and (weights in QUANTISED_WEIGHTS or blocks_drafter) and backend != "transformers" \
            and device == "cpu":
        return "float32"  # the blocks take float32 activations, whatever the target
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
        problems.append("the target is not a built-in GGUF model (smollm2-135m, gemma3-270m)")
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
