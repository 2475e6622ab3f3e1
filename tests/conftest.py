"""Shared fixtures: tiny random-initialised HF models built from a config, with a tiny tokenizer."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # no hub here: fail fast instead of retrying

CHARS = list("abcdefghijklmnopqrstuvwxyz .,\n")  # the tiny tokenizer's vocabulary: one id per character


def tiny_llama(vocab_size: int = 40, layers: int = 2, seed: int = 0, max_positions: int = 256, init: float = 0.3):
    """A random Llama-architecture causal LM; a large init spreads the logits so greedy has no near-ties."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=max_positions,
                         initializer_range=init, eos_token_id=None, bos_token_id=None, pad_token_id=None,
                         tie_word_embeddings=False)
    return LlamaForCausalLM(config).eval()


def tiny_gemma3(vocab_size: int = 40, seed: int = 0, sliding_window: int = 8):
    """A random Gemma-3 text model with sliding-window layers, to test rollback across the window."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    torch.manual_seed(seed)
    config = Gemma3TextConfig(vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                              num_attention_heads=4, num_key_value_heads=2, head_dim=8, sliding_window=sliding_window,
                              layer_types=["sliding_attention", "sliding_attention", "sliding_attention", "full_attention"],
                              max_position_embeddings=256, initializer_range=0.3, eos_token_id=None, bos_token_id=None,
                              pad_token_id=None)
    return Gemma3ForCausalLM(config).eval()


def char_tokenizer(chars: list[str] = CHARS):
    """A character-level fast tokenizer (id = position in `chars`) with an end-of-text token."""
    from tokenizers import Tokenizer, models, pre_tokenizers, decoders
    from transformers import PreTrainedTokenizerFast

    vocab = {c: i for i, c in enumerate(chars)}
    vocab["<eos>"] = len(chars)
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<eos>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>")


CHAT_TEMPLATE = "{% for m in messages %}{{ m['role'][0] }}:{{ m['content'] }}\n{% endfor %}a:"


def save_tiny_model(directory: Path, chars: list[str] = CHARS, seed: int = 0, layers: int = 2,
                    max_positions: int = 256, chat: bool = False) -> Path:
    """A loadable model directory: tiny random Llama + character tokenizer whose eos is the last id
    (with a minimal chat template if asked)."""
    tokenizer = char_tokenizer(chars)
    if chat:
        tokenizer.chat_template = CHAT_TEMPLATE
    model = tiny_llama(vocab_size=len(chars) + 1, layers=layers, seed=seed, max_positions=max_positions)
    model.config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory) -> dict[str, Path]:
    """target / draft (same tokenizer) / alien (another tokenizer) / short (64-token context)."""
    root = tmp_path_factory.mktemp("models")
    return {
        "target": save_tiny_model(root / "target", seed=0, layers=2),
        "draft": save_tiny_model(root / "draft", seed=1, layers=1),
        "alien": save_tiny_model(root / "alien", chars=list(reversed(CHARS)), seed=2, layers=1),
        "short": save_tiny_model(root / "short", seed=3, layers=1, max_positions=64),
        "chat": save_tiny_model(root / "chat", seed=4, layers=2, chat=True),
        "long": save_tiny_model(root / "long", seed=5, layers=2, max_positions=8192, chat=True),
    }


@pytest.fixture(scope="session")
def builtin_model():
    """The built-in SmolLM2-135M in float32 (converted and cached on first use)."""
    from specdec.models import load_model

    return load_model("smollm2-135m", dtype="float32")
