"""The training loop of `specdec train-drafter`: distil the target into a draft-lm, Medusa heads or an
EAGLE head, on the self-distillation data of `training.data`.

Losses (p = the target's top-K distribution at temperature 1, q = the draft's over its vocabulary S;
ids outside S cannot be drafted and drop out):

- draft-lm: soft cross-entropy −Σ p log q at every position (KL to the target up to p's entropy);
- medusa: head k at position t against p at t+k, weighted 0.8^(k−1);
- eagle: regression of the next feature (smooth L1, in units of the features' RMS) plus the soft
  cross-entropy of the logits read from the predicted feature; `unroll` steps in all, each after the
  first fed the previous step's predictions (the way it drafts), so errors it feeds itself are
  trained on too.
- eagle3: EAGLE-3's training-time test: `unroll` steps, step s fed its own step s-1 outputs and
  attending exactly as drafting does (DraftNet.eagle3_unrolled); soft cross-entropy only, step s
  weighted 0.8^s. It reads the data's aux features (the hidden states entering `aux_layers`).

Positions inside the prompt count `prompt_weight` as much as the answer's: drafting happens in
answers, while prompts (man pages, code) are most of the positions.

Progress shows the loss and, every `eval_every` steps, the held-out first-position agreement with the
target's argmax (α at temperature 0) and Σ min(p, q) (α at temperature 1), on answer positions of the
held-out sequences (every 20th).
"""

from __future__ import annotations

import contextlib
import math
import signal
import sys
import threading
import time
from collections.abc import Collection
from dataclasses import asdict, dataclass, replace

import torch
import torch.nn.functional as F

from ..drafters.checkpoint import build_net
from ..drafters.eagle3_format import default_aux_layers
from ..drafters.nets import DraftConfig, DraftNet, head_dim_for
from ..errors import SpecdecError
from ..models import auto_dtype, target_identity
from .data import DistillData

SIZES = {"s": dict(layers=1, ffn=1536), "m": dict(layers=2, ffn=1536), "l": dict(layers=4, ffn=1536)}
"""draft-lm sizes for the draft-size experiment (eagle uses one layer of ffn 1536; medusa 4 heads)."""


@dataclass
class TrainRecipe:
    kind: str
    layers: int = 1
    ffn: int = 1536
    medusa_heads: int = 4
    vocab_size: int = 8192
    steps: int | None = None
    minutes: float = 30.0
    batch: int = 16
    window: int = 160
    lr: float = 2e-3
    warmup: int = 20
    eval_every: int = 50
    seed: int = 0
    unroll: int = 3
    prompt_weight: float = 0.3
    aux_layers: tuple | None = None
    """eagle3: the target layers it reads (None: 2, N/2, N-3)."""
    feature_loss: float = 1.0
    """eagle: the weight of the feature regression beside the token loss (0.5 × soft cross-entropy);
    0 trains on tokens alone, as EAGLE-3 does (its finding: the regression takes capacity from the
    tokens)."""
    bf16: bool | None = None
    """Matrix products in bfloat16 under autocast (weights, optimiser and losses stay float32;
    attention runs in float32): None chooses it where the CPU has fast bf16 matmuls (AVX-512 BF16 or
    AMX), where a step measured 1.7x faster (docs/benchmarks.md's log)."""


def draft_vocabulary(data: DistillData, size: int, always: set[int]) -> torch.Tensor:
    """The `size` ids the target emits most: its argmax at every position plus its answers' tokens,
    and the ids in `always` (end-of-sequence)."""
    width = data.token_counts.numel()
    score = torch.bincount(data.topk_ids[:, 0], minlength=width)[:width].float() + data.token_counts.float()
    score[list(always)] = float("inf")
    size = min(size, width)
    return score.topk(size).indices.sort().values


def mass_covered(data: DistillData, vocab: torch.Tensor) -> float:
    """Share of the target's (top-K) probability mass that falls inside the draft vocabulary."""
    inside = torch.zeros(data.token_counts.numel(), dtype=torch.bool)
    inside[vocab] = True
    return float((data.topk_probs * inside[data.topk_ids]).sum() / data.topk_probs.sum())


