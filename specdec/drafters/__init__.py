"""Drafters: one interface (base.Drafter), one file each, and `build_drafter` to pick one by name."""

from __future__ import annotations

from pathlib import Path

import torch

from ..config import DRAFTER_KINDS, DRAFTER_SYNTAX, parse_drafter
from ..errors import SpecdecError
from ..gguf_file import is_gguf_path
from .base import Drafter, Proposal
from .checkpoint import is_trained_drafter
from .cross_tokenizer import CrossTokenizerDrafter
from .model import ModelDrafter
from .ngram import NGramDrafter, NGramTable, NGramTreeDrafter
from .prompt_lookup import AutoPromptLookup, PromptLookupDrafter, PromptLookupTreeDrafter
from .routed import ByTemperature, LookupElseTrained
from .suffix import SequenceHistory, SuffixDrafter
from .trained import is_drafter_directory, load_trained_drafter

SHIPPED_DIR = Path(__file__).parent.parent / "data" / "drafters"

__all__ = ["AutoPromptLookup", "Drafter", "Proposal", "ByTemperature", "LookupElseTrained", "ModelDrafter",
           "NGramDrafter", "NGramTable", "NGramTreeDrafter",
           "PromptLookupDrafter", "PromptLookupTreeDrafter", "SequenceHistory", "SuffixDrafter", "DRAFTER_KINDS",
           "CrossTokenizerDrafter", "DRAFTER_SYNTAX", "TRAINED_ALSO_AT_T0", "build_drafter", "same_tokenizer", "parse_drafter",
           "drafts_on_blocks", "shipped_drafter", "target_weights"]


TRAINED_ALSO_AT_T0 = frozenset({"gemma3-270m", "smollm2-135m"})
"""Built-in targets for which `auto` at T = 0 is lookup-else-trained (prompt lookup where its matches
have been accepted as often as the shipped drafter's guesses, the drafter elsewhere) instead of prompt
lookup alone, because it measured better or level: on Gemma-3-270M (held-out α 0.65) 2.43-2.75x against
2.36-2.40x on chat, 1.48-1.60x against 1.43-1.49x on code, over two runs of 5 prompts (docs/benchmarks.md's log);
on SmolLM2-135M (its earlier drafter, α 0.45; Zen 3, AVX2, two runs of 5 prompts) translation 1.69-1.73x against 1.13-1.18x,
open chat 1.03-1.13x against 0.93-1.06x, summaries and code editing level, code 1.45-1.49x against
1.53-1.57x, and its slowest prompt no slower than plain (prompt lookup alone's: 0.75-0.93x)."""


def shipped_drafter(target_name: str) -> Path | None:
    """The trained drafter shipped in the package for a built-in target, if there is one."""
    if not target_name or Path(target_name).name != target_name:  # a directory or hub id: nothing ships
        return None
    path = SHIPPED_DIR / target_name
    return path if is_trained_drafter(path) else None


def same_tokenizer(target_tokenizer, draft_tokenizer) -> bool:
    """Whether the draft means the same string by every token id the target knows. Extra ids on
    either side (padding, added specials past the shared range) are tolerated."""
    target_vocab = {i: s for s, i in target_tokenizer.get_vocab().items()}
    draft_vocab = {i: s for s, i in draft_tokenizer.get_vocab().items()}
    shared = min(len(target_vocab), len(draft_vocab))
    return all(target_vocab.get(i) == draft_vocab.get(i) for i in range(shared))


def model_drafter(kind: str, draft: str, target, dtype, device: str, backend: str) -> Drafter:
    """model:NAME drafting for `target`: a draft model with the target's tokenizer drafts in the
    target's ids; one with another tokenizer (or any, for model-tli and model-slem) through the
    two vocabularies' intersection (drafters/cross_tokenizer.py)."""
    from ..backends import make_backend, target_backend
    from ..models import load_model
    from .vocab_map import intersect, token_bytes

    loaded = load_model(draft, dtype, device)
    target_width = target.model.get_output_embeddings().weight.shape[0]
    label = Path(draft).name or draft
    # a .gguf draft model runs on its own blocks, int8 activations
    draft_backend = target_backend(loaded, backend) if loaded.blocks_only else make_backend(loaded.model, backend)
    if kind == "model" and same_tokenizer(target.tokenizer, loaded.tokenizer) and draft_backend.vocab_size >= target_width:
        return ModelDrafter(draft_backend, target_width, label=label)
    spellings = token_bytes(loaded.tokenizer), token_bytes(target.tokenizer)
    vocab = intersect(*spellings, target_width, draft_backend.vocab_size)
    if vocab.size == 0:
        raise SpecdecError(f"the draft model {draft!r} shares no token with the target {target.name!r} (no token of "
                           "one spells the same bytes as a token of the other): use a draft model of a related "
                           "family, or a drafter that needs no model: prompt-lookup or suffix")
    way = {"model": "auto", "model-tli": "tli", "model-slem": "slem"}[kind]
    return CrossTokenizerDrafter(draft_backend, loaded.tokenizer, target.tokenizer, vocab, label, way=way,
                                 spellings=spellings)


def drafts_on_blocks(drafter_specs: list[str]) -> bool:
    """Whether one of these drafters drafts with the target's GGUF blocks (self-q4): the target must
    then be loaded in float32, the dtype the blocks take."""
    return any(parse_drafter(spec)[0] == "self-q4" for spec in drafter_specs)


