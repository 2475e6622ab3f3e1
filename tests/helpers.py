"""What tests build on: tiny random-initialised transformers models with a character tokenizer,
and pure-tensor stand-ins for models (statistical tests run on these in seconds, not minutes)."""

from __future__ import annotations

from pathlib import Path

import torch

from specdec.backends import Backend


def built_extension(wrapper):
    """The compiled module behind a specdec.modeling extension wrapper (quant, rowops), or a skip
    that says why it cannot run on this machine. Where a C++ compiler is, a source that does not build
    is a failure, not a skip (else a compile error would pass the tests that should catch it)."""
    import platform
    import shutil

    import pytest

    module = wrapper.load()
    if module is None:
        reason = wrapper.unavailable_reason() or ""
        if (platform.machine() in ("x86_64", "AMD64") and shutil.which("c++") is not None
                and reason.startswith("could not build")):
            pytest.fail(f"{wrapper.__name__}: {reason}")
        pytest.skip(f"{wrapper.__name__} cannot run here: {reason}")
    return module


CHARS = list("abcdefghijklmnopqrstuvwxyz .,\n")  # the tiny tokenizer's vocabulary: one id per character


def tiny_llama(vocab_size: int = 40, layers: int = 2, seed: int = 0, max_positions: int = 256, init: float = 0.3,
               head_dim: int = 8):
    """A random Llama-architecture causal LM; a large init spreads the logits so greedy has no near-ties."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=head_dim,
                         max_position_embeddings=max_positions, initializer_range=init, eos_token_id=None,
                         bos_token_id=None, pad_token_id=None, tie_word_embeddings=False)
    return LlamaForCausalLM(config).eval()


def tiny_llama_family(kind: str, vocab_size: int = 40, seed: int = 0, sliding_window: int = 8, head_dim: int = 8):
    """A random Mistral (a sliding window on every layer), Qwen2 (biases on Q, K, V; the window on its last
    layer) or Qwen3 (per-head q/k norms, whose weights are randomised as training would leave them) causal LM."""
    from transformers import MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    shared = dict(vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=head_dim, max_position_embeddings=256, initializer_range=0.3,
                  eos_token_id=None, bos_token_id=None, pad_token_id=None, tie_word_embeddings=False)
    if kind == "mistral":
        model = MistralForCausalLM(MistralConfig(sliding_window=sliding_window, **shared))
    elif kind == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(use_sliding_window=True, sliding_window=sliding_window, max_window_layers=1,
                                             **shared))
        with torch.no_grad():  # transformers starts biases at zero: make them count
            for layer in model.model.layers:
                for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                    proj.bias.normal_(0, 0.5)
    elif kind == "qwen3":
        model = Qwen3ForCausalLM(Qwen3Config(**shared))
        with torch.no_grad():
            for layer in model.model.layers:
                layer.self_attn.q_norm.weight.uniform_(0.5, 1.5)
                layer.self_attn.k_norm.weight.uniform_(0.5, 1.5)
    else:
        raise ValueError(kind)
    return model.eval()


def tiny_gemma3(vocab_size: int = 40, seed: int = 0, sliding_window: int = 8, head_dim: int = 8):
    """A random Gemma-3 text model with sliding-window layers, to test rollback across the window."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    torch.manual_seed(seed)
    config = Gemma3TextConfig(vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                              num_attention_heads=4, num_key_value_heads=2, head_dim=head_dim,
                              sliding_window=sliding_window,
                              layer_types=["sliding_attention", "sliding_attention", "sliding_attention", "full_attention"],
                              max_position_embeddings=256, initializer_range=0.3, eos_token_id=None, bos_token_id=None,
                              pad_token_id=None)
    return Gemma3ForCausalLM(config).eval()


def check_tree_path_scores_like_steps(backend) -> None:
    """A tree whose accepted path has another branch in the slots between its nodes (masked out) must
    score that path to the bit as one-position steps do, and after keep_path the next step too: the
    check of every backend's tree attention (a tiny 40-token model; 21 positions of context, past
    Gemma's window of 8)."""
    ids = torch.randint(0, 40, (30,), generator=torch.Generator().manual_seed(7))
    context, path = ids[:21], ids[21:26]
    backend.prefill(context)
    steps = torch.cat([backend.forward(path[i : i + 1]) for i in range(5)])
    after = backend.forward(ids[26:27])
    backend.rollback(21)
    # root, then three nodes of another branch, then the path's four nodes: slots 22-24 hold the others
    tree = torch.cat([path[:1], torch.tensor([1, 2, 3]), path[1:]])
    logits = backend.forward_tree(tree, torch.tensor([-1, 0, 1, -1, 3, 4, 5]))
    assert torch.equal(logits[[0, 4, 5, 6, 7]], steps)
    backend.keep_path(21, [3, 4, 5, 6])
    assert torch.equal(backend.forward(ids[26:27]), after)  # the kept keys and values are the path's