class Windows:
    """Windows of whole sequences (no window crosses two), padded to one length: random ones that reach
    into the answer for training, the last one of each sequence for measuring."""

    def __init__(self, data: DistillData, sequences: list[int], window: int, seed: int, prompt_weight: float):
        self.data, self.sequences, self.window = data, sequences, window
        self.answer = torch.zeros(data.tokens.numel(), dtype=torch.bool)  # position t predicts an answer token
        for s in sequences:
            self.answer[int(data.offsets[s]) + int(data.prompt_lengths[s]) - 1 : int(data.offsets[s + 1])] = True
        self.prompt_weight = prompt_weight
        self.generator = torch.Generator().manual_seed(seed)
        lengths = (data.offsets[1:] - data.offsets[:-1])[sequences].float()
        self.weights = lengths.clamp(max=window)  # longer sequences are drawn more often

    def batch(self, size: int, fixed: list[int] | None = None) -> dict[str, torch.Tensor]:
        data, w = self.data, self.window
        picks = fixed if fixed is not None else torch.multinomial(self.weights, size, True, generator=self.generator).tolist()
        positions, valid = [], []
        for pick in picks:
            s = self.sequences[pick]
            lo, hi = int(data.offsets[s]), int(data.offsets[s + 1])
            if hi - lo <= w:
                start = lo
            elif fixed is not None:  # measuring: the window that ends with the answer
                start = hi - w
            else:  # training: windows that reach at least half-way into the answer
                first = max(lo, min(hi - w, lo + int(data.prompt_lengths[s]) - w // 2))
                start = first + int(torch.randint(0, hi - w - first + 1, (1,), generator=self.generator))
            n = min(w, hi - start)
            positions.append(torch.cat([torch.arange(start, start + n), torch.full((w - n,), start)]))
            valid.append(torch.arange(w) < n)
        index = torch.stack(positions)  # (B, W)
        valid = torch.stack(valid)
        answer = self.answer[index] & valid
        out = {"tokens": data.tokens[index], "topk_ids": data.topk_ids[index],
               "topk_probs": data.topk_probs[index], "valid": valid, "answer": answer,
               "weight": torch.where(answer, 1.0, self.prompt_weight) * valid}
        if data.features is not None:
            out["features"] = data.features[index].float()
        if data.aux is not None:
            out["aux"] = data.aux[index].float()
        return out


def soft_cross_entropy(logits: torch.Tensor, topk_ids: torch.Tensor, topk_probs: torch.Tensor,
                       to_draft: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """−Σ p log q over the target's top-K ids that lie in the draft vocabulary, mean over valid positions."""
    index = to_draft[topk_ids]  # (..., K), -1 outside S
    logq = logits.float().log_softmax(dim=-1).gather(-1, index.clamp(min=0))
    per_position = -(topk_probs * (index >= 0) * logq).sum(dim=-1)
    return (per_position * valid).sum() / valid.sum().clamp(min=1)


def agreement(logits: torch.Tensor, topk_ids: torch.Tensor, topk_probs: torch.Tensor, to_draft: torch.Tensor,
              vocab: torch.Tensor, valid: torch.Tensor) -> tuple[float, float]:
    """(α at T=0: draft argmax == target argmax, α at T=1: Σ min(p, q) over the target's top-K)."""
    greedy = (vocab[logits.argmax(dim=-1)] == topk_ids[..., 0]).float()
    q = logits.float().softmax(dim=-1)
    index = to_draft[topk_ids]
    q_at = q.gather(-1, index.clamp(min=0)) * (index >= 0)
    beta = torch.minimum(topk_probs, q_at).sum(dim=-1)
    n = valid.sum().clamp(min=1)
    return float((greedy * valid).sum() / n), float((beta * valid).sum() / n)


class Objective:
    """The loss and the held-out measurements of one kind."""

    def __init__(self, net: DraftNet, feature_rms: float, unroll: int, feature_loss: float = 1.0):
        self.net, self.kind, self.feature_rms, self.unroll = net, net.config.kind, feature_rms, max(1, unroll)
        self.feature_loss = feature_loss
        width = int(max(net.vocab.max() + 1, net.embed.shape[0]))
        self.to_draft = torch.full((width,), -1, dtype=torch.long)
        self.to_draft[net.vocab] = torch.arange(net.vocab.numel())

    def _outputs(self, b: dict) -> list[tuple[torch.Tensor, slice, torch.Tensor | None]]:
        """(logits, the positions they predict, eagle's predicted features or None) per output."""
        net = self.net
        if self.kind == "draft-lm":
            return [(net.lm(b["tokens"]), slice(0, None), None)]
        if self.kind == "eagle3":  # step s, row t drafts x_{t+s+2}: the target's distribution at t+s+1
            return [(logits, slice(s + 1, None), None) for s, logits in enumerate(net.eagle3_unrolled(
                b["aux"], b["tokens"], self.unroll))]
        if self.kind == "medusa":
            heads = net.medusa_features(b["features"])  # (K, B, W, d)
            return [(net.logits(heads[k][:, : -(k + 1)]), slice(k + 1, None), None)
                    for k in range(heads.shape[0])]
        outputs, features = [], b["features"]
        for k in range(1, self.unroll + 1):  # step k ≈ f_{t+k}, fed its own step k-1 predictions from k = 2 on
            features = net.eagle(features[:, :-1], b["tokens"][:, k:])
            outputs.append((net.logits(features), slice(k, None), features))
        return outputs

    def loss(self, b: dict) -> torch.Tensor:
        total = 0.0
        for i, (logits, at, predicted) in enumerate(self._outputs(b)):
            valid = b["weight"][:, at]
            ce = soft_cross_entropy(logits, b["topk_ids"][:, at], b["topk_probs"][:, at], self.to_draft, valid)
            if self.kind in ("medusa", "eagle3"):
                total = total + 0.8**i * ce
            elif predicted is not None:
                total = total + 0.5 * ce
                if self.feature_loss:
                    reg = F.smooth_l1_loss(predicted / self.feature_rms, b["features"][:, at] / self.feature_rms,
                                           reduction="none").mean(dim=-1)
                    total = total + self.feature_loss * (reg * valid).sum() / valid.sum().clamp(min=1)
            else:
                total = total + ce
        return total

    @torch.no_grad()
    def measure(self, b: dict) -> tuple[float, float]:
        """Agreement at the first draft position, on answer positions."""
        return self.measure_steps(b)[0][1:]

    @torch.no_grad()
    def measure_steps(self, b: dict) -> list[tuple[int, float, float]]:
        """(answer positions, α at T=0, Σmin(p,q) at T=1) at each draft position the kind trains
        (the first alone for draft-lm): position k drafts on the target's tokens before it and,
        for eagle and eagle3, the drafter's own outputs of positions 1..k-1 (training-time test)."""
        out = []
        for logits, at, _ in self._outputs(b):
            answers = b["answer"][:, at].float()
            out.append((int(answers.sum()), *agreement(logits, b["topk_ids"][:, at], b["topk_probs"][:, at],
                                                       self.to_draft, self.net.vocab, answers)))
        return out


def held_out_agreement(objective: Objective, windows: Windows, count: int = 256, batch: int = 16) -> dict:
    """Agreement per draft position on the answers of up to `count` of `windows`' sequences (the
    window that ends each one), weighted by answer positions: {"sequences", "positions",
    "alpha_t0": [per position], "alpha_t1": [...]}."""
    n = len(windows.sequences)
    picks = torch.linspace(0, n - 1, min(n, count)).round().long().unique().tolist()
    totals: list[list[float]] = []
    objective.net.eval()
    for lo in range(0, len(picks), batch):
        for k, (positions, a0, a1) in enumerate(objective.measure_steps(windows.batch(0, fixed=picks[lo : lo + batch]))):
            if len(totals) <= k:
                totals.append([0, 0.0, 0.0])
            totals[k][0] += positions
            totals[k][1] += a0 * positions
            totals[k][2] += a1 * positions
    return {"sequences": len(picks), "positions": int(totals[0][0]) if totals else 0,
            "alpha_t0": [round(t[1] / max(t[0], 1), 4) for t in totals],
            "alpha_t1": [round(t[2] / max(t[0], 1), 4) for t in totals]}


def init_from_target(net: DraftNet, model) -> bool:
    """Start a draft-lm's layers from the target's first layers (Llama layouts whose sizes match):
    a far better start than random weights. Returns whether it did."""
    config = model.config
    if config.model_type != "llama" or net.config.kind != "draft-lm" or net.config.ffn != config.intermediate_size:
        return False
    if net.config.heads * net.config.head_dim != config.hidden_size:
        return False
    groups = config.num_attention_heads // config.num_key_value_heads
    with torch.no_grad():
        for block, layer in zip(net.blocks, model.model.layers):
            attn, mlp = layer.self_attn, layer.mlp

            def expand(w):  # (Hkv*hd, d) -> (Hq*hd, d): each key/value head repeated for its query group
                hd = net.config.head_dim
                return w.float().view(-1, hd, w.shape[-1]).repeat_interleave(groups, dim=0).reshape(-1, w.shape[-1])

            block.qkv.weight.copy_(torch.cat([attn.q_proj.weight.float(), expand(attn.k_proj.weight),
                                              expand(attn.v_proj.weight)]))
            block.o.weight.copy_(attn.o_proj.weight.float())
            block.attn_norm.weight.copy_(layer.input_layernorm.weight.float())
            block.mlp_norm.weight.copy_(layer.post_attention_layernorm.weight.float())
            block.gate_up.weight.copy_(torch.cat([mlp.gate_proj.weight.float(), mlp.up_proj.weight.float()]))
            block.down.weight.copy_(mlp.down_proj.weight.float())
        net.norm.weight.copy_(model.model.norm.weight.float())
    return True


def aux_layers_for(recipe: TrainRecipe, target) -> tuple[int, ...]:
    """The target layers an eagle3 drafter reads: the recipe's, or 2, N/2, N-3."""
    layers = target.model.config.get_text_config().num_hidden_layers
    chosen = tuple(recipe.aux_layers) if recipe.aux_layers else tuple(default_aux_layers(layers))
    if not chosen or any(not 0 <= i < layers for i in chosen) or len(set(chosen)) != len(chosen):
        raise SpecdecError(f"--aux-layers {','.join(map(str, chosen))}: give distinct layers in 0..{layers - 1} "
                           f"(the target has {layers}; 0 is the embeddings)")
    return chosen


def make_config(recipe: TrainRecipe, target) -> DraftConfig:
    text = target.model.config.get_text_config()
    d = text.hidden_size
    gemma = text.model_type.startswith("gemma")
    eagle3 = recipe.kind == "eagle3"
    return DraftConfig(kind=recipe.kind, d_model=d, layers=recipe.layers, ffn=recipe.ffn,
                       medusa_heads=recipe.medusa_heads, head_dim=head_dim_for(d),
                       rope_theta=float(getattr(text, "rope_theta", None) or 10000.0),
                       embed_scale=d**0.5 if gemma and not eagle3 else 1.0,  # eagle3 normalises it (as vLLM)
                       softcap=None if eagle3 else getattr(text, "final_logit_softcapping", None),
                       aux_layers=list(aux_layers_for(recipe, target)) if eagle3 else [],
                       max_positions=int(getattr(text, "max_position_embeddings", None) or 8192),
                       target=target_identity(target))


def held_out_sequences(prompts: list) -> list[int]:
    """The sequences training holds out to measure on, given each sequence's prompt (anything that
    compares equal for the same prompt): those of every 20th distinct prompt from the 10th, in order
    of first appearance across concatenated data sets (every 20th sequence when no prompt repeats),
    or the last sequence of a very small set. A prompt answered several times is held out whole, so
    the measure is on questions training never saw."""
    number: dict = {}
    for prompt in prompts:
        number.setdefault(prompt, len(number))
    held = [s for s, prompt in enumerate(prompts) if number[prompt] % 20 == 10]
    return held or [len(prompts) - 1]


def sequence_prompts(data: DistillData) -> list[tuple[int, ...]]:
    """Each sequence's prompt token ids."""
    starts = data.offsets[:-1].tolist()
    return [tuple(data.tokens[a : a + n].tolist()) for a, n in zip(starts, data.prompt_lengths.tolist())]


def _device(net: DraftNet) -> torch.device:
    return net.vocab.device


class StopRequest:
    """Ctrl-C or SIGTERM (what systemd, Docker and batch schedulers send) during training asks the loop to stop
    after the step in progress, so that the steps done so far are measured and saved rather than lost; a
    second one raises KeyboardInterrupt at once. Only in the main thread (where Python runs signal handlers);
    elsewhere the signals are left alone."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self, announce=lambda: None):
        self.requested = False
        self._announce = announce
        self._previous: dict = {}

    def __enter__(self) -> StopRequest:
        if threading.current_thread() is threading.main_thread():
            self._previous = {s: signal.signal(s, self._on_interrupt) for s in self.SIGNALS}
        return self

    def __exit__(self, *exc) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        self._previous = {}

    def _on_interrupt(self, signum, frame) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        self._announce()


def train(target, data: DistillData, recipe: TrainRecipe, log=print, progress: bool = True,
          start: DraftNet | None = None, sets: dict[str, Collection[int]] | None = None,
          optimizer_state: dict | None = None, keep_optimizer=None, stop: StopRequest | None = None,
          held_out: list[int] | None = None) -> DraftNet:
    """Train a drafter of `recipe.kind` for `target` (a LoadedModel) on `data`; returns it in float32.
    `start`: a saved drafter of the same kind and sizes to continue from (`drafters.trained.read_net`;
    its draft vocabulary is kept), `optimizer_state` its AdamW moments (read_optimizer_state; the
    warm-up is then skipped). `sets`: named collections of sequences (indices into the data): the
    held-out agreement per draft position is measured on each at the end (recipe["held_out"]).
    `keep_optimizer(state_dict)` receives the optimiser's state at the end; `stop`: a StopRequest the
    caller already holds (default: one for the loop); `held_out`: the sequences to hold out (default:
    held_out_sequences of the data's prompts)."""
    from tqdm import tqdm

    torch.manual_seed(recipe.seed)
    model = target.model
    if start is not None:
        net = start.float()
    else:
        net = build_net(make_config(recipe, target), draft_vocabulary(data, recipe.vocab_size, target.eos_token_ids),
                        model).float()
    vocab = net.vocab
    if net.config.kind == "eagle3" and data.aux is None:
        raise SpecdecError("eagle3 trains on the target's hidden states at its aux layers, and this data has none: "
                           "build it with DataRecipe(aux_layers=...) (train-drafter does for --kind eagle3)")
    if net.config.kind == "eagle3" and data.aux.shape[1] != net.fc.in_features:
        raise SpecdecError(f"the data's aux features are {data.aux.shape[1]} wide, the drafter reads "
                           f"{net.fc.in_features}: build the data with its aux layers {net.config.aux_layers}")
    initialised = start is None and init_from_target(net, model)
    trainable = [p for p in net.parameters() if p.requires_grad]
    size = sum(p.numel() for p in trainable)
    covered = mass_covered(data, vocab)
    log(f"{recipe.kind}: {size / 1e6:.2f} M trained parameters, draft vocabulary {vocab.numel()} ids "
        f"({covered:.1%} of the target's probability mass){', layers from the target' if initialised else ''}"
        f"{', continuing from a saved drafter' if start is not None else ''}")

    held_out = held_out or held_out_sequences(sequence_prompts(data))
    taken = set(held_out)
    train_windows = Windows(data, [s for s in range(data.sequences) if s not in taken], recipe.window, recipe.seed,
                            recipe.prompt_weight)
    eval_windows = Windows(data, held_out, recipe.window, recipe.seed + 1, recipe.prompt_weight)
    picks = torch.linspace(0, len(held_out) - 1, min(len(held_out), 64)).round().long().unique().tolist()
    eval_batch = eval_windows.batch(0, fixed=picks)
    if data.features is None and net.config.kind != "eagle3":
        raise SpecdecError(f"{net.config.kind} learns from the target's final-norm features, and the data was read "
                           "without them: read it with DistillData.load(..., features=True)")
    feature_rms = float(data.features[: 100_000].float().pow(2).mean().sqrt()) if data.features is not None else 1.0
    objective = Objective(net, feature_rms, recipe.unroll, recipe.feature_loss)
    if recipe.bf16 is None:
        recipe = replace(recipe, bf16=_device(net).type == "cpu" and auto_dtype(_device(net)) == torch.bfloat16)
    autocast = torch.autocast(_device(net).type, dtype=torch.bfloat16, enabled=recipe.bf16)
    optimizer = torch.optim.AdamW(trainable, lr=recipe.lr, betas=(0.9, 0.95), weight_decay=0.0)
    warmup = recipe.warmup
    if optimizer_state is not None:  # the moments saved; the rates and betas this run's
        optimizer.load_state_dict({"state": optimizer_state, "param_groups": optimizer.state_dict()["param_groups"]})
        warmup = 1  # the moments are estimated already

    start = time.perf_counter()
    budget = recipe.steps if recipe.steps else recipe.minutes * 60.0

    def done_fraction(step: int) -> float:
        return step / recipe.steps if recipe.steps else (time.perf_counter() - start) / budget

    history: list[dict] = []
    alpha0, alpha1 = objective.measure(eval_batch)
    history.append({"step": 0, "alpha_t0": alpha0, "alpha_t1": alpha1})
    bar = tqdm(total=recipe.steps or int(budget), unit="step" if recipe.steps else "s", desc=f"training {recipe.kind}",
               file=sys.stderr, disable=not progress)
    step, smooth, shown = 0, None, 0
    first_loss = None
    net.train()
    own_stop = stop is None
    stop = stop or StopRequest(lambda: log(f"{recipe.kind}: interrupted: stopping after the step in progress, then "
                                           "measuring and keeping the drafter trained so far (Ctrl-C again to abandon it)"))
    with stop if own_stop else contextlib.nullcontext():
        while done_fraction(step) < 1.0 and not stop.requested:
            fraction = done_fraction(step)
            scale = min(1.0, (step + 1) / warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, fraction))))
            for group in optimizer.param_groups:
                group["lr"] = recipe.lr * scale
            with autocast:
                loss = objective.loss(train_windows.batch(recipe.batch))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(trainable, 1.0)
            optimizer.step()
            step += 1
            value = float(loss.detach())
            first_loss = value if first_loss is None else first_loss
            smooth = value if smooth is None else 0.95 * smooth + 0.05 * value
            if step % recipe.eval_every == 0:
                net.eval()
                alpha0, alpha1 = objective.measure(eval_batch)
                net.train()
                history.append({"step": step, "loss": smooth, "alpha_t0": alpha0, "alpha_t1": alpha1})
            bar.set_postfix(loss=f"{smooth:.3f}", a_T0=f"{alpha0:.2f}", a_T1=f"{alpha1:.2f}")
            now = step if recipe.steps else int(time.perf_counter() - start)
            bar.update(now - shown)
            shown = now
    bar.close()
    if step == 0:  # nothing to keep
        if stop.requested:
            raise KeyboardInterrupt
        raise SpecdecError(f"the time budget ({recipe.minutes} minutes) ran out before one training step: give more "
                           "--minutes, or --steps")
    net.eval()
    alpha0, alpha1 = objective.measure(eval_batch)
    history.append({"step": step, "loss": smooth, "alpha_t0": alpha0, "alpha_t1": alpha1})
    seconds = round(time.perf_counter() - start, 1)
    by_set = {}
    for name, members in (sets or {"all": range(data.sequences)}).items():
        inside = [h for h in held_out if h in members]
        if inside:
            by_set[name] = held_out_agreement(objective, Windows(data, inside, recipe.window, recipe.seed + 1,
                                                                 recipe.prompt_weight))
            log(f"{recipe.kind}: held-out {name} ({by_set[name]['sequences']} sequences, {by_set[name]['positions']} "
                f"answer positions): α (T=0) by draft position {by_set[name]['alpha_t0']}, Σmin(p,q) (T=1) "
                f"{by_set[name]['alpha_t1']}")
    if keep_optimizer is not None:
        keep_optimizer(optimizer.state_dict())
    net.config.recipe = {**asdict(recipe), "trained_parameters": size, "vocab_mass_covered": covered,
                         "steps_done": step, "seconds": seconds, "interrupted": stop.requested,
                         "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                         "first_loss": first_loss, "final_loss": smooth, "initialised_from_target": initialised,
                         "history": history, "held_out": by_set}
    log(f"{recipe.kind}: {step} steps{' (interrupted)' if stop.requested else ''} in {seconds:.0f} s, "
        f"loss {first_loss:.3f} -> {smooth:.3f}, "
        f"held-out α (T=0) {alpha0:.3f}, Σmin(p,q) (T=1) {alpha1:.3f}")
    return net


OPTIMIZER_FILES = ("optimizer-exp_avg.safetensors", "optimizer-exp_avg_sq.safetensors")
"""AdamW's two moments beside a saved drafter (bfloat16, one tensor a trained parameter, in order):
what `train-drafter --resume` continues with. Two files of the drafter's size each, so that none
is over ~10 MB for the shipped heads."""


def save_optimizer_state(state: dict, directory) -> None:
    """Write AdamW's moments (an optimizer.state_dict()) beside the drafter in `directory`."""
    from pathlib import Path

    from safetensors.torch import save_file

    directory = Path(directory)
    for moment, name in zip(("exp_avg", "exp_avg_sq"), OPTIMIZER_FILES):
        tensors = {str(i): s[moment].to(torch.bfloat16).contiguous() for i, s in state["state"].items()}
        steps = {str(i): str(int(s["step"])) for i, s in state["state"].items()}
        save_file(tensors, str(directory / name), metadata=steps)


def read_optimizer_state(directory, net: DraftNet) -> dict[int, dict] | None:
    """The AdamW moments saved beside the drafter in `directory` for `net`'s trained parameters, by their
    index (an optimizer state_dict's "state"), or None where there are none or they do not fit (shapes
    differ: the drafter was resized)."""
    from pathlib import Path

    from safetensors import safe_open

    directory = Path(directory)
    if not all((directory / name).is_file() for name in OPTIMIZER_FILES):
        return None
    trainable = [p for p in net.parameters() if p.requires_grad]
    state = {}
    with safe_open(str(directory / OPTIMIZER_FILES[0]), "pt") as m, safe_open(str(directory / OPTIMIZER_FILES[1]), "pt") as v:
        steps = m.metadata() or {}
        if sorted(m.keys(), key=int) != [str(i) for i in range(len(trainable))]:
            return None
        for i, p in enumerate(trainable):
            exp_avg, exp_avg_sq = m.get_tensor(str(i)).float(), v.get_tensor(str(i)).float()
            if exp_avg.shape != p.shape or exp_avg_sq.shape != p.shape:
                return None
            state[i] = {"step": torch.tensor(float(steps.get(str(i), 0))), "exp_avg": exp_avg, "exp_avg_sq": exp_avg_sq}
    return state
