"""A user's GGUF file as a target and a drafter: tiny files this test writes with the `gguf` package (each
architecture, each block type), their logits against the dequantised model transformers loads from the same
file, greedy speculative = plain, bad and truncated files, the cached index, and the zero-padded model."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from specdec.bench.gguf_models import Shape, write_padded, write_random
from specdec.errors import SpecdecError

pytestmark = pytest.mark.filterwarnings("ignore")

TINY = Shape(hidden=256, layers=2, heads=4, kv_heads=2, ffn=512)
QWEN3 = Shape(hidden=256, layers=2, heads=2, kv_heads=1, ffn=512, head_dim=128)  # transformers' Qwen3 head size
VOCAB = 600  # the built-in SmolLM2 tokenizer's first 600 tokens and the merges among them


@pytest.fixture(autouse=True)
def own_cache(tmp_path_factory, monkeypatch):
    """Indexes of the files written here go to a cache of this module's own, not the shared one (which
    keeps the compiled kernels: linked)."""
    from specdec.paths import cache_dir

    own = tmp_path_factory.getbasetemp() / "gguf-cache"
    if not own.exists():
        own.mkdir()
        (cache_dir() / "kernels").mkdir(parents=True, exist_ok=True)
        (own / "kernels").symlink_to(cache_dir() / "kernels", target_is_directory=True)
    monkeypatch.setenv("SPECDEC_CACHE", str(own))


@pytest.fixture(scope="module")
def files(tmp_path_factory, kernels_or_skip):
    root = tmp_path_factory.mktemp("gguf")
    made = {}
    for arch, kind in [("llama", k) for k in ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K", "F16",
                                              "BF16", "F32")] + [("qwen2", "Q8_0"), ("qwen2", "Q6_K"), ("qwen3", "Q4_K")]:
        made[arch, kind] = write_random(root / f"{arch}-{kind}.gguf", arch, kind=kind, seed=len(made),
                                        shape=QWEN3 if arch == "qwen3" else TINY, vocab=VOCAB)
    return made


@pytest.fixture(scope="module")
def kernels_or_skip():
    from specdec.modeling import quant, rowops

    if quant.load() is None or rowops.load() is None:
        pytest.skip(f"quant.cpp does not run here: {quant.unavailable_reason()}")


def _reference_logits(path, ids: torch.Tensor) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    with torch.no_grad():
        return model(ids[None]).logits[0]


@pytest.mark.parametrize("arch,kind", [("llama", k) for k in ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K",
                                                               "Q6_K", "F16", "BF16", "F32")]
                         + [("qwen2", "Q8_0"), ("qwen2", "Q6_K"), ("qwen3", "Q4_K")])
def test_logits_are_the_dequantised_models(files, arch, kind):
    """The file's blocks (or, for a type the kernels do not read, its matrices dequantised) give the logits
    transformers computes from the same file dequantised, within float32 rounding; with int8 activations
    (the default), within llama.cpp's quantisation of the activations."""
    from specdec.backends import target_backend
    from specdec.models import load_model

    path = files[arch, kind]
    loaded = load_model(str(path))
    assert loaded.blocks_only and loaded.model.model.layers[0].self_attn.q_proj.weight.is_meta
    ids = torch.tensor(loaded.tokenizer("Hello world, this is a test of the file")["input_ids"])
    want = _reference_logits(path, ids)
    exact = target_backend(loaded, weights="gguf")
    got = exact.forward(ids)
    scale = want.abs().max().item()
    assert (got - want).abs().max().item() <= 2e-5 * scale, (arch, kind)
    on_kernels = kind not in ("F32",)  # every type but float32 runs on the kernels
    assert exact.params_on_blocks == (exact.params_total if on_kernels else 0)
    fast = target_backend(loaded)  # auto: int8 activations
    assert "int8" in fast.path
    rel = ((fast.forward(ids) - want).norm() / want.norm()).item()
    assert rel < 0.05, (arch, kind, rel)


def test_greedy_speculation_equals_plain_and_drafts_get_accepted(files):
    """On a .gguf target the speculative output at T = 0 is plain decoding's, and prompt lookup on a text
    the model repeats gets drafts accepted; a .gguf file drafts for a .gguf target of the same tokenizer."""
    from specdec.api import SpecDec

    target = str(files["llama", "Q4_K"])
    prompt = "the cat sat on the mat. the cat sat on the mat. the cat sat on the mat. the cat"
    plain = SpecDec(target=target, drafter="none").generate(prompt, max_new_tokens=40, chat=False)
    lookup = SpecDec(target=target, drafter="prompt-lookup").generate(prompt, max_new_tokens=40, chat=False)
    assert lookup.token_ids == plain.token_ids
    drafted = SpecDec(target=target, drafter=f"model:{files['llama', 'Q8_0']}").generate(prompt, max_new_tokens=24,
                                                                                         chat=False)
    assert drafted.token_ids == plain.token_ids[:24]
    assert drafted.stats.drafted > 0
    self_drafted = SpecDec(target=target, drafter=f"model:{target}").generate(prompt, max_new_tokens=24, chat=False)
    assert self_drafted.token_ids == plain.token_ids[:24]
    assert self_drafted.stats.accepted == self_drafted.stats.drafted > 0  # a model drafting for itself is never wrong


