"""Self-distillation data: the target's own answers to prompts built from text on the machine, with
the target's teacher signal at every position.

Prompts (several thousand, seeded): open questions about commands and messages, translation of
gettext messages, summaries of man pages, and code edits of standard-library functions. The target
answers them in batches, half greedily and half at temperature 1 (the two ways drafters serve).
One teacher-forced pass over each prompt + answer then records, per position t:

- `features` f_t: the target's final-norm hidden state (eagle and medusa learn from it);
- `topk_ids`, `topk_probs`: the target's K most likely next tokens and their probabilities at
  temperature 1 (every kind's distillation target: KL to the target's distribution).

The result is cached under ~/.cache/specdec/distill/, keyed by the target and the recipe, so every
kind and size trains on the same data without sampling the target again.
"""

from __future__ import annotations

import hashlib
import json
import random
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from .. import corpus
from ..bench.prompts import CHAT_QUESTIONS
from ..models import cache_dir, target_identity


@dataclass
class DataRecipe:
    prompts: int = 2000
    max_new_tokens: int = 64
    max_prompt_tokens: int = 320
    temperatures: tuple = (0.0, 1.0)
    topk: int = 32
    batch: int = 32
    seed: int = 0

    def key(self, identity: dict, dtype: torch.dtype) -> str:
        text = json.dumps({"target": identity, "dtype": str(dtype), "recipe": asdict(self)}, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:12]


