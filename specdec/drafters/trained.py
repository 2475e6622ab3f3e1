"""Drafters trained for one target (`specdec train-drafter`): saving, loading, and drafting.

A trained drafter is a directory with `config.json` (kind, sizes, the target's identity, the
training recipe) and `model.safetensors` (the trained weights and the draft vocabulary; the target's
embedding and LM-head rows are taken from the target at load time). Loading checks the identity
and refuses a drafter made for another target.

- draft-lm drafts like any draft model (ModelDrafter over a Backend with its own KV cache);
- eagle and medusa read the target's features (`reads_features`): they `bind` to the target
  backend, and the engine has it record features for the generations they serve. After a round the
  target holds positions 0..L-2 of a context of length L (its newest token x_{L-1} is scored next
  round), so features f_0..f_{L-2} are known:
  eagle feeds the pairs (f_j, x_{j+1}) it has not seen, predicts f_{L-1}, reads d1 = x_L through
  the head, feeds (f̂_{L-1}, d1), and so on; its cache then drops the speculative pairs.
  medusa's head k reads f_{L-2} and proposes x_{L-1+k}, k = 1..K, independently.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from ..backends import Backend
from ..config import SamplingParams
from ..errors import SpecdecError
from ..sampling import draw, probs
from .base import Drafter, Proposal
from .model import ModelDrafter
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


def read_net(directory: str | Path, target) -> DraftNet:
    """The drafter's network saved in `directory`, checked to be for `target` (a LoadedModel), as
    saved: plain modules on the CPU (what training continues from)."""
    from safetensors.torch import load_file

    from ..models import target_identity

    directory = Path(directory)
    if not is_trained_drafter(directory):
        raise SpecdecError(f"{directory} holds no trained drafter ({CONFIG_FILE} and {WEIGHTS_FILE}): "
                           "make one with `specdec train-drafter`")
    config = read_config(directory)
    check_target(config, target_identity(target), directory)
    state = load_file(str(directory / WEIGHTS_FILE))
    vocab = check_vocab(state.get("vocab"), target.model.get_output_embeddings().weight.shape[0],
                        directory / WEIGHTS_FILE)
    net = build_net(config, vocab, target.model)
    missing, unexpected = net.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise SpecdecError(f"{directory / WEIGHTS_FILE} does not match its config: missing {missing}, unexpected {unexpected}")
    return net


def load_net(directory: str | Path, target) -> DraftNet:
    """The drafter's network for `target` (a LoadedModel), in the target's dtype and device, on the
    bf16 kernels or pre-packed for oneDNN where those apply."""
    from ..modeling import kernels
    from ..modeling.packing import can_pack

    device = target.model.device
    net = read_net(directory, target).to(device=device, dtype=target.dtype).eval()
    if device.type == "cpu" and target.dtype in (torch.bfloat16, torch.float32):
        kern = kernels.load() if target.dtype == torch.bfloat16 else None
        if kern is not None:
            net.use_kernels(kern)
        elif can_pack(target.dtype):
            net.pack()
    return net


def _full_width(values: torch.Tensor, vocab: torch.Tensor, width: int, fill: float) -> torch.Tensor:
    """(n, |S|) values over the draft vocabulary -> (n, width), `fill` outside it."""
    out = values.new_full((values.shape[0], width), fill)
    out[:, vocab] = values
    return out


def _draw(logits: torch.Tensor, vocab: torch.Tensor, width: int, sampling: SamplingParams,
          generator: torch.Generator, position: int) -> tuple[int, torch.Tensor | None]:
    """One draft token for sequence index `position` from (1, |S|) logits: the argmax at
    temperature 0, else a draw with its q (V,)."""
    if sampling.greedy:
        return int(vocab[int(logits.argmax())]), None
    q = _full_width(probs(logits, sampling), vocab, width, 0.0)[0]  # (V,)
    return draw(q, sampling, generator, position), q


class DraftLMBackend(Backend):
    """A trained draft LM behind the backend interface, so ModelDrafter drafts with it."""

    path = "draft-lm"

    def __init__(self, net: DraftNet, vocab_width: int):
        super().__init__()
        self.net, self.vocab_size, self.max_length = net, vocab_width, None
        self.device = net.vocab.device
        self.cache = net.new_cache()

    def _reset(self) -> None:
        self.cache = self.net.new_cache()

    def _rollback(self, length: int) -> None:
        self.cache.length = length

    can_fork = True

    def fork(self) -> DraftLMBackend:
        return DraftLMBackend(self.net, self.vocab_size)

    @torch.inference_mode()
    def _forward(self, ids: torch.Tensor, start: int) -> torch.Tensor:
        logits = self.net.lm(ids.to(self.device)[None], self.cache, start)[0].float()  # (n, |S|)
        return _full_width(logits, self.net.vocab, self.vocab_size, float("-inf"))


class EagleDrafter(Drafter):
    cost_prior = 0.05
    reads_features = True

    def __init__(self, net: DraftNet, label: str):
        self.net, self.name = net, f"eagle:{label}"
        self.cache = net.new_cache()
        self.target: Backend | None = None

    def bind(self, target: Backend) -> None:
        self.target = target

    def fork(self) -> EagleDrafter:
        twin = super().fork()
        twin.cache = self.net.new_cache()
        return twin

    def begin(self, prompt: torch.Tensor) -> None:
        self.cache = self.net.new_cache()

    @torch.inference_mode()
    def propose(self, context: torch.Tensor, gamma: int, sampling: SamplingParams,
                generator: torch.Generator) -> Proposal:
        known = self.target.length  # features f_0..f_{known-1}; the context is one token longer
        if known == 0 or known + 1 != context.numel():
            return Proposal.empty()
        start = min(self.cache.length, known - 1)
        features = self.target.hidden(start, known)[None]  # (1, m, d)
        next_tokens = context[start + 1 : known + 1].to(features.device)[None]  # (1, m)
        predicted = self.net.eagle(features, next_tokens, self.cache, start)[:, -1:]  # (1, 1, d): f̂_{known}
        tokens, dists = [], []
        for i in range(gamma):
            token, q = _draw(self.net.logits(predicted[0]).float(), self.net.vocab, self.target.vocab_size,
                             sampling, generator, position=context.numel() + i)
            tokens.append(token)
            if q is not None:
                dists.append(q)
            if i + 1 < gamma:
                predicted = self.net.eagle(predicted, torch.tensor([[token]], device=features.device), self.cache,
                                           known + i)
        self.cache.length = known  # keep only pairs built from the target's true features
        return Proposal(torch.tensor(tokens, dtype=torch.long), torch.stack(dists) if dists else None)

    def feedback(self, kept: int) -> None:
        self.cache.length = min(self.cache.length, max(kept - 1, 0))


class MedusaDrafter(Drafter):
    cost_prior = 0.02
    reads_features = True

    def __init__(self, net: DraftNet, label: str):
        self.net, self.name = net, f"medusa:{label}"
        self.target: Backend | None = None

    def bind(self, target: Backend) -> None:
        self.target = target

    @torch.inference_mode()
    def propose(self, context: torch.Tensor, gamma: int, sampling: SamplingParams,
                generator: torch.Generator) -> Proposal:
        known = self.target.length
        if known == 0 or known + 1 != context.numel():
            return Proposal.empty()
        k = min(gamma, self.net.config.medusa_heads)
        feature = self.target.hidden(known - 1, known)  # (1, d): f_{L-2}
        logits = self.net.logits(self.net.medusa_features(feature)[:k, 0]).float()  # (k, |S|)
        tokens, dists = [], []
        for i in range(k):
            token, q = _draw(logits[i : i + 1], self.net.vocab, self.target.vocab_size, sampling, generator,
                             position=context.numel() + i)
            tokens.append(token)
            if q is not None:
                dists.append(q)
        return Proposal(torch.tensor(tokens, dtype=torch.long), torch.stack(dists) if dists else None)


def load_trained_drafter(directory: str | Path, target) -> Drafter:
    """The drafter saved in `directory`, checked against `target` (a LoadedModel)."""
    net = load_net(directory, target)
    label = Path(directory).name
    width = target.model.get_output_embeddings().weight.shape[0]
    if net.config.kind == "draft-lm":
        drafter = ModelDrafter(DraftLMBackend(net, width), width, label=label)
        drafter.name = f"draft-lm:{label}"
        return drafter
    if net.config.kind == "eagle":
        return EagleDrafter(net, label)
    return MedusaDrafter(net, label)