def test_the_index_is_cached_and_the_second_load_parses_nothing(files, monkeypatch):
    import gguf

    from specdec.models import load_model

    path = str(files["llama", "Q8_0"])
    first = load_model(path)
    monkeypatch.setattr(gguf, "GGUFReader", None)  # a second load must not parse the metadata
    again = load_model(path)
    assert again.tokenizer.get_vocab() == first.tokenizer.get_vocab()
    assert again.model.config.to_dict() == first.model.config.to_dict()


def test_the_config_read_without_the_vocabulary_is_transformers_config_of_the_whole_file(files, tmp_path):
    """transformers reads a file's settings with gguf's reader, which takes seconds over a real vocabulary
    (Gemma-3's: 10 s); the index gives it a copy of the metadata without the tokenizer's arrays, and the keys
    transformers took from those arrays and from the tensors (vocab_size, tie_word_embeddings) come out the
    same."""
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    from specdec.gguf_file import GGUFFile, _settings_only
    from specdec.models import _smollm2_gguf

    for path in [files["llama", "Q8_0"], files["qwen2", "Q6_K"], files["qwen3", "Q4_K"], _smollm2_gguf()]:
        whole = load_gguf_checkpoint(str(path), return_tensors=False)["config"]
        assert GGUFFile.open(path)._parsed_config(load_gguf_checkpoint) == whole, path
    settings = tmp_path / "settings.gguf"
    assert _settings_only(_smollm2_gguf(), settings) == 49152
    assert settings.stat().st_size < 16_000  # SmolLM2's 49 k tokens and 48 k merges left out


def test_the_tokenizer_is_built_without_reading_the_whole_file_with_ggufs_reader(files, monkeypatch):
    """AutoTokenizer reads a GGUF file's config with gguf's reader to learn its model type (Gemma-3: 18 of 22 s);
    the index hands it the config read without the vocabulary, and the tokenizer is the one built without."""
    import contextlib
    import shutil

    import gguf

    from specdec.gguf_file import GGUFFile

    path = files["qwen2", "Q8_0"]
    made = GGUFFile.open(path)
    made.tokenizer_key = None  # built beside the index, not found by another file's identical vocabulary
    with monkeypatch.context() as patch:
        patch.setattr(GGUFFile, "_config_read_fast", lambda self: contextlib.nullcontext())
        reference = made.tokenizer()
    shutil.rmtree(made.index_dir / "tokenizer")
    opened = []

    class Reader(gguf.GGUFReader):
        def __init__(self, p, *args, **kwargs):
            opened.append(Path(p).name)
            super().__init__(p, *args, **kwargs)

    monkeypatch.setattr(gguf, "GGUFReader", Reader)
    tokenizer = made.tokenizer()
    assert path.name not in opened and opened  # the settings copy only
    text = "def f(x):\n    return x ** 2  # hello"
    assert tokenizer.get_vocab() == reference.get_vocab() and tokenizer(text).input_ids == reference(text).input_ids
    assert tokenizer.chat_template == reference.chat_template and type(tokenizer) is type(reference)