def training_prompts(count: int, seed: int = 0) -> list[tuple[str, str]]:
    """(task, prompt) pairs, a quarter each of chat, translate, summarise and code, seeded."""
    rng = random.Random(f"train:{seed}")
    per_task = -(-count // 4)
    messages = corpus.gettext_messages(min_chars=40, max_chars=300)
    rng.shuffle(messages)
    pages = corpus.man_pages(per_task, seed=rng.randrange(2**31), min_chars=800)
    functions = corpus.stdlib_functions(min_lines=5, max_lines=25)
    rng.shuffle(functions)

    chat = list(CHAT_QUESTIONS)
    questions = ["What is the {} command used for? Give an example.", "Explain in simple words what {} does.",
                 "When would I use {} instead of a similar tool?", "What are common options of {}?"]
    for name, _ in pages:
        chat.append(rng.choice(questions).format(name.rsplit(".", 1)[0]))
    asks = ["What does this message mean, and what should I do about it?\n\n{}",
            "Explain this program message to a beginner:\n\n{}"]
    chat += [rng.choice(asks).format(m.english) for m in messages[per_task : 3 * per_task]]
    rng.shuffle(chat)

    translate = [f"Translate this message from English to German:\n\n{m.english}" for m in messages[:per_task]]
    summarise = [rng.choice(["Summarise this man page in a few sentences:", "What is this man page about?"])
                 + f"\n\n{text[: rng.randrange(600, 1500)]}" for _, text in pages]
    edits = ["Rewrite this Python function with type hints, keeping its behaviour the same:",
             "Explain what this Python function does:", "Add a docstring to this Python function:",
             "Suggest how to make this Python function clearer:"]
    code = [f"{rng.choice(edits)}\n\n```python\n{source}\n```" for _, source in functions[:per_task]]
    out = []
    for task, items in (("chat", chat), ("translate", translate), ("summarise", summarise), ("code", code)):
        out += [(task, text) for text in items[:per_task]]
    rng.shuffle(out)
    return out[:count]


@dataclass
class DistillData:
    tokens: torch.Tensor  # (N,) int64, all sequences concatenated
    offsets: torch.Tensor  # (S + 1,) sequence boundaries
    prompt_lengths: torch.Tensor  # (S,)
    features: torch.Tensor  # (N, d) bfloat16
    topk_ids: torch.Tensor  # (N, K) int64
    topk_probs: torch.Tensor  # (N, K) float32
    token_counts: torch.Tensor  # (V,) how often each id occurs in the answers

    def save(self, path: Path) -> None:
        from safetensors.torch import save_file

        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        save_file({"tokens": self.tokens.int(), "offsets": self.offsets.long(), "prompt_lengths": self.prompt_lengths.int(),
                   "features": self.features, "topk_ids": self.topk_ids.int(), "topk_probs": self.topk_probs.half(),
                   "token_counts": self.token_counts.long()}, str(tmp))
        tmp.replace(path)

    @staticmethod
    def load(path: Path) -> "DistillData":
        from safetensors.torch import load_file

        t = load_file(str(path))
        return DistillData(t["tokens"].long(), t["offsets"], t["prompt_lengths"].long(), t["features"],
                           t["topk_ids"].long(), t["topk_probs"].float(), t["token_counts"])

    @property
    def sequences(self) -> int:
        return self.offsets.numel() - 1


def _answers(model, tokenizer, prompts: list[list[int]], temperature: float, recipe: DataRecipe, eos: set[int],
             progress) -> list[list[int]]:
    """The target's answers to token-id prompts, batched with left padding (transformers' generate)."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(eos)
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))  # similar lengths share a batch
    answers: list[list[int]] = [[] for _ in prompts]
    for lo in range(0, len(order), recipe.batch):
        index = order[lo : lo + recipe.batch]
        width = max(len(prompts[i]) for i in index)
        ids = torch.tensor([[pad] * (width - len(prompts[i])) + prompts[i] for i in index])
        mask = torch.tensor([[0] * (width - len(prompts[i])) + [1] * len(prompts[i]) for i in index])
        sampling = dict(do_sample=True, temperature=temperature, top_k=0, top_p=1.0) if temperature > 0 else dict(do_sample=False)
        with torch.inference_mode():
            out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=recipe.max_new_tokens,
                                 pad_token_id=pad, eos_token_id=sorted(eos), **sampling)
        for row, i in zip(out[:, width:].tolist(), index):
            stop = next((j for j, t in enumerate(row) if t in eos), None)
            answers[i] = row[: stop + 1] if stop is not None else row
        progress(len(index))
    return answers


def _teacher(model, sequences: list[list[int]], topk: int, batch: int, progress):
    """One teacher-forced pass: final-norm features and top-k next-token probabilities per position."""
    features, ids_out, probs_out = [], [], []
    order = sorted(range(len(sequences)), key=lambda i: len(sequences[i]))
    results: dict[int, tuple] = {}
    for lo in range(0, len(order), batch):
        index = order[lo : lo + batch]
        width = max(len(sequences[i]) for i in index)
        ids = torch.tensor([sequences[i] + [0] * (width - len(sequences[i])) for i in index])
        mask = torch.tensor([[1] * len(sequences[i]) + [0] * (width - len(sequences[i])) for i in index])
        with torch.inference_mode():
            out = model(input_ids=ids, attention_mask=mask, output_hidden_states=True, use_cache=False)
            logits = out.logits.float()
            top = logits.topk(min(topk, logits.shape[-1]), dim=-1)  # softmax keeps the order: top-k of the logits
            top_probs = (top.values - logits.logsumexp(dim=-1, keepdim=True)).exp()
        for row, i in enumerate(index):
            n = len(sequences[i])
            results[i] = (out.hidden_states[-1][row, :n].to(torch.bfloat16), top.indices[row, :n], top_probs[row, :n])
        progress(len(index))
    for i in range(len(sequences)):
        f, k, p = results[i]
        features.append(f)
        ids_out.append(k)
        probs_out.append(p)
    return torch.cat(features), torch.cat(ids_out), torch.cat(probs_out)


def build_data(target, recipe: DataRecipe, log=print) -> DistillData:
    """Sample the target (a LoadedModel) and record its teacher signal; cached by target and recipe."""
    from tqdm import tqdm

    identity = target_identity(target)
    path = cache_dir() / "distill" / f"{identity['name'].replace('/', '_')}-{recipe.key(identity, target.dtype)}.safetensors"
    if path.is_file():
        log(f"distillation data: {path} (cached)")
        return DistillData.load(path)
    model, tokenizer, eos = target.model, target.tokenizer, target.eos_token_ids
    pairs = training_prompts(recipe.prompts, recipe.seed)
    prompts = [target.encode(text)[-recipe.max_prompt_tokens :] for _, text in pairs]
    torch.manual_seed(recipe.seed)
    answers: list[list[int]] = []
    shares = [prompts[i :: len(recipe.temperatures)] for i in range(len(recipe.temperatures))]
    with tqdm(total=len(prompts), desc="sampling the target", unit="prompt", file=sys.stderr) as bar:
        for temperature, share in zip(recipe.temperatures, shares):
            answers += _answers(model, tokenizer, share, temperature, recipe, eos, bar.update)
    ordered = [p for share in shares for p in share]
    sequences = [p + a for p, a in zip(ordered, answers)]
    with tqdm(total=len(sequences), desc="teacher pass", unit="seq", file=sys.stderr) as bar:
        features, topk_ids, topk_probs = _teacher(model, sequences, recipe.topk, max(1, recipe.batch // 4), bar.update)
    width = model.get_output_embeddings().weight.shape[0]
    counts = torch.zeros(width, dtype=torch.long)
    for a in answers:
        counts += torch.bincount(torch.tensor(a, dtype=torch.long), minlength=width)[:width] if a else 0
    lengths = torch.tensor([len(s) for s in sequences])
    data = DistillData(tokens=torch.tensor([t for s in sequences for t in s]),
                       offsets=torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)]),
                       prompt_lengths=torch.tensor([len(p) for p in ordered]), features=features,
                       topk_ids=topk_ids, topk_probs=topk_probs, token_counts=counts)
    data.save(path)
    log(f"distillation data: {data.sequences} sequences, {data.tokens.numel()} positions "
        f"({sum(map(len, answers))} answer tokens) -> {path}")
    return data
