"""A GGUF file (llama.cpp's format, what Ollama and LM Studio hold) as a model specdec runs without a float copy.

`GGUFFile.open(path)` indexes the file once: where each tensor's blocks lie, its metadata as a transformers
config, and its tokenizer and chat template as transformers reads them. The index and the tokenizer are kept
in the cache (SPECDEC_CACHE, default ~/.cache/specdec, under gguf-files/), keyed by the file's path and size and
checked against its modification time, so a second load parses no metadata; the tokenizer is also kept by
its own content (gguf-tokenizers/), so another file with the same vocabulary (another quantisation of the
same model) does not build it again. The index is read by `_read_header`, which walks the metadata and the
tensor table without decoding the vocabulary (gguf's reader builds an object a token: seconds on a real
vocabulary), and falls back to gguf's reader for what it does not know; transformers reads the config from
a copy of the metadata without the vocabulary, for the same reason. The blocks are memory-mapped from the
file itself, never copied to disk.

`load_gguf_model` builds the transformers model on the meta device and fills only its small tensors (norms,
biases) from the file: the linear layers, the embedding and the LM head stay the file's blocks, which the lean
backend multiplies (backends/gguf.py) and looks rows up in. A block type the kernels do not read is
dequantised to float32 for that matrix alone (the stats say how much of the model ran on blocks).
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import shutil
import struct
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from .errors import SpecdecError
from .paths import cache_dir, locked

ARCHITECTURES = {"llama": "llama", "mistral": "mistral", "qwen2": "qwen2", "qwen3": "qwen3", "gemma3": "gemma3_text"}
"""GGUF's general.architecture -> transformers' model_type, for the architectures the lean backend runs."""

_INDEX_FORMAT = 2
_MAGIC = b"GGUF"


def _type_names() -> dict[int, str]:
    from gguf import GGMLQuantizationType

    return {int(t): t.name for t in GGMLQuantizationType}


def readable_types() -> dict[int, str]:
    """The block types a GGUF file may hold here: every type gguf-py dequantises (those quant.cpp does not
    multiply run on their dequantised float32 weights)."""
    from gguf import GGMLQuantizationType
    from gguf.quants import _type_traits

    kinds = {GGMLQuantizationType.F32, GGMLQuantizationType.F16, *_type_traits}
    return {int(k): GGMLQuantizationType(k).name for k in kinds}


@dataclass(frozen=True)
class TensorEntry:
    """Where one tensor lies in the file: ggml's type id, its shape outermost first (rows, columns for a
    matrix: transformers' order), and its bytes' offset and length."""

    kind: int
    shape: tuple[int, ...]
    offset: int
    nbytes: int


@dataclass(frozen=True)
class _Header:
    arch: str
    tensors: dict[str, TensorEntry]
    tokenizer_key: str | None
    """A hash of the bytes of every tokenizer.* metadata value: files with the same key build the same tokenizer
    (None: not known)."""


class _Walk:
    """The metadata of a GGUF v2/v3 file walked without decoding it: each pair's key, value type and byte
    range; raises (struct.error, KeyError, ValueError, ...) on what it does not know."""

    def __init__(self, blob):
        from gguf import GGUFReader

        self.blob, self.unpack = blob, struct.unpack_from
        self.scalars = {int(kind): np.dtype(t) for kind, t in GGUFReader.gguf_scalar_to_np.items()}
        self.version, self.tensor_count, kv_count = self.unpack("<IQQ", blob, 4)
        if self.version not in (2, 3):
            raise ValueError(f"GGUF version {self.version}")
        self.pairs: list[tuple[str, int, int, int, int]] = []
        """(key, value type, the pair's first byte, its value's first byte, the byte after it)"""
        pos = 24
        for _ in range(kv_count):
            key, at = self.string(pos)
            (kind,) = self.unpack("<I", blob, at)
            end = self.skip(at + 4, kind)
            self.pairs.append((key, kind, pos, at + 4, end))
            pos = end
        self.end = pos

    def string(self, at: int) -> tuple[str, int]:
        (length,) = self.unpack("<Q", self.blob, at)
        return self.blob[at + 8 : at + 8 + length].decode("utf-8"), at + 8 + length

    def skip(self, at: int, kind: int) -> int:
        if kind in self.scalars:
            return at + self.scalars[kind].itemsize
        if kind == 8:
            return at + 8 + self.unpack("<Q", self.blob, at)[0]
        if kind != 9:
            raise ValueError(f"metadata value type {kind}")
        element, count = self.unpack("<IQ", self.blob, at)
        at += 12
        if element in self.scalars:
            return at + count * self.scalars[element].itemsize
        for _ in range(count):
            at = self.skip(at, element)
        return at

    def value(self, kind: int, at: int):
        """A scalar or string value."""
        return self.string(at)[0] if kind == 8 else np.frombuffer(self.blob, self.scalars[kind], 1, at)[0]


@contextmanager
def _walked(path: Path):
    """The file memory-mapped and its metadata walked (_Walk), unmapped after."""
    with open(path, "rb") as f:
        blob = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    try:
        yield _Walk(blob)
    finally:
        blob.close()


def _read_header(path: Path) -> _Header:
    """The architecture and tensor table of a GGUF v2/v3 file, its metadata values skipped unread but the few
    it needs; raises (struct.error, KeyError, ValueError, ...) on what it does not know, for gguf's reader to say."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    with _walked(path) as walk:
        blob = walk.blob
        values, tokenizer = {}, hashlib.sha256()
        for key, kind, _, at, end in walk.pairs:
            if key in ("general.architecture", "general.alignment"):
                values[key] = walk.value(kind, at)
            if key.startswith("tokenizer."):
                tokenizer.update(key.encode() + blob[at - 4 : end])
        table, pos = [], walk.end
        for _ in range(walk.tensor_count):
            name, pos = walk.string(pos)
            (dims,) = walk.unpack("<I", blob, pos)
            shape = walk.unpack(f"<{dims}Q", blob, pos + 4)
            kind, offset = walk.unpack("<IQ", blob, pos + 4 + 8 * dims)
            pos += 4 + 8 * dims + 12
            block, size = GGML_QUANT_SIZES[GGMLQuantizationType(kind)]
            table.append((name, kind, tuple(int(n) for n in reversed(shape)), offset, int(np.prod(shape)) // block * size))
        alignment = int(values.get("general.alignment", 32))
        start = (pos + alignment - 1) // alignment * alignment
        tensors = {name: TensorEntry(kind, shape, start + offset, nbytes) for name, kind, shape, offset, nbytes in table}
        return _Header(values["general.architecture"], tensors, tokenizer.hexdigest()[:16])


def _settings_only(path: Path, out: Path) -> int | None:
    """Write to `out` a GGUF file of `path`'s metadata without its tokenizer arrays (vocabulary, scores,
    merges: what makes gguf's reader take seconds) and without tensors, for transformers to read the config
    from; returns the vocabulary's size (None: the file lists no tokens)."""
    with _walked(path) as walk:
        blob = walk.blob
        kept = [(first, end) for key, kind, first, _, end in walk.pairs if not (key.startswith("tokenizer.") and kind == 9)]
        tokens = next((walk.unpack("<Q", blob, at + 4)[0] for key, kind, _, at, _ in walk.pairs
                       if key == "tokenizer.ggml.tokens" and kind == 9), None)
        with open(out, "wb") as f:
            f.write(_MAGIC + struct.pack("<IQQ", walk.version, 0, len(kept)))
            for first, end in kept:
                f.write(blob[first:end])
        return None if tokens is None else int(tokens)


def _read_header_with_gguf(path: Path) -> _Header:
    """What _read_header gives, by gguf's reader (slow on a real vocabulary; it reads what the quick walk does
    not know, and says what is wrong with a damaged file); no tokenizer key."""
    import gguf

    try:
        reader = gguf.GGUFReader(str(path))
    except Exception as exc:  # a truncated or damaged file: gguf raises ValueError, struct.error, IndexError...
        raise SpecdecError(f"cannot read the GGUF file {str(path)!r}: {type(exc).__name__}: {exc}. The file is "
                           "damaged or truncated (an interrupted download?): download or convert it again") from None
    field = reader.fields.get("general.architecture")
    if field is None:
        raise SpecdecError(f"the GGUF file {str(path)!r} names no architecture (general.architecture): it is not a "
                           "model file llama.cpp would load")
    tensors = {t.name: TensorEntry(int(t.tensor_type), tuple(int(n) for n in reversed([int(x) for x in t.shape])),
                                   int(t.data_offset), int(t.n_bytes)) for t in reader.tensors}
    return _Header(bytes(field.parts[-1]).decode(), tensors, None)


def _index_dir(path: Path) -> Path:
    where = hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:12]
    return cache_dir() / "gguf-files" / f"{path.stem}-{path.stat().st_size}-{where}"


def _check_header(path: Path) -> None:
    """A clear error for what is not a GGUF file at all (before gguf's reader fails on it)."""
    if not path.is_file():
        raise SpecdecError(f"GGUF file {str(path)!r} does not exist")
    with open(path, "rb") as f:
        head = f.read(8)
    if len(head) < 8 or head[:4] != _MAGIC:
        raise SpecdecError(f"{str(path)!r} is not a GGUF file (it does not start with the bytes 'GGUF'): give a .gguf "
                           "file as llama.cpp's convert_hf_to_gguf.py or a model hub writes it")


class GGUFFile:
    """A GGUF file's tensor index, architecture and (lazily) transformers config and tokenizer."""

    def __init__(self, path: Path, arch: str, tensors: dict[str, TensorEntry], index_dir: Path,
                 tokenizer_key: str | None = None):
        self.path, self.arch, self.tensors, self.index_dir = path, arch, tensors, index_dir
        self.tokenizer_key = tokenizer_key
        self._map: np.ndarray | None = None

    @classmethod
    def open(cls, path: str | Path) -> GGUFFile:
        """The file's index: from the cache where it was made for this very file, else made now (and cached)."""
        path = Path(path)
        _check_header(path)
        folder = _index_dir(path)
        index = folder / "index.json"
        mtime = path.stat().st_mtime_ns
        cached = cls._read_index(path, index, mtime)
        if cached is not None:
            return cached
        with locked(folder):
            cached = cls._read_index(path, index, mtime)
            if cached is not None:
                return cached
            made = cls._index(path, folder)
            made._write_index(mtime)
            return made

    @classmethod
    def _read_index(cls, path: Path, index: Path, mtime: int) -> GGUFFile | None:
        try:
            meta = json.loads(index.read_text())
        except (OSError, ValueError):
            return None
        if meta.get("format") != _INDEX_FORMAT or meta.get("mtime_ns") != mtime:
            return None
        tensors = {name: TensorEntry(kind, tuple(shape), offset, nbytes)
                   for name, (kind, shape, offset, nbytes) in meta["tensors"].items()}
        return cls(path, meta["arch"], tensors, index.parent, meta.get("tokenizer_key"))

    @classmethod
    def _index(cls, path: Path, folder: Path) -> GGUFFile:
        try:
            header = _read_header(path)
        except Exception:  # what the quick reader does not know (or a damaged file): gguf's reader says what
            header = _read_header_with_gguf(path)
        size = path.stat().st_size
        for name, e in header.tensors.items():
            if e.offset + e.nbytes > size:
                raise SpecdecError(f"the GGUF file {str(path)!r} is truncated: tensor {name} ends at byte "
                                   f"{e.offset + e.nbytes}, the file holds {size}. Download or convert it again")
        return cls(path, header.arch, header.tensors, folder, header.tokenizer_key)

    def _write_index(self, mtime: int) -> None:
        meta = {"format": _INDEX_FORMAT, "source": str(self.path.resolve()), "mtime_ns": mtime, "arch": self.arch,
                "tokenizer_key": self.tokenizer_key,
                "tensors": {name: [e.kind, list(e.shape), e.offset, e.nbytes] for name, e in self.tensors.items()}}
        try:
            self.index_dir.mkdir(parents=True, exist_ok=True)
            _write_atomic(self.index_dir / "index.json", json.dumps(meta))
        except OSError:  # a read-only cache: the next load indexes the file again
            pass

    # -- the blocks ------------------------------------------------------------------------------------

    def _mapped(self) -> np.ndarray:
        if self._map is None:
            # copy-on-write: torch wants writable memory; nothing writes, so every page stays the file's
            self._map = np.memmap(self.path, dtype=np.uint8, mode="c")
        return self._map

    def raw(self, name: str) -> np.ndarray:
        """A tensor's bytes, memory-mapped: (rows, bytes of a row) for a matrix, flat for a vector."""
        e = self.tensors[name]
        data = self._mapped()[e.offset : e.offset + e.nbytes]
        return data.reshape(e.shape[0], -1) if len(e.shape) == 2 else data

    def dense(self, name: str) -> torch.Tensor:
        """A tensor dequantised to float32, in its shape (outermost first)."""
        from gguf.quants import dequantize

        e = self.tensors[name]
        if e.kind not in readable_types():
            raise SpecdecError(f"{self.path.name}: tensor {name} has block type {_type_names().get(e.kind, e.kind)}, "
                               f"which specdec cannot read (it reads {', '.join(readable_types().values())})")
        values = dequantize(np.ascontiguousarray(self.raw(name)), e.kind)
        return torch.from_numpy(np.array(values, dtype=np.float32).reshape(e.shape))

    def release_pages(self) -> None:
        """Drop the file's pages from this process's resident set (after the blocks were repacked into memory:
        pages still read are mapped in again from the page cache)."""
        if self._map is not None and hasattr(self._map, "_mmap") and hasattr(mmap, "MADV_DONTNEED"):
            try:
                self._map._mmap.madvise(mmap.MADV_DONTNEED)
            except (OSError, ValueError):
                pass

    # -- what transformers reads from the metadata -------------------------------------------------------

    def model_type(self) -> str:
        if self.arch not in ARCHITECTURES:
            raise SpecdecError(f"{self.path.name}: the GGUF architecture {self.arch!r} does not run here; specdec runs "
                               f"{', '.join(ARCHITECTURES)} GGUF files")
        return ARCHITECTURES[self.arch]

    def config(self):
        """The transformers config of the model the file holds (cached beside the index)."""
        from transformers import AutoConfig

        self.model_type()
        saved = self.index_dir / "config.json"
        if not saved.is_file():
            from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

            with locked(saved):
                if not saved.is_file():
                    try:
                        parsed = self._parsed_config(load_gguf_checkpoint)
                    except (ValueError, KeyError, NotImplementedError) as exc:
                        raise SpecdecError(f"cannot read the model's settings from {self.path.name}: {exc}") from None
                    model_type = parsed.pop("model_type")
                    parsed.pop("_model_name_or_path", None)
                    q = self.tensors.get("blk.0.attn_q.weight")
                    if q is not None and parsed.get("num_attention_heads"):  # not every architecture's keys carry it
                        parsed["head_dim"] = q.shape[0] // parsed["num_attention_heads"]
                    config = AutoConfig.for_model(model_type, **parsed)
                    self._save(lambda d: config.save_pretrained(d), "config.json")
        return AutoConfig.from_pretrained(str(self.index_dir), local_files_only=True)

    def _parsed_config(self, load_gguf_checkpoint) -> dict:
        """transformers' config keys of the file, read from a copy of its metadata without the tokenizer's
        arrays (Gemma-3's 262 k tokens: 10 s in gguf's reader for the whole file); what transformers takes from
        the arrays and the tensors (the vocabulary's size where the architecture's keys omit it, whether the
        output matrix is the embedding's) set as it sets them. The whole file where the walk fails."""
        self.index_dir.mkdir(parents=True, exist_ok=True)
        handle, settings = tempfile.mkstemp(prefix=".settings-", suffix=".gguf", dir=self.index_dir)
        os.close(handle)
        try:
            try:
                tokens = _settings_only(self.path, Path(settings))
            except Exception:  # what the walk does not know: gguf's reader on the whole file
                return load_gguf_checkpoint(str(self.path), return_tensors=False)["config"]
            from transformers.utils import logging as transformers_logging

            level = transformers_logging.get_verbosity()
            transformers_logging.set_verbosity_error()  # its warning of a vocabulary size not found: set below
            try:
                parsed = load_gguf_checkpoint(settings, return_tensors=False)["config"]
            finally:
                transformers_logging.set_verbosity(level)
        finally:
            Path(settings).unlink(missing_ok=True)
        parsed["tie_word_embeddings"] = "output.weight" not in self.tensors
        if "vocab_size" not in parsed and tokens is not None:
            parsed["vocab_size"] = tokens
        return parsed

    @contextmanager
    def _config_read_fast(self):
        """While transformers builds the tokenizer, its load_gguf_checkpoint gives this file's config by
        _parsed_config: AutoTokenizer reads the whole file with gguf's reader only to learn the model type
        (Gemma-3-270M: 18 of its 22 s); it reads the vocabulary itself with its own quick reader."""
        import transformers.modeling_gguf_pytorch_utils as gguf_utils

        original = gguf_utils.load_gguf_checkpoint

        def load(path, return_tensors=False, **kwargs):
            if return_tensors or kwargs or Path(path).resolve() != self.path.resolve():
                return original(path, return_tensors, **kwargs)
            return {"config": self._parsed_config(original)}

        gguf_utils.load_gguf_checkpoint = load
        try:
            yield
        finally:
            gguf_utils.load_gguf_checkpoint = original

    def tokenizer(self):
        """The file's tokenizer and chat template, as transformers builds them from the metadata (cached: by the
        metadata's content where the index has its key, else beside the index)."""
        from transformers import AutoTokenizer

        if self.tokenizer_key is not None:
            home, name = cache_dir() / "gguf-tokenizers", self.tokenizer_key
        else:
            home, name = self.index_dir, "tokenizer"
        folder = home / name
        if not (folder / "tokenizer_config.json").is_file():
            with locked(folder):
                if not (folder / "tokenizer_config.json").is_file():
                    try:
                        with self._config_read_fast():
                            tokenizer = AutoTokenizer.from_pretrained(str(self.path.parent), gguf_file=self.path.name)
                    except Exception as exc:  # transformers' GGUF tokenizer conversion raises many kinds
                        raise SpecdecError(f"cannot build the tokenizer from {self.path.name}'s metadata: "
                                           f"{type(exc).__name__}: {exc}") from None
                    _save_folder(home, name, lambda d: tokenizer.save_pretrained(d))
        return AutoTokenizer.from_pretrained(str(folder), local_files_only=True)

    def _save(self, write, name: str) -> None:
        _save_folder(self.index_dir, name, write)


def _save_folder(home: Path, name: str, write) -> None:
    """Write `name` into `home` through a staging folder (a reader never sees it half-written)."""
    home.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=home))
    try:
        write(staging)
        target = home / name
        if name.endswith(".json"):
            os.replace(staging / name, target)
        else:
            shutil.rmtree(target, ignore_errors=True)
            staging.rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _write_atomic(path: Path, text: str) -> None:
    handle, tmp = tempfile.mkstemp(prefix=f".{path.name}-", dir=path.parent)
    try:
        with os.fdopen(handle, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)