def test_bad_files_are_clear_errors(tmp_path, files):
    from specdec.models import load_model

    with pytest.raises(SpecdecError, match="does not exist"):
        load_model(str(tmp_path / "missing.gguf"))
    text = tmp_path / "notes.gguf"
    text.write_text("these are notes, not a model")
    with pytest.raises(SpecdecError, match="not a GGUF file"):
        load_model(str(text))
    whole = files["llama", "Q8_0"].read_bytes()
    for cut in (len(whole) // 2, 64):
        cut_file = tmp_path / f"cut-{cut}.gguf"
        cut_file.write_bytes(whole[:cut])
        with pytest.raises(SpecdecError, match="truncated|damaged"):
            load_model(str(cut_file))


def test_an_unsupported_architecture_is_named(tmp_path):
    import gguf
    import numpy as np

    from specdec.models import load_model

    path = tmp_path / "phi.gguf"
    writer = gguf.GGUFWriter(str(path), "phi2")
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(SpecdecError, match="'phi2' does not run here.*llama, mistral, qwen2, qwen3, gemma3"):
        load_model(str(path))


def test_float_weights_on_a_gguf_target_are_a_clear_error(files):
    from specdec.api import SpecDec

    with pytest.raises(SpecdecError, match="runs on the file's own blocks"):
        SpecDec(target=str(files["llama", "Q8_0"]), drafter="none", weights="float")
    with pytest.raises(SpecdecError, match="float32"):
        SpecDec(target=str(files["llama", "Q8_0"]), drafter="none", dtype="bfloat16")


def test_the_padded_model_is_the_small_model_to_the_bit(tmp_path, files):
    """A model embedded with zero weights in one 4x as wide, with more heads, a wider MLP and an added layer,
    gives the small model's logits exactly and so its greedy text, on the default (int8) path."""
    from specdec.api import SpecDec

    source = files["llama", "Q4_K"]
    wide = Shape(hidden=4 * TINY.hidden, layers=TINY.layers + 1, heads=2 * TINY.heads, kv_heads=2 * TINY.kv_heads,
                 ffn=2 * TINY.ffn)
    padded = write_padded(tmp_path / "padded.gguf", source=source, shape=wide)
    assert os.path.getsize(padded) > 6 * os.path.getsize(source)
    prompt = "the quick brown fox jumps over the lazy dog and"
    small = SpecDec(target=str(source), drafter="none").generate(prompt, max_new_tokens=24, chat=False)
    big = SpecDec(target=str(padded), drafter="none").generate(prompt, max_new_tokens=24, chat=False)
    assert big.token_ids == small.token_ids
    with pytest.raises(SpecdecError, match="4x"):
        write_padded(tmp_path / "bad.gguf", source=source, shape=Shape(hidden=512, layers=2, heads=4, kv_heads=2, ffn=512))


def test_the_deepened_gemma3_is_gemma3_to_the_bit(tmp_path):
    """The built-in Gemma-3-270M with two added zero layers and a wider MLP of zero columns gives its
    greedy text exactly; another width is refused (Gemma's embedding scale depends on it)."""
    from specdec.api import SpecDec
    from specdec.models import BUILTIN_MODELS

    source = Path(BUILTIN_MODELS["gemma3-270m"].locate_gguf())
    deeper = Shape(hidden=640, layers=20, heads=4, kv_heads=1, ffn=2304, head_dim=256)
    padded = write_padded(tmp_path / "deep.gguf", source=source, shape=deeper)
    prompt = "The three primary colours are"
    small = SpecDec(target=str(source), drafter="none").generate(prompt, max_new_tokens=16, chat=False)
    big = SpecDec(target=str(padded), drafter="none").generate(prompt, max_new_tokens=16, chat=False)
    assert big.token_ids == small.token_ids
    with pytest.raises(SpecdecError, match="own width"):
        write_padded(tmp_path / "bad.gguf", source=source, shape=Shape(hidden=1280, layers=20, heads=4, kv_heads=1,
                                                                      ffn=2304, head_dim=256))


def test_the_llama_server_peer_needs_its_binary_and_runs_on_the_file(files, monkeypatch, tmp_path):
    """`--peers llama-server` without a binary is a clear error; with one (SPECDEC_LLAMA_SERVER or PATH:
    built apart, never in CI) the bench runs llama.cpp's own server on the same file, plain and with its
    n-gram speculation, and compares its greedy tokens with specdec's."""
    from specdec.bench import peers, runner

    target = str(files["llama", "Q8_0"])
    binary = peers.llama_server_binary()
    config = runner.BenchConfig(target=target, drafters=["prompt-lookup"], tasks=["code"], temperatures=[0.0],
                                gammas=["auto"], prompts_per_task=1, max_new_tokens=8, peers=("llama-server",))
    with monkeypatch.context() as m:
        m.delenv("SPECDEC_LLAMA_SERVER", raising=False)
        m.setenv("PATH", str(tmp_path))
        with pytest.raises(SpecdecError, match="llama-server.*SPECDEC_LLAMA_SERVER"):
            runner.run_bench(config)
    if binary is None:
        pytest.skip("no llama-server here (SPECDEC_LLAMA_SERVER or PATH); docs/usage.md says how to build one")
    rows = {row["method"]: row for row in runner.run_bench(config)}
    assert {"llama-server", "llama-server-ngram-simple", "llama-server-ngram-mod"} <= rows.keys()
    for name in ("llama-server", "llama-server-ngram-simple"):
        assert rows[name]["new_tokens"] > 0 and rows[name]["tokens_per_s"] > 0