def target_weights(weights: str, drafter_specs: list[str], target: str) -> str:
    """--weights for `target` drafted for by these drafters: `auto` means float when one of them is
    self-q4 (it drafts with the GGUF blocks for the target on its float weights), which a .gguf file,
    blocks only, cannot be."""
    if drafts_on_blocks(drafter_specs) and is_gguf_path(target):
        raise SpecdecError("--drafter self-q4 drafts with a target's GGUF blocks while the target runs on its float "
                           "weights; a .gguf file runs on its own blocks and has no float weights to run: draft "
                           "for it with prompt-lookup, suffix or model:SMALLER.gguf")
    if weights == "auto" and drafts_on_blocks(drafter_specs):
        return "float"
    return weights


def build_drafter(spec: str, target, dtype="auto", device: str = "cpu", backend: str = "auto",
                  target_on_blocks: bool = False) -> Drafter | None:
    """A drafter named as DRAFTER_SYNTAX says, for `target` (the LoadedModel it drafts for): the
    argument is the draft model (model:NAME), the n-gram table file (ngram:FILE, ngram-tree:FILE;
    default: the one shipped for a built-in target) or the trained drafter's directory (trained:DIR; default: the
    one shipped for the target). self-q4 drafts with the target's own GGUF blocks (int8 activations)
    for the target running on its dequantised float weights (`target_on_blocks` False)."""
    from ..backends import make_backend
    from ..models import tokenizer_fingerprint

    kind, draft = parse_drafter(spec)
    if kind == "none":
        return None
    if kind == "auto":  # prompt lookup (a tree off the kernels) at T=0; at T>0 the shipped trained drafter, if any
        shipped = shipped_drafter(target.name)
        if not shipped:
            return AutoPromptLookup()
        trained = load_trained_drafter(shipped, target)  # one net; the engine asks one side per generation
        greedy = LookupElseTrained(AutoPromptLookup(), trained) if target.name in TRAINED_ALSO_AT_T0 else AutoPromptLookup()
        return ByTemperature(greedy, trained)
    if kind == "prompt-lookup":
        return PromptLookupDrafter()
    if kind == "prompt-lookup-tree":
        return PromptLookupTreeDrafter()
    if kind == "suffix":
        return SuffixDrafter()
    if kind in ("ngram", "ngram-tree"):
        shipped = Path(__file__).parent.parent / "data" / f"{target.name}.bigram.npz"
        if not draft and shipped.is_file():
            draft = str(shipped)  # the bigram table shipped for a built-in target
        if not draft:
            raise SpecdecError("the ngram drafter needs a table: ngram:FILE.npz (make one with `specdec ngram fit`)")
        if not Path(draft).is_file():
            raise SpecdecError(f"n-gram table {draft!r} does not exist (make one with `specdec ngram fit`)")
        table = NGramTable.load(draft)
        if table.tokenizer_id and table.tokenizer_id != tokenizer_fingerprint(target.tokenizer):
            raise SpecdecError(
                f"n-gram table {draft!r} was fitted for another tokenizer than {target.name!r}'s: "
                f"refit it with `specdec ngram fit --target {target.name}`"
            )
        return NGramTreeDrafter(table) if kind == "ngram-tree" else NGramDrafter(table)
    if kind in ("model", "model-tli", "model-slem"):
        if not draft:
            raise SpecdecError(f"the {kind} drafter needs a draft model: {kind}:NAME_OR_DIR")
        return model_drafter(kind, draft, target, dtype, device, backend)
    if kind == "self-q4":
        if target_on_blocks:
            raise SpecdecError("self-q4 drafts with the target's GGUF blocks for the target on its float weights; "
                               "the target runs on blocks already (--weights gguf, gguf-int8, q8_0 or q4_0): "
                               "use --weights float")
        from ..backends.gguf import choose_weights
        from ..backends.lean import quantised_backend

        # int8 activations: drafting is one row at a time, where they are fastest (quant.cpp)
        if target.gguf is not None:  # a built-in target: its file's own blocks
            gguf = choose_weights("gguf", target.gguf, target.dtype, "float32", backend,
                                  asked_by="--drafter self-q4 runs on the target's GGUF blocks")
            on_blocks = make_backend(target.model, "lean", gguf=gguf, int8_activations=True)
        else:  # any other: its float weights quantised to Q4_0 here
            if target.dtype != torch.float32:
                raise SpecdecError(
                    "--drafter self-q4 drafts on the target's weights quantised to Q4_0 blocks, which share the "
                    "target's embeddings and norms and take float32 activations, so the target loads in float32 "
                    f"(--dtype auto or float32), not {str(target.dtype).removeprefix('torch.')}")
            on_blocks = quantised_backend(target.model, "q4_0", target.dtype, backend)
        target_width = target.model.get_output_embeddings().weight.shape[0]
        return ModelDrafter(on_blocks, target_width, label="self-q4")
    if kind in ("trained", "trained-tree", "lookup-else-trained"):
        draft = draft or shipped_drafter(target.name)
        if not draft:
            raise SpecdecError(f"no trained drafter ships for {target.name!r}: give its directory, {kind}:DIR "
                               "(make one with `specdec train-drafter`)")
        if kind == "lookup-else-trained":  # prompt lookup where the context repeats, the trained drafter elsewhere
            return LookupElseTrained(AutoPromptLookup(), load_trained_drafter(draft, target))
        return load_trained_drafter(draft, target, tree=kind == "trained-tree")
    if is_drafter_directory(kind):
        return load_trained_drafter(kind, target)
    if Path(kind).exists():
        raise SpecdecError(f"{kind!r} is not a trained drafter's directory (it needs config.json and "
                           "model.safetensors, as `specdec train-drafter` writes them, or an EAGLE-3 checkpoint)")
    raise SpecdecError(f"unknown drafter {kind!r}: use {DRAFTER_SYNTAX}")
