"""User-scale benchmark models anyone can write offline, as GGUF files (`specdec make-model`).

No 1-8 B model is at hand offline, so the benchmark writes its own:

- `write_random`: a Llama or Qwen2 model at a named size (`SIZES`) with random weights, every matrix in one
  block type (Q8_0, Q4_0, Q4_K, ...): pure cost, for timing plain decoding and prefill against llama.cpp.
- `write_padded`: a built-in Llama GGUF (SmolLM2-135M) embedded in a wider model whose every added weight is
  zero: the hidden size 4x (the norms' weights halved and their epsilon quartered, so every norm's output is
  the small model's to the bit: powers of two), more heads and a wider MLP whose added rows and columns are
  zero blocks, and zero layers (the residual passes through them unchanged). Its text, and so every
  acceptance rate, is the small model's, while each step reads as many bytes as a 1.7 B or 7 B model.
- `write_deepened` (what `write_padded` does with a Gemma-3 file, the built-in Gemma-3-270M): its own width,
  zero layers added and the MLP widened by zero columns, the same logits at a 1.7 B or 8.6 B model's cost.

All copy the tokenizer and chat template from the source file, so they load and chat as it does, in
specdec and in llama.cpp alike. Tensors are written one at a time (a 7 B file never sits in memory).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import SpecdecError


@dataclass(frozen=True)
class Shape:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    ffn: int
    head_dim: int = 64

    def params(self, vocab: int, tied: bool = True) -> int:
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        layer = self.hidden * (2 * q + 2 * kv) + 3 * self.hidden * self.ffn
        return self.layers * layer + vocab * self.hidden * (1 if tied else 2)


SIZES = {
    # Llama shapes: SmolLM2-1.7B's, and a Llama-3-8B-like body (with the copied tokenizer's vocabulary)
    ("llama", "1.7b"): Shape(hidden=2048, layers=24, heads=32, kv_heads=32, ffn=8192),
    ("llama", "7b"): Shape(hidden=4096, layers=32, heads=32, kv_heads=8, ffn=14336, head_dim=128),
    # Qwen2.5-1.5B's and Qwen2.5-7B's
    ("qwen2", "1.7b"): Shape(hidden=1536, layers=28, heads=12, kv_heads=2, ffn=8960, head_dim=128),
    ("qwen2", "7b"): Shape(hidden=3584, layers=28, heads=28, kv_heads=4, ffn=18944, head_dim=128),
}
"""(architecture, size) -> the shape write_random gives it."""

PADDED = {
    # SmolLM2-135M (576 wide, 9 heads of 64, 3 kv heads, 30 layers, MLP 1536) inside:
    "1.7b": Shape(hidden=2304, layers=30, heads=36, kv_heads=12, ffn=6144),  # 1.81 B parameters
    "7b": Shape(hidden=2304, layers=32, heads=72, kv_heads=24, ffn=24576),  # 6.6 B parameters
}
"""size -> the shape write_padded embeds a 576-wide Llama into (hidden 4x its own, heads per kv head kept)."""

_F16_FIELDS = {"Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2), "Q8_0": (0,), "Q4_K": (0, 2), "Q5_K": (0, 2),
               "Q6_K": (-2,), "Q2_K": (-4, -2), "Q3_K": (-2,)}
"""Where each block type keeps its fp16 scales (byte offsets in a block; negative: from its end)."""


def quant_type(kind: str):
    from gguf import GGMLQuantizationType

    try:
        return GGMLQuantizationType[kind.upper()]
    except KeyError:
        raise SpecdecError(f"unknown block type {kind!r}: use one of F32, F16, BF16, {', '.join(_F16_FIELDS)}") from None


def random_blocks(rows: int, cols: int, kind: str, rng: np.random.Generator, scale: float = 0.02) -> np.ndarray:
    """A (rows, cols) matrix as random blocks of `kind` (uint8 rows of blocks), weights of about `scale`: float
    types and those gguf-py quantises from random normals, the others as random codes under small fp16 scales."""
    from gguf import GGML_QUANT_SIZES
    from gguf.quants import quantize

    qtype = quant_type(kind)
    width, nbytes = GGML_QUANT_SIZES[qtype]
    if cols % width:
        raise SpecdecError(f"a {kind} row holds whole blocks of {width}: {cols} columns do not divide")
    name = qtype.name
    if name in ("F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"):
        values = rng.standard_normal((rows, cols), dtype=np.float32) * scale
        out = quantize(values, qtype)
        return out.view(np.uint8).reshape(rows, -1)
    if name not in _F16_FIELDS:
        raise SpecdecError(f"random {kind} blocks are not written here: use Q8_0, Q4_0, Q4_K, Q5_K or Q6_K")
    blocks = rng.integers(0, 256, size=(rows, cols // width, nbytes), dtype=np.uint8)
    # the super-block scale: codes (up to 63 x 15 for Q4_K, 127 x 32 for Q6_K) times it stay near `scale`
    d = np.float16(scale / (60 if name in ("Q4_K", "Q5_K", "Q2_K", "Q3_K") else 2000 if name == "Q6_K" else 8))
    for offset in _F16_FIELDS[name]:
        at = offset % nbytes
        blocks[:, :, at : at + 2] = np.frombuffer(d.tobytes(), dtype=np.uint8)
    return blocks.reshape(rows, -1)


# -- writing ------------------------------------------------------------------------------------------

def _copy_tokenizer(writer, reader, vocab: int | None = None) -> int:
    """Every tokenizer.* field of the source file into `writer`, with its types and bytes (so the copy builds
    the very tokenizer the source does: a sentencepiece vocabulary's scores included), or its first `vocab`
    tokens and the merges among them where given; returns the vocabulary's size."""
    from gguf import GGUFValueType

    fields = reader.fields
    tokens = [bytes(fields["tokenizer.ggml.tokens"].parts[i]) for i in fields["tokenizer.ggml.tokens"].data]
    keep = len(tokens) if vocab is None else vocab
    for key, field in fields.items():
        if not key.startswith("tokenizer."):
            continue
        kind, values = field.types[0], [field.parts[i] for i in field.data]
        if kind == GGUFValueType.ARRAY:
            sub = field.types[-1]
            items = [bytes(v) if sub == GGUFValueType.STRING else v[0].item() for v in values]
            if len(items) == len(tokens):  # one a token: tokens, scores, token types
                items = items[:keep]
            elif key.endswith("merges") and vocab is not None:
                known = {t.decode("utf-8", errors="replace") for t in tokens[:keep]}
                merges = [m.decode("utf-8", errors="replace") for m in items]
                items = [m.encode() for m in merges
                         if all(part in known for part in m.split(" ")) and m.replace(" ", "") in known]
            if items:
                writer.add_key_value(key, items, GGUFValueType.ARRAY, sub)
        elif kind == GGUFValueType.STRING:
            writer.add_key_value(key, bytes(values[0]), kind)
        else:
            value = values[0][0].item()
            if key.endswith("_token_id") and value >= keep:
                continue
            writer.add_key_value(key, value, kind)
    return keep


def _write(path: Path, arch: str, shape: Shape, eps: float, rope_base: float, context: int, reader, vocab: int | None,
           tensors: Callable[[int], Iterator[tuple[str, tuple[int, ...], str, Callable[[], np.ndarray]]]],
           name: str, sliding_window: int | None = None) -> Path:
    """A GGUF file of `arch` with `shape`, the tokenizer copied from `reader`, and `tensors(vocabulary size)`: (name,
    shape outermost first, block type, make its bytes) each, written one at a time."""
    import gguf

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.partial")
    writer = gguf.GGUFWriter(str(tmp), arch)
    writer.add_name(name)
    writer.add_context_length(context)
    writer.add_embedding_length(shape.hidden)
    writer.add_block_count(shape.layers)
    writer.add_feed_forward_length(shape.ffn)
    writer.add_head_count(shape.heads)
    writer.add_head_count_kv(shape.kv_heads)
    writer.add_layer_norm_rms_eps(eps)
    writer.add_rope_freq_base(rope_base)
    writer.add_rope_dimension_count(shape.head_dim)
    writer.add_key_length(shape.head_dim)
    writer.add_value_length(shape.head_dim)
    if sliding_window is not None:
        writer.add_sliding_window(sliding_window)
    vocab_size = _copy_tokenizer(writer, reader, vocab)
    writer.add_vocab_size(vocab_size)
    listed = list(tensors(vocab_size))
    for tensor_name, dims, kind, _ in listed:
        qtype = quant_type(kind)
        width, nbytes = gguf.GGML_QUANT_SIZES[qtype]
        byte_shape = (*dims[:-1], dims[-1] // width * nbytes)
        writer.add_tensor_info(tensor_name, byte_shape, np.dtype(np.uint8), int(np.prod(byte_shape)), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for _, _, _, make in listed:
        writer.write_tensor_data(np.ascontiguousarray(make()))
    writer.close()
    tmp.replace(path)
    return path


def write_random(path: Path, arch: str = "llama", size: str = "1.7b", kind: str = "Q8_0", seed: int = 0,
                 tokenizer_from: Path | None = None, shape: Shape | None = None, vocab: int | None = None) -> Path:
    """A random-weight `arch` model at `size` (SIZES; or `shape`), its matrices in `kind` blocks, norms F32,
    the tokenizer copied from `tokenizer_from` (default: the built-in SmolLM2's file; its first `vocab` tokens)."""

    if arch not in ("llama", "qwen2", "qwen3"):
        raise SpecdecError(f"random models are written as llama, qwen2 or qwen3, not {arch!r}")
    if shape is None:
        if (arch if arch != "qwen3" else "qwen2", size) not in SIZES:
            raise SpecdecError(f"unknown size {size!r}: use {', '.join(sorted({s for _, s in SIZES}))}")
        shape = SIZES[arch if arch != "qwen3" else "qwen2", size]
    reader = _reader(tokenizer_from or _smollm2_file())
    rng = np.random.default_rng(seed)
    q, kv = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim

    def ones(n: int) -> Callable[[], np.ndarray]:
        return lambda: (1 + 0.1 * rng.standard_normal(n, dtype=np.float32)).astype(np.float32).view(np.uint8)

    def small(n: int) -> Callable[[], np.ndarray]:
        return lambda: (0.02 * rng.standard_normal(n, dtype=np.float32)).view(np.uint8)

    def matrix(rows: int, cols: int, scale: float = 0.02) -> Callable[[], np.ndarray]:
        return lambda: random_blocks(rows, cols, kind, rng, scale)

    def tensors(vocab_size: int):
        yield "token_embd.weight", (vocab_size, shape.hidden), kind, matrix(vocab_size, shape.hidden, 1.0)
        yield "output_norm.weight", (shape.hidden,), "F32", ones(shape.hidden)
        for i in range(shape.layers):
            b = f"blk.{i}."
            yield b + "attn_norm.weight", (shape.hidden,), "F32", ones(shape.hidden)
            yield b + "attn_q.weight", (q, shape.hidden), kind, matrix(q, shape.hidden)
            yield b + "attn_k.weight", (kv, shape.hidden), kind, matrix(kv, shape.hidden)
            yield b + "attn_v.weight", (kv, shape.hidden), kind, matrix(kv, shape.hidden)
            if arch == "qwen2":
                yield b + "attn_q.bias", (q,), "F32", small(q)
                yield b + "attn_k.bias", (kv,), "F32", small(kv)
                yield b + "attn_v.bias", (kv,), "F32", small(kv)
            if arch == "qwen3":
                yield b + "attn_q_norm.weight", (shape.head_dim,), "F32", ones(shape.head_dim)
                yield b + "attn_k_norm.weight", (shape.head_dim,), "F32", ones(shape.head_dim)
            yield b + "attn_output.weight", (shape.hidden, q), kind, matrix(shape.hidden, q)
            yield b + "ffn_norm.weight", (shape.hidden,), "F32", ones(shape.hidden)
            yield b + "ffn_gate.weight", (shape.ffn, shape.hidden), kind, matrix(shape.ffn, shape.hidden)
            yield b + "ffn_up.weight", (shape.ffn, shape.hidden), kind, matrix(shape.ffn, shape.hidden)
            yield b + "ffn_down.weight", (shape.hidden, shape.ffn), kind, matrix(shape.hidden, shape.ffn)

    label = f"specdec random {arch} {size} {kind}"
    return _write(path, arch, shape, 1e-5, 10000.0 if arch == "llama" else 1000000.0, 4096, reader, vocab, tensors, label)


def write_padded(path: Path, size: str = "1.7b", source: Path | None = None, shape: Shape | None = None) -> Path:
    """The built-in SmolLM2-135M (or another Llama GGUF `source`) embedded with zero weights in a model of
    PADDED[size]'s shape (or `shape`): the same text as the source, the cost of the bigger model."""

    reader = _reader(source or _smollm2_file())
    arch = bytes(reader.fields["general.architecture"].parts[-1]).decode()
    if arch == "gemma3":
        return write_deepened(path, size, reader, shape)
    if arch != "llama":
        raise SpecdecError(f"write_padded embeds a llama or gemma3 GGUF model, not {arch!r}")

    def value(key: str):
        return _field(reader, f"llama.{key}")

    small = Shape(hidden=int(value("embedding_length")), layers=int(value("block_count")),
                  heads=int(value("attention.head_count")), kv_heads=int(value("attention.head_count_kv")),
                  ffn=int(value("feed_forward_length")))
    small = Shape(small.hidden, small.layers, small.heads, small.kv_heads, small.ffn, head_dim=small.hidden // small.heads)
    if shape is None:
        if size not in PADDED:
            raise SpecdecError(f"unknown size {size!r}: use {', '.join(PADDED)}")
        shape = PADDED[size]
    problems = []
    if shape.hidden != 4 * small.hidden:
        problems.append(f"the hidden size must be 4x the source's ({4 * small.hidden}), so that the norms stay exact")
    if shape.head_dim != small.head_dim or shape.heads * small.kv_heads != shape.kv_heads * small.heads:
        problems.append("the heads must keep the source's head size and heads per kv head")
    if shape.heads < small.heads or shape.ffn < small.ffn or shape.layers < small.layers:
        problems.append("every size must be at least the source's")
    if problems:
        raise SpecdecError(f"cannot embed a {small} model in {shape}: " + "; ".join(problems))
    eps = float(value("attention.layer_norm_rms_epsilon")) / 4  # mean of squares over 4x the width: a quarter
    entries = {t.name: t for t in reader.tensors}

    def embedded(name: str, rows: int, cols: int) -> tuple[str, Callable[[], np.ndarray]]:
        return _embedded(entries[name], rows, cols)

    def norm(name: str | None, n: int) -> Callable[[], np.ndarray]:
        def make() -> np.ndarray:
            out = np.zeros(n, dtype=np.float32)
            if name is not None:
                w = np.asarray(entries[name].data, dtype=np.float32)
                out[: w.shape[0]] = w / 2  # the normalised rows come out 2x (a quarter of the mean square): halve w
            return out.view(np.uint8)
        return make

    q, kv = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    tied = "output.weight" not in entries

    def tensors(vocab_size: int):
        kind, make = embedded("token_embd.weight", vocab_size, shape.hidden)
        yield "token_embd.weight", (vocab_size, shape.hidden), kind, make
        if not tied:
            kind, make = embedded("output.weight", vocab_size, shape.hidden)
            yield "output.weight", (vocab_size, shape.hidden), kind, make
        yield "output_norm.weight", (shape.hidden,), "F32", norm("output_norm.weight", shape.hidden)
        for i in range(shape.layers):
            b = f"blk.{i}."
            real = i < small.layers
            layer = {"attn_q": (q, shape.hidden), "attn_k": (kv, shape.hidden), "attn_v": (kv, shape.hidden),
                     "attn_output": (shape.hidden, q), "ffn_gate": (shape.ffn, shape.hidden),
                     "ffn_up": (shape.ffn, shape.hidden), "ffn_down": (shape.hidden, shape.ffn)}
            yield b + "attn_norm.weight", (shape.hidden,), "F32", norm(b + "attn_norm.weight" if real else None, shape.hidden)
            yield b + "ffn_norm.weight", (shape.hidden,), "F32", norm(b + "ffn_norm.weight" if real else None, shape.hidden)
            for part, dims in layer.items():
                source_name = f"blk.{i if real else 0}.{part}.weight"
                kind, make = embedded(source_name, *dims)
                if not real:  # an added layer: all zero, the residual passes through
                    make = _zeros(dims, kind)
                yield f"{b}{part}.weight", dims, kind, make

    rope_base = float(value("rope.freq_base"))
    context = int(value("context_length"))
    label = f"specdec padded smollm2-135m {size}"
    return _write(path, "llama", shape, eps, rope_base, context, reader, None, tensors, label)


DEEPENED = {
    # Gemma-3-270M (640 wide, 18 layers, MLP 2048, a 262 k vocabulary) inside:
    "1.7b": Shape(hidden=640, layers=26, heads=4, kv_heads=1, ffn=29952, head_dim=256),  # 1.70 B parameters
    "7b": Shape(hidden=640, layers=34, heads=4, kv_heads=1, ffn=128000, head_dim=256),  # 8.6 B parameters
}
"""size -> the shape write_deepened gives a Gemma-3 GGUF: its own width, more layers, a wider MLP."""


def write_deepened(path: Path, size: str = "1.7b", reader=None, shape: Shape | None = None) -> Path:
    """A Gemma-3 GGUF (the built-in Gemma-3-270M by default) with a wider MLP and more layers whose added
    weights are zero: the same logits (a zero MLP column adds nothing; a zero layer's post-norms turn its
    zero outputs into zeros, so the residual passes through), the cost of the bigger model. The width
    stays: Gemma scales its embeddings by the square root of the width and ties them to the output."""
    if reader is None:
        from ..models import BUILTIN_MODELS

        reader = _reader(Path(BUILTIN_MODELS["gemma3-270m"].locate_gguf()))

    def value(key: str):
        return _field(reader, f"gemma3.{key}")

    small = Shape(hidden=int(value("embedding_length")), layers=int(value("block_count")),
                  heads=int(value("attention.head_count")), kv_heads=int(value("attention.head_count_kv")),
                  ffn=int(value("feed_forward_length")), head_dim=int(value("attention.key_length")))
    if shape is None:
        if size not in DEEPENED:
            raise SpecdecError(f"unknown size {size!r}: use {', '.join(DEEPENED)}")
        shape = DEEPENED[size]
    if (shape.hidden, shape.heads, shape.kv_heads, shape.head_dim) != (small.hidden, small.heads, small.kv_heads,
                                                                        small.head_dim):
        raise SpecdecError(f"a Gemma-3 model is deepened at its own width and heads ({small}), not {shape}")
    if shape.ffn < small.ffn or shape.layers < small.layers:
        raise SpecdecError(f"cannot deepen a {small} model to {shape}: every size must be at least the source's")
    entries = {t.name: t for t in reader.tensors}

    def padded(name: str, rows: int, cols: int, real: bool) -> tuple[str, Callable[[], np.ndarray]]:
        """The source matrix embedded in (rows, cols), or, for an added layer, zero blocks of its type."""
        kind, make = _embedded(entries[name], rows, cols)
        return kind, make if real else _zeros((rows, cols), kind)

    def vector(name: str, n: int, real: bool) -> Callable[[], np.ndarray]:
        def make() -> np.ndarray:
            out = np.zeros(n, dtype=np.float32)
            if real:
                out[:] = np.asarray(entries[name].data, dtype=np.float32)
            return out.view(np.uint8)
        return make

    q, kv, d = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim, shape.hidden

    def tensors(vocab_size: int):
        kind, make = padded("token_embd.weight", vocab_size, d, True)
        yield "token_embd.weight", (vocab_size, d), kind, make
        yield "output_norm.weight", (d,), "F32", vector("output_norm.weight", d, True)
        for i in range(shape.layers):
            real, b, like = i < small.layers, f"blk.{i}.", f"blk.{min(i, small.layers - 1)}."
            for norm, n in (("attn_norm", d), ("attn_q_norm", shape.head_dim), ("attn_k_norm", shape.head_dim),
                            ("post_attention_norm", d), ("ffn_norm", d), ("post_ffw_norm", d)):
                yield f"{b}{norm}.weight", (n,), "F32", vector(f"{like}{norm}.weight", n, real)
            for part, dims in {"attn_q": (q, d), "attn_k": (kv, d), "attn_v": (kv, d), "attn_output": (d, q),
                               "ffn_gate": (shape.ffn, d), "ffn_up": (shape.ffn, d), "ffn_down": (d, shape.ffn)}.items():
                kind, make = padded(f"{like}{part}.weight", *dims, real)
                yield f"{b}{part}.weight", dims, kind, make

    label = f"specdec deepened gemma3-270m {size}"
    return _write(path, "gemma3", shape, float(value("attention.layer_norm_rms_epsilon")),
                  float(value("rope.freq_base")), int(value("context_length")), reader, None, tensors, label,
                  sliding_window=int(value("attention.sliding_window")))


def _field(reader, key: str):
    """A scalar metadata value of a source file."""
    field = reader.fields[key]
    return field.parts[field.data[0]][0]


def _embedded(t, rows: int, cols: int) -> tuple[str, Callable[[], np.ndarray]]:
    """The source matrix `t` (a GGUF reader tensor) in the top-left corner of a zero (rows, cols) matrix of its
    block type: its block type's name and a function that makes the bytes."""
    import gguf

    qtype = gguf.GGMLQuantizationType(t.tensor_type)
    width, nbytes = gguf.GGML_QUANT_SIZES[qtype]
    small_rows, small_cols = int(t.shape[1]), int(t.shape[0])
    if small_cols % width or cols % width:
        raise SpecdecError(f"{t.name}: {qtype.name} rows of {small_cols} do not pad by whole blocks")

    def make() -> np.ndarray:
        out = np.zeros((rows, cols // width * nbytes), dtype=np.uint8)  # all-zero blocks: zero weights, every type
        data = np.asarray(t.data).view(np.uint8).reshape(small_rows, -1)
        out[:small_rows, : data.shape[1]] = data
        return out
    return qtype.name, make


def _zeros(dims: tuple[int, int], kind: str) -> Callable[[], np.ndarray]:
    import gguf

    width, nbytes = gguf.GGML_QUANT_SIZES[quant_type(kind)]
    return lambda: np.zeros((dims[0], dims[1] // width * nbytes), dtype=np.uint8)


@functools.lru_cache(maxsize=2)
def _reader(path: Path):
    """gguf's reader of a source file (it parses every token: seconds for a real vocabulary), kept for the next model."""
    import gguf

    return gguf.GGUFReader(str(path))


def _smollm2_file() -> Path:
    from ..models import BUILTIN_MODELS

    return Path(BUILTIN_MODELS["smollm2-135m"].locate_gguf())