def is_gguf_path(name: str) -> bool:
    """Whether a model name means a GGUF file (by its suffix, or an existing file that is not a directory)."""
    return isinstance(name, str) and (name.lower().endswith(".gguf") or (os.path.isfile(name) and _starts_gguf(name)))


def _starts_gguf(name: str) -> bool:
    try:
        with open(name, "rb") as f:
            return f.read(4) == _MAGIC
    except OSError:
        return False


_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def load_gguf_model(path: str | Path, device: str = "cpu"):
    """The transformers model a GGUF file holds, on the meta device but for its small tensors (norms, biases,
    rotary tables), which come from the file; the linear layers, embedding and LM head stay the file's blocks
    (backends/gguf.GGUFWeights serves them). Returns (model, tokenizer, GGUFFile)."""
    from transformers import AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor

    if torch.device(device).type != "cpu":
        raise SpecdecError(f"a GGUF file runs on the CPU (its blocks are multiplied by quant.cpp), not on {device}")
    file = GGUFFile.open(path)
    model_type = file.model_type()
    config = file.config()
    tokenizer = file.tokenizer()
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.eval()
    gguf_arch = "gemma3" if model_type == "gemma3_text" else model_type
    processor = TENSOR_PROCESSORS.get(gguf_arch, TensorProcessor)(config=config.to_dict())
    names = _gguf_names(model, gguf_arch, config.num_hidden_layers)
    params = dict(model.named_parameters())
    missing = [hf for gguf_name, hf in names.items() if gguf_name not in file.tensors
               and not hf.endswith(("lm_head.weight",)) and hf in params]
    if missing:
        raise SpecdecError(f"{file.path.name} lacks tensors a {model_type} model needs, e.g. "
                           f"{', '.join(sorted(missing)[:3])}: it is not a complete {file.arch} model file")
    for gguf_name, hf_name in names.items():
        if gguf_name not in file.tensors or hf_name not in params:
            continue
        if hf_name.endswith(".weight") and hf_name.rsplit(".", 2)[-2] in (*_PROJECTIONS, "embed_tokens", "lm_head"):
            continue  # blocks: read by GGUFWeights
        values = processor.process(file.dense(gguf_name).numpy(), gguf_name).weights
        tensor = torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32))
        expected = params[hf_name].shape
        if tuple(tensor.shape) != tuple(expected):
            raise SpecdecError(f"{file.path.name}: tensor {gguf_name} is {tuple(tensor.shape)}, the model's settings "
                               f"want {tuple(expected)}: the file's metadata and tensors disagree")
        module_name, _, attr = hf_name.rpartition(".")
        model.get_submodule(module_name)._parameters[attr] = torch.nn.Parameter(tensor, requires_grad=False)
    for module_name, module in list(model.named_modules()):
        if type(module).__name__.endswith("RotaryEmbedding"):  # its tables are buffers made at init: make them here
            parent, _, attr = module_name.rpartition(".")
            with torch.device("cpu"):
                setattr(model.get_submodule(parent) if parent else model, attr, type(module)(config=config))
    return model, tokenizer, file


def _gguf_names(model, gguf_arch: str, layers: int) -> dict[str, str]:
    """GGUF tensor name -> the transformers parameter it holds, by gguf-py's own name map (built once:
    transformers' get_gguf_hf_weights_map builds it again for every submodule, seconds for a 7 B model)."""
    from gguf import MODEL_ARCH_NAMES, get_tensor_name_map

    arch = next(key for key, value in MODEL_ARCH_NAMES.items() if value == gguf_arch)
    name_map = get_tensor_name_map(arch, layers)
    names = {}
    for hf_name in model.state_dict():
        base, _, suffix = hf_name.rpartition(".")
        gguf_name = name_map.get_name(base)
        if gguf_name is not None:
            names[f"{gguf_name}.{suffix}"] = hf_name
    return names
