"""Drafters trained for one target (`specdec train-drafter`): saving, loading, and drafting.

A trained drafter is a directory with `config.json` (kind, sizes, the target's identity, the
training recipe) and `model.safetensors` (the trained weights and the draft vocabulary; the target's
embedding and LM-head rows are taken from the target at load time). Loading checks the identity
and refuses a drafter made for another target.

- draft-lm drafts like any draft model (ModelDrafter over a Backend with its own KV cache);
- eagle, eagle3 and medusa read the target's features (`reads_features`; eagle3 the hidden states
  entering three of its layers, `feature_layers`): they `bind` to the target backend, and the
  engine has it record features for the generations they serve. After a round the
  target holds positions 0..L-2 of a context of length L (its newest token x_{L-1} is scored next
  round), so features f_0..f_{L-2} are known:
  eagle feeds the pairs (f_j, x_{j+1}) it has not seen, predicts f_{L-1}, reads d1 = x_L through
  the head, feeds (f̂_{L-1}, d1), and so on; its cache then drops the speculative pairs. eagle3
  drafts the same way with fc(features) for f and its pre-norm outputs for f̂.
  medusa's head k reads f_{L-2} and proposes x_{L-1+k}, k = 1..K, independently.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from ..backends import Backend
from ..config import SamplingParams
from ..errors import SpecdecError
from ..modeling.tree import TreeLayout
from ..sampling import coupled_draw, probs, samples
from ..vocab_map import VocabMap
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


def is_drafter_directory(path: str | Path) -> bool:
    """A drafter this project loads: its own (is_trained_drafter) or an EAGLE-3 checkpoint."""
    from .eagle3_format import checkpoint_format

    return is_trained_drafter(path) or checkpoint_format(path) is not None


def read_net(directory: str | Path, target) -> DraftNet:
    """The drafter's network saved in `directory`, checked to be for `target` (a LoadedModel), as
    saved: plain modules on the CPU (what training continues from). An EAGLE-3 checkpoint (vLLM's
    or SGLang's layout) is imported (drafters/eagle3_format)."""
    from safetensors.torch import load_file

    from ..models import target_identity
    from . import eagle3_format

    directory = Path(directory)
    if eagle3_format.checkpoint_format(directory) is not None:
        return eagle3_format.read(directory, target)
    if not is_trained_drafter(directory):
        raise SpecdecError(f"{directory} holds no trained drafter ({CONFIG_FILE} and {WEIGHTS_FILE}): "
                           "make one with `specdec train-drafter`")
    config = read_config(directory)
    check_target(config, target_identity(target), directory)
    state = load_file(str(directory / WEIGHTS_FILE))
    vocab = check_vocab(state.get("vocab"), target.model.get_output_embeddings().weight.shape[0],
                        directory / WEIGHTS_FILE)
    return load_state(build_net(config, vocab, target.model), state, directory / WEIGHTS_FILE)


def load_state(net: DraftNet, state: dict[str, torch.Tensor], where) -> DraftNet:
    """`net` with the saved `state` loaded, refused unless it has exactly the net's tensors."""
    missing, unexpected = net.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise SpecdecError(f"{where} does not match its config: missing {missing}, unexpected {unexpected}")
    return net


DRAFT_BLOCKS = "Q4_0"
"""The block type an eagle/eagle3 net's matrices take for drafting on quant.cpp (SPECDEC_DRAFT_BLOCKS
names another of quant.KINDS, or 0 to keep the float paths). A draft step reads the net's weights from
memory (a target pass between two steps evicts them from every cache level): Q4_0 reads about half of
Q8_0's bytes, a draft token 1.13 -> 1.0 ms on the AMX Xeon and the drafter's kernels 0.85 -> 0.47 ms a
round on Zen 2, with the same acceptance in the engine (docs/results.md)."""


def draft_blocks() -> str | None:
    """The block type trained eagle/eagle3 nets draft with here, or None where they keep float weights
    (no quant.cpp packed int8 kernels here: they need AVX2 and F16C; or SPECDEC_DRAFT_BLOCKS=0)."""
    from ..modeling import quant

    kind = os.environ.get("SPECDEC_DRAFT_BLOCKS", DRAFT_BLOCKS)
    if kind == "0" or not quant.packed_int8():
        return None
    if kind not in quant.KINDS:
        raise SpecdecError(f"SPECDEC_DRAFT_BLOCKS={kind!r} is not a block type: use one of {', '.join(quant.KINDS)}, "
                           "or 0 for float weights")
    return kind


def load_net(directory: str | Path, target) -> DraftNet:
    """The drafter's network for `target` (a LoadedModel), on its device, drafting on the fastest
    path here:

    - eagle and eagle3 where quant.cpp's packed kernels run (AVX2): every matrix as int8 blocks (`draft_blocks`,
      DraftNet.use_blocks), float32 activations quantised to int8 as the GGUF target's are: one draft
      token reads ~1 byte a weight and a layer is one call (c, a draft token's cost over a target
      step, 0.35 -> 0.09 on the blocks target, measured: docs/results.md);
    - else for a float32 GGUF target, in bfloat16 on kernels.cpp where that runs (one row is
      memory-bound, and float32 weights on oneDNN read twice the bytes);
    - else in the target's dtype, on kernels.cpp (bf16) or pre-packed for oneDNN.

    Exactness does not depend on the draft's numbers: the verifier uses the q the tokens were drawn
    from; the target's features are cast to the net's dtype where the net reads them
    (DraftNet.features_in)."""
    from ..modeling import kernels
    from ..modeling.packing import can_pack

    device = target.model.device
    dtype = target.dtype
    net = read_net(directory, target)
    if device.type == "cpu" and net.config.kind in ("eagle", "eagle3"):
        kind = draft_blocks()
        if kind is not None and net.fits_blocks(kind):
            return net.to(device=device, dtype=torch.float32).eval().use_blocks(kind)
        if dtype == torch.float32 and getattr(target, "gguf", None) is not None and kernels.load() is not None:
            dtype = torch.bfloat16
    net = net.to(device=device, dtype=dtype).eval()
    if device.type == "cpu" and dtype in (torch.bfloat16, torch.float32):
        kern = kernels.load() if dtype == torch.bfloat16 else None
        if kern is not None:
            net.use_kernels(kern)
        elif can_pack(dtype):
            net.pack()
    return net


class DraftLMBackend(Backend):
    """A trained draft LM behind the backend interface, so ModelDrafter drafts with it."""

    path = "draft-lm"

    def __init__(self, net: DraftNet, vocab_width: int):
        super().__init__()
        self.net, self.vocab_size, self.max_length = net, vocab_width, None
        self.vocab = VocabMap(net.vocab, vocab_width)
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
        return self.vocab.full(logits, float("-inf"))


class EagleDrafter(Drafter):
    """EAGLE and EAGLE-3 drafting a chain (the net's kind decides what it reads and feeds back)."""

    cost_prior = 0.05
    reads_features = True

    def __init__(self, net: DraftNet, label: str):
        self.net, self.name = net, f"{net.config.kind}:{label}"
        self.cache = net.new_cache()
        self.target: Backend | None = None

    @property
    def feature_layers(self) -> tuple[int, ...]:
        return self.net.feature_layers

    def bind(self, target: Backend) -> None:
        self.target = target
        self.vocab = VocabMap(self.net.vocab, target.vocab_size)  # the head's rows -> the target's ids

    @property
    def vocab_share(self) -> float | None:
        return self.net.vocab.numel() / self.target.vocab_size if self.target is not None else None

    def fork(self) -> EagleDrafter:
        twin = super().fork()
        twin.cache = self.net.new_cache()
        return twin

    def begin(self, prompt: torch.Tensor) -> None:
        self.cache = self.net.new_cache()

    def _catch_up(self, context: torch.Tensor) -> tuple[int, torch.Tensor, torch.Tensor] | None:
        """Feed the draft net the (feature, next token) pairs it has not seen: returns the target's
        length `known`, its last feature f_{known-1} (d,) and the predicted f̂_{known} (1, 1, d);
        None when the target does not hold features for this context."""
        known = self.target.length  # features f_0..f_{known-1}; the context is one token longer
        if known == 0 or known + 1 != context.numel():
            return None
        start = min(self.cache.length, known - 1)
        features = self.net.features_in(self.target.hidden(start, known)[None])  # (1, m, d)
        next_tokens = context[start + 1 : known + 1].to(features.device)[None]  # (1, m)
        return known, features[0, -1], self.net.predict(features, next_tokens, self.cache, start)[:, -1:]

    @torch.inference_mode()
    def propose(self, context: torch.Tensor, gamma: int, sampling: SamplingParams,
                generator: torch.Generator) -> Proposal:
        caught_up = self._catch_up(context)
        if caught_up is None:
            return Proposal.empty()
        return self._draft(context, gamma, sampling, generator, *caught_up)

    def _draft(self, context: torch.Tensor, gamma: int, sampling: SamplingParams, generator: torch.Generator,
               known: int, last_feature: torch.Tensor, predicted: torch.Tensor) -> Proposal:
        """Draft from the caught-up state (see _catch_up): a chain of up to gamma tokens."""
        tokens, dists = [], []
        for i in range(gamma):
            token, _, q = self.vocab.draw(self.net.draft_logits(predicted[0]).float(), sampling, generator,
                                          position=context.numel() + i)
            tokens.append(token)
            if q is not None:
                dists.append(q)
            if i + 1 < gamma:
                predicted = self.net.predict(predicted, torch.tensor([[token]], device=last_feature.device),
                                             self.cache, known + i)
        self.cache.length = known  # keep only pairs built from the target's true features
        return Proposal(torch.tensor(tokens, dtype=torch.long), torch.stack(dists) if dists else None)

    def feedback(self, kept: int) -> None:
        self.cache.length = min(self.cache.length, max(kept - 1, 0))


class EagleTreeDrafter(EagleDrafter):
    """EAGLE drafting a token tree (EAGLE-2's dynamic tree, simplified): each level expands the
    `beam` nodes of highest cumulative draft probability into `branch` children each, for up to
    `gamma` levels and `max_nodes` nodes; the draft net runs each level as one tree pass over its
    own cache (every node sees the context and its ancestors).

    Which children a node gets keeps verification exact (specdec.rejection, token trees):
    - T = 0: the `branch` likeliest tokens of q (point masses; the target's argmax decides);
    - drafter-invariant sampling: the position's coupled draw from q, then the likeliest others
      (point masses; the target's own draw decides);
    - rejection sampling: `branch` independent draws from q, all kept, so a node's children never
      depend on their own values (the multi-round rule's premise); which nodes are expanded may
      depend on anything the drafter knows.

    Worked example, gamma=2, branch=2, beam=1: the root's two likeliest tokens a, b become nodes 0
    and 1; the likelier, a, is expanded into its two likeliest, c and d: tokens [a, b, c, d],
    parents [-1, -1, 0, 0]."""

    def __init__(self, net: DraftNet, label: str, branch: int = 2, beam: int = 2, max_nodes: int = 6):
        super().__init__(net, label)
        self.name = f"{net.config.kind}-tree:{label}"
        if min(branch, beam, max_nodes) < 1:
            raise ValueError(f"branch, beam and max_nodes must be >= 1, got {branch}, {beam}, {max_nodes}")
        self.branch, self.beam, self.max_nodes = branch, beam, max_nodes

    def _children(self, feature: torch.Tensor, sampling: SamplingParams, generator: torch.Generator,
                  position: int) -> tuple[list[tuple[int, float]], torch.Tensor | None]:
        """A node's children as (target token id, draft probability), and the q they were drawn
        from (rejection sampling only; None for point masses)."""
        logits = self.net.draft_logits(feature[None]).float()  # (1, |S|)
        vocab = self.net.vocab
        if sampling.greedy:
            top = torch.softmax(logits[0], -1).topk(min(self.branch, logits.shape[-1]))
            return [(int(vocab[i]), float(v)) for v, i in zip(top.values, top.indices)], None
        compact = probs(logits, sampling)  # (1, |S|)
        q = self.vocab.full(compact, 0.0)[0]  # (V,)
        if sampling.drafter_invariant:
            first = coupled_draw(q, sampling.seed, position)
            others = [int(t) for t in q.topk(self.branch + 1).indices if int(t) != first and q[t] > 0]
            return [(t, float(q[t])) for t in [first] + others[: self.branch - 1]], None
        drawn = [int(vocab[i]) for i in samples(compact[0], generator, self.branch)]  # over |S|: see VocabMap
        return [(t, float(q[t])) for t in drawn], q

    def _draft(self, context: torch.Tensor, gamma: int, sampling: SamplingParams, generator: torch.Generator,
               known: int, last_feature: torch.Tensor, root_prediction: torch.Tensor) -> Proposal:
        """Draft a tree of up to gamma levels from the caught-up state (see _catch_up)."""
        predicted = {-1: root_prediction[0, 0]}  # node -> its f̂
        self.cache.length = known  # pairs built from the target's true features only
        root_pair = (last_feature, int(context[known]))  # (f_{known-1}, x_known), at slot known - 1
        tokens: list[int] = []
        parents: list[int] = []
        qs: list[torch.Tensor] = []
        score = {-1: 1.0}
        frontier = [-1]
        for level in range(gamma):
            offers = []  # (cumulative score, parent, token, q), grouped by parent in frontier order
            for node in frontier:
                children, q = self._children(predicted[node], sampling, generator, context.numel() + level)
                offers.append([(score[node] * prob, node, token, q) for token, prob in children])
            room = self.max_nodes - len(tokens)
            if sampling.greedy or sampling.drafter_invariant:  # point masses: keep the best offers anywhere
                chosen = sorted((o for group in offers for o in group), key=lambda o: -o[0])[:room]
                chosen.sort(key=lambda o: (frontier.index(o[1]), -o[0]))  # by parent, likeliest first
            else:  # a node's draws all, or none of them
                chosen = []
                for group in offers:
                    if len(chosen) + len(group) > room:
                        break
                    chosen += group
            if not chosen:
                break
            new = []
            for value, parent, token, q in chosen:
                tokens.append(token)
                parents.append(parent)
                if q is not None:
                    qs.append(q)
                score[len(tokens) - 1] = value
                new.append(len(tokens) - 1)
            if level + 1 == gamma or len(tokens) >= self.max_nodes:
                break
            # f̂ of every node so far, in one tree pass: the root pair again (row 0), then each node
            # with its parent's f̂ (the root's for the first level)
            inputs = torch.stack([root_pair[0]] + [predicted[parent] for parent in parents])[None]
            ids = torch.tensor([root_pair[1]] + tokens, device=last_feature.device)[None]
            out = self.net.predict(inputs, ids, self.cache, known - 1, TreeLayout.of(torch.tensor(parents)))[0]
            self.cache.length = known
            for node in range(len(tokens)):
                predicted[node] = out[1 + node]
            frontier = sorted(new, key=lambda node: -score[node])[: self.beam]
        if not tokens:
            return Proposal.empty()
        return Proposal(torch.tensor(tokens, dtype=torch.long), torch.stack(qs) if qs else None,
                        torch.tensor(parents, dtype=torch.long), torch.tensor([score[i] for i in range(len(tokens))]))


class MedusaDrafter(Drafter):
    cost_prior = 0.02
    reads_features = True

    def __init__(self, net: DraftNet, label: str):
        self.net, self.name = net, f"medusa:{label}"
        self.target: Backend | None = None

    def bind(self, target: Backend) -> None:
        self.target = target
        self.vocab = VocabMap(self.net.vocab, target.vocab_size)  # the heads' rows -> the target's ids

    @property
    def vocab_share(self) -> float | None:
        return self.net.vocab.numel() / self.target.vocab_size if self.target is not None else None

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
            token, _, q = self.vocab.draw(logits[i : i + 1], sampling, generator, position=context.numel() + i)
            tokens.append(token)
            if q is not None:
                dists.append(q)
        return Proposal(torch.tensor(tokens, dtype=torch.long), torch.stack(dists) if dists else None)


def load_trained_drafter(directory: str | Path, target, tree: bool = False) -> Drafter:
    """The drafter saved in `directory`, checked against `target` (a LoadedModel); with `tree`, an
    EAGLE drafter that proposes token trees (EagleTreeDrafter)."""
    net = load_net(directory, target)
    label = Path(directory).name
    if tree:
        if net.config.kind not in ("eagle", "eagle3"):
            raise SpecdecError(f"tree drafting needs an eagle or eagle3 drafter; {directory} holds a {net.config.kind} "
                               "drafter (use trained:DIR for it)")
        return EagleTreeDrafter(net, label)
    width = target.model.get_output_embeddings().weight.shape[0]
    if net.config.kind == "draft-lm":
        drafter = ModelDrafter(DraftLMBackend(net, width), width, label=label)
        drafter.name = f"draft-lm:{label}"
        return drafter
    if net.config.kind in ("eagle", "eagle3"):
        return EagleDrafter(net, label)
    return MedusaDrafter(net, label)
