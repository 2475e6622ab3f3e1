"""A trained drafter's directory (`specdec train-drafter`): `config.json` (kind, sizes, the target's
identity, the training recipe) and `model.safetensors` (the trained weights and the draft vocabulary;
the target's embedding and LM-head rows are taken from the target at load time). Writing it, reading
it back, and the checks that refuse a drafter made for another target or a damaged file."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from ..errors import SpecdecError
from .nets import KINDS, DraftConfig, DraftNet

CONFIG_FILE, WEIGHTS_FILE = "config.json", "model.safetensors"


def is_trained_drafter(path: str | Path) -> bool:
    """A directory with a drafter's config (it names a kind; a model's config does not) and weights."""
    config, weights = Path(path) / CONFIG_FILE, Path(path) / WEIGHTS_FILE
    if not (config.is_file() and weights.is_file()):
        return False
    try:
        return "kind" in json.loads(config.read_text())
    except (OSError, ValueError):
        return False


def target_tables(model, vocab: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The target's input embedding (all rows) and its LM-head rows of the draft vocabulary."""
    embed = model.get_input_embeddings().weight.detach()
    head = model.get_output_embeddings().weight.detach()[vocab]
    return embed, head


def build_net(config: DraftConfig, vocab: torch.Tensor, model) -> DraftNet:
    embed, head = target_tables(model, vocab)
    return DraftNet(config, vocab, embed, head)


def save_drafter(net: DraftNet, directory: str | Path, dtype: torch.dtype = torch.bfloat16) -> Path:
    """Write config.json and model.safetensors (weights in `dtype`, the vocabulary as int32)."""
    from safetensors.torch import save_file

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    state = {k: (v.to(torch.int32) if k == "vocab" else v.detach().to(dtype)).contiguous().cpu()
             for k, v in net.state_dict().items()}
    save_file(state, str(directory / WEIGHTS_FILE))
    (directory / CONFIG_FILE).write_text(json.dumps(net.config.to_dict(), indent=2) + "\n")
    return directory


def read_config(directory: str | Path) -> DraftConfig:
    path = Path(directory) / CONFIG_FILE
    try:
        data = json.loads(path.read_text())
        config = DraftConfig.from_dict(data)
    except (OSError, json.JSONDecodeError, TypeError) as exc:
        raise SpecdecError(f"{path} is not a trained drafter's config ({exc}): make one with `specdec train-drafter`") from None
    if config.kind not in KINDS:
        raise SpecdecError(f"{path}: unknown drafter kind {config.kind!r} (known: {', '.join(KINDS)})")
    return config


def check_target(config: DraftConfig, identity: dict, directory) -> None:
    """Refuse a drafter trained for another target, naming what differs."""
    trained = config.target
    for key, what in (("tokenizer", "tokenizer"), ("model_type", "architecture"), ("hidden_size", "hidden size"),
                      ("vocab_width", "vocabulary width"), ("num_layers", "layer count"), ("weights", "weights")):
        if trained.get(key) != identity.get(key):
            raise SpecdecError(
                f"the drafter in {directory} was trained for target {trained.get('name')!r}, not for "
                f"{identity.get('name')!r}: their {what} differ ({trained.get(key)} vs {identity.get(key)}). "
                f"Use it with --target {trained.get('name')}, or train one for this target with "
                f"`specdec train-drafter --target {identity.get('name')}`")


def check_vocab(vocab: torch.Tensor | None, width: int, where) -> torch.Tensor:
    """The draft vocabulary as saved, refused unless it lists distinct target ids in [0, width): a
    repeated id would make the q the verifier is told differ from the q a token is drawn from."""
    if vocab is None or vocab.dim() != 1 or vocab.numel() == 0 or vocab.dtype.is_floating_point:
        raise SpecdecError(f"{where} has no draft vocabulary (a non-empty 1-D integer tensor 'vocab'): "
                           "it was not written by `specdec train-drafter`")
    vocab = vocab.long()
    bad = vocab[(vocab < 0) | (vocab >= width)]
    if bad.numel():
        raise SpecdecError(f"{where}: the draft vocabulary holds id {int(bad[0])}, outside the target's "
                           f"{width} ids: the drafter was made for another target")
    if vocab.unique().numel() != vocab.numel():
        values, counts = vocab.unique(return_counts=True)
        raise SpecdecError(f"{where}: the draft vocabulary lists id {int(values[counts > 1][0])} more than once; "
                           "the file is damaged: train the drafter again")
    return vocab

def load_state(net: DraftNet, state: dict[str, torch.Tensor], where) -> DraftNet:
    """`net` with the saved `state` loaded, refused unless it has exactly the net's tensors."""
    missing, unexpected = net.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise SpecdecError(f"{where} does not match its config: missing {missing}, unexpected {unexpected}")
    return net