def char_tokenizer(chars: list[str] = CHARS):
    """A character-level fast tokenizer (id = position in `chars`) with an end-of-text token."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {c: i for i, c in enumerate(chars)}
    vocab["<eos>"] = len(chars)
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<eos>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>")


CHAT_TEMPLATE = "{% for m in messages %}{{ m['role'][0] }}:{{ m['content'] }}\n{% endfor %}a:"


def save_tiny_model(directory: Path, chars: list[str] = CHARS, seed: int = 0, layers: int = 2,
                    max_positions: int = 256, chat: bool = False, kind: str = "llama") -> Path:
    """A loadable model directory: tiny random Llama (or `kind`: tiny_llama_family's, 2 layers, 256
    positions) + character tokenizer whose eos is the last id (with a minimal chat template if asked)."""
    tokenizer = char_tokenizer(chars)
    if chat:
        tokenizer.chat_template = CHAT_TEMPLATE
    if kind == "llama":
        model = tiny_llama(vocab_size=len(chars) + 1, layers=layers, seed=seed, max_positions=max_positions)
    else:
        model = tiny_llama_family(kind, vocab_size=len(chars) + 1, seed=seed)
    model.config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


class TableLM(Backend):
    """A causal LM whose next-token logits are a fixed random function of the last `order` tokens
    (one table row per context), behind the backend interface with a real held/rollback state.

    `row_noise` imitates reduced precision: a pass over n > 1 positions adds a deterministic
    perturbation of that size to each row (depending on the position and n), as a GEMM whose
    blocking depends on the row count would; `fast_rows` then declares passes up to that many rows
    to be exact (no perturbation), like the kernels' row-invariant path."""

    path = "table"

    def __init__(self, vocab: int = 8, order: int = 2, seed: int = 0, scale: float = 1.5,
                 row_noise: float = 0.0, fast_rows: int | None = None, max_length: int | None = None,
                 eos: int | None = None, eos_bias: float = 0.0):
        super().__init__()
        generator = torch.Generator().manual_seed(seed)
        self.vocab_size, self.order, self.max_length = vocab, order, max_length
        self.table = torch.randn(vocab ** order, vocab, generator=generator) * scale
        if eos is not None:  # make the end-of-sequence token likelier (or rarer) everywhere
            self.table[:, eos] += eos_bias
        self.device = torch.device("cpu")
        self.row_noise, self.fast_rows = row_noise, fast_rows
        self.calls: list[int] = []  # rows per forward pass, for tests that count them

    def numeric_path(self, rows: int) -> str:
        return "table"

    def index(self, context: list[int]) -> int:
        window = ([0] * self.order + context)[-self.order:]
        value = 0
        for token in window:
            value = value * self.vocab_size + token
        return value

    def _forward(self, ids: torch.Tensor, start: int) -> torch.Tensor:
        sequence = self.held[:start] + ids.tolist()
        n = ids.shape[0]
        self.calls.append(n)
        logits = torch.stack([self.table[self.index(sequence[: start + i + 1])] for i in range(n)])
        if self.row_noise and n > 1 and not (self.fast_rows and n <= self.fast_rows):
            g = torch.Generator().manual_seed(1000 * n + start)
            logits = logits + self.row_noise * torch.randn(logits.shape, generator=g)
        return logits

    supports_trees = True

    def _forward_tree(self, ids: torch.Tensor, layout, start: int) -> torch.Tensor:
        """Row r reads the sequence so far, then the root and r's ancestors (its root path)."""
        self.calls.append(ids.shape[0])
        rows = []
        for r in range(ids.shape[0]):
            path = [int(ids[c]) for c in range(ids.shape[0]) if layout.mask[r, c]]
            rows.append(self.table[self.index(self.held[:start] + path)])
        return torch.stack(rows)

    def _keep(self, start: int, slots: list[int]) -> None:
        pass

    def _reset(self) -> None:
        pass

    def _rollback(self, length: int) -> None:
        pass


SUPER = {12: (144, (0, 2)), 13: (176, (0, 2)), 14: (210, (208,))}  # K-quants: bytes a 256-weight block, offsets of its f16 scales


def blocks_of(weight: torch.Tensor, kind: int):
    """A float matrix quantised by gguf-py's reference quantiser (what llama.cpp's converter writes).
    gguf-py cannot quantise K-quants: those get random codes and scales of the same matrix size."""
    from specdec.modeling import quant

    rows, columns = weight.shape
    if kind in SUPER:
        size, halves = SUPER[kind]
        g = torch.Generator().manual_seed(rows * 1000 + columns)
        raw = torch.randint(0, 256, (rows, columns // 256, size), dtype=torch.uint8, generator=g)
        for offset in halves:  # scales of 0.001-0.03, so weights stay O(1)
            scale = (torch.rand(rows, columns // 256, generator=g) * 0.03 + 0.001).half()
            raw[:, :, offset : offset + 2] = scale.view(torch.uint8).view(rows, columns // 256, 2)
        return quant.QuantWeight(raw.view(rows, -1).contiguous(), kind, columns)
    return quant.quantize(weight, next(name for name, code in quant.KINDS.items() if code == kind))


def int8_path() -> str:
    """The stats' path of a target on blocks with int8 activations on this CPU."""
    from specdec.modeling import quant

    return "lean+gguf-int8" + ("+" + quant.packed_isa() if quant.packed_int8() else "")
