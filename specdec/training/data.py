"""Self-distillation data: the target's own answers to prompts built from text on the machine, with
the target's teacher signal at every position.

Prompts (seeded), by the recipe's `mix`: "tasks" — open questions about commands and messages,
translation of gettext messages, summaries of man pages, and code edits of standard-library
functions, a quarter each; "chat" — everyday questions (`training.topics`), answered at length. The target
answers them in batches, half greedily and half at temperature 1 (the two ways drafters serve).
With the "transformers" sampler one teacher-forced pass over each prompt + answer then records, per
position t (the "engine" sampler, `training.fused`, records the same in the passes that sample, on
the backend specdec generates with):

- `features` f_t: the target's final-norm hidden state (eagle and medusa learn from it);
- `aux` (recipes with `aux_layers`, for eagle3): the hidden states entering those layers (the
  residual stream; 0 = the embeddings), concatenated;
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
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from ..models import target_identity
from ..paths import cache_dir
from ..tasks import corpus
from ..tasks.prompts import CHAT_QUESTIONS
from .topics import open_questions

SAMPLERS = ("engine", "transformers")
CHUNK_SEQUENCES = 2048
"""A recipe of more sequences is sampled and cached in chunks of this many: a chunk's records are
the most held in memory while sampling, and an interrupted run resumes at the chunk it was in."""


@dataclass
class DataRecipe:
    prompts: int = 2000
    max_new_tokens: int = 64
    max_prompt_tokens: int = 320
    temperatures: tuple = (0.0, 1.0)
    topk: int = 32
    batch: int = 32
    seed: int = 0
    mix: str = "tasks"
    aux_layers: tuple = ()
    """Also record the hidden states entering these layers (eagle3's features), e.g. (2, 15, 27)."""
    sampler: str = "transformers"
    """"transformers": sample with transformers' model, then a teacher-forced pass; "engine": sample
    and record in the same passes on the backend specdec generates with (training.fused)."""
    samples: int = 1
    """Answers per prompt: the first at the temperatures' rotation, the others at the last (highest)
    temperature, i.e. further draws from p for the same question (more data from a bounded set of
    prompts; training holds out by prompt, so no held-out question is also trained on)."""

    def key(self, identity: dict, dtype: torch.dtype, path: str = "transformers") -> str:
        """The cache key; `path`: the numeric path the engine sampler ran on (its numbers are that path's)."""
        recipe = asdict(self)
        if recipe["mix"] == "tasks":  # the recipe before `mix` existed: its cached data keeps its name
            del recipe["mix"]
        if not recipe["aux_layers"]:  # nor does data without aux features
            del recipe["aux_layers"]
        else:
            recipe["aux_layers"] = list(recipe["aux_layers"])
        if recipe["samples"] == 1:  # nor data of one answer a prompt
            del recipe["samples"]
        if recipe["sampler"] == "transformers":  # nor data from the sampler that came first
            del recipe["sampler"]
        else:
            recipe["path"] = path
            if dtype == torch.bfloat16:  # before this, a bf16 target's records of answers were other answers' (fused)
                recipe["records"] = 2
        text = json.dumps({"target": identity, "dtype": str(dtype), "recipe": recipe}, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:12]

    def prompts_text(self) -> list[tuple[str, str]]:
        if self.mix == "tasks":
            return training_prompts(self.prompts, self.seed)
        if self.mix == "chat":
            return [("chat", q) for q in open_questions(self.prompts, self.seed, exclude=set(CHAT_QUESTIONS))]
        raise ValueError(f"unknown data mix {self.mix!r}: use tasks or chat")


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
    features: torch.Tensor | None  # (N, d) bfloat16 (None: read without them, DistillData.load)
    topk_ids: torch.Tensor  # (N, K) int64
    topk_probs: torch.Tensor  # (N, K) float32
    token_counts: torch.Tensor  # (V,) how often each id occurs in the answers
    aux: torch.Tensor | None = None  # (N, k*d) bfloat16: the hidden states entering the recipe's aux_layers

    def save(self, path: Path) -> None:
        from safetensors.torch import save_file

        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tensors = {"tokens": self.tokens.int(), "offsets": self.offsets.long(), "prompt_lengths": self.prompt_lengths.int(),
                   "features": self.features, "topk_ids": self.topk_ids.int(), "topk_probs": self.topk_probs.half(),
                   "token_counts": self.token_counts.long()}
        if self.aux is not None:
            tensors["aux"] = self.aux
        save_file(tensors, str(tmp))
        tmp.replace(path)

    @staticmethod
    def load(path: Path | list[Path], features: bool = True, aux: bool = True) -> DistillData:
        """The data saved at `path`, or the sequences of several files in order, read one tensor at a
        time into tensors of the whole (a few GB of features are never held twice); `features`:
        False leaves the final-norm features out (None), `aux` False the aux layers' hidden states."""
        from contextlib import ExitStack

        from safetensors import safe_open

        paths = [path] if isinstance(path, (str, Path)) else list(path)
        with ExitStack() as stack:
            files = [stack.enter_context(safe_open(str(p), framework="pt")) for p in paths]
            return DistillData._read(files, features, aux)

    @staticmethod
    def _read(files: list, features: bool, aux: bool = True) -> DistillData:
        kinds = {"tokens": torch.long, "prompt_lengths": torch.long, "features": None, "topk_ids": torch.long,
                 "topk_probs": torch.float32, "aux": None}
        has_aux = aux and all("aux" in f.keys() for f in files)
        whole = {}
        for name, dtype in kinds.items():
            if name == "aux" and not has_aux or name == "features" and not features:
                continue
            shapes = [f.get_slice(name).get_shape() for f in files]
            out = torch.empty([sum(s[0] for s in shapes), *shapes[0][1:]],
                              dtype=dtype or files[0].get_slice(name)[:0].dtype)  # None: as stored
            at = 0
            for f, shape in zip(files, shapes):
                out[at : at + shape[0]] = f.get_tensor(name)
                at += shape[0]
            whole[name] = out
        offsets = [files[0].get_tensor("offsets")]
        for f in files[1:]:
            offsets.append(f.get_tensor("offsets")[1:] + offsets[-1][-1])
        counts = sum(f.get_tensor("token_counts") for f in files)
        return DistillData(whole["tokens"], torch.cat(offsets), whole["prompt_lengths"], whole.get("features"),
                           whole["topk_ids"], whole["topk_probs"], counts, whole.get("aux"))

    @staticmethod
    def concat(parts: list[DistillData]) -> DistillData:
        """Several data sets as one (the sequences of each in order)."""
        if len(parts) == 1:
            return parts[0]
        starts = torch.tensor([0] + [int(p.offsets[-1]) for p in parts[:-1]]).cumsum(0)
        offsets = torch.cat([parts[0].offsets[:1]] + [p.offsets[1:] + s for p, s in zip(parts, starts)])
        aux = torch.cat([p.aux for p in parts]) if all(p.aux is not None for p in parts) else None
        features = torch.cat([p.features for p in parts]) if all(p.features is not None for p in parts) else None
        return DistillData(torch.cat([p.tokens for p in parts]), offsets, torch.cat([p.prompt_lengths for p in parts]),
                           features, torch.cat([p.topk_ids for p in parts]),
                           torch.cat([p.topk_probs for p in parts]), sum(p.token_counts for p in parts), aux)

    @staticmethod
    def of(prompts: list[list[int]], answers: list[list[int]], width: int, features: torch.Tensor,
           topk_ids: torch.Tensor, topk_probs: torch.Tensor, aux: torch.Tensor | None) -> DistillData:
        """Data of sequences prompt + answer, in order, with their per-position records; `width`: the
        target's vocabulary (the answers' token counts)."""
        counts = torch.zeros(width, dtype=torch.long)
        for a in answers:
            if a:
                counts += torch.bincount(torch.tensor(a, dtype=torch.long), minlength=width)[:width]
        lengths = torch.tensor([len(p) + len(a) for p, a in zip(prompts, answers)])
        return DistillData(tokens=torch.tensor([t for p, a in zip(prompts, answers) for t in p + a]),
                           offsets=torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)]),
                           prompt_lengths=torch.tensor([len(p) for p in prompts]), features=features,
                           topk_ids=topk_ids, topk_probs=topk_probs, token_counts=counts, aux=aux)

    def sequence_list(self) -> list[list[int]]:
        """Each sequence's token ids (prompt and answer)."""
        return [self.tokens[int(a) : int(b)].tolist() for a, b in zip(self.offsets[:-1], self.offsets[1:])]

    @property
    def sequences(self) -> int:
        return self.offsets.numel() - 1


def _answers(model, tokenizer, prompts: list[list[int]], temperature: float, recipe: DataRecipe, eos: set[int],
             progress) -> list[list[int]]:
    """The target's answers to token-id prompts, batched with left padding.

    A plain decoding loop on the model's KV cache rather than transformers' generate(): rows that have
    finished leave the batch, and there is no per-step processor overhead (1.6× generate()'s tokens/s
    on this project's CPU at batch 64)."""
    from transformers import DynamicCache

    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(eos)
    eos_ids = torch.tensor(sorted(eos))
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))  # similar lengths share a batch
    answers: list[list[int]] = [[] for _ in prompts]
    for lo in range(0, len(order), recipe.batch):
        index = order[lo : lo + recipe.batch]
        width = max(len(prompts[i]) for i in index)
        ids = torch.tensor([[pad] * (width - len(prompts[i])) + prompts[i] for i in index])
        mask = torch.tensor([[0] * (width - len(prompts[i])) + [1] * len(prompts[i]) for i in index])
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        rows = torch.arange(len(index))  # which of `index` each batch row answers
        with torch.inference_mode():
            cache = DynamicCache(config=model.config)
            out = model(input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=cache,
                        use_cache=True, logits_to_keep=1)
            for _ in range(recipe.max_new_tokens):
                logits = out.logits[:, -1].float()
                if temperature > 0:
                    step = torch.multinomial((logits / temperature).softmax(dim=-1), 1)
                else:
                    step = logits.argmax(dim=-1, keepdim=True)
                for row, token in zip(rows.tolist(), step[:, 0].tolist()):
                    answers[index[row]].append(token)
                going = ~torch.isin(step[:, 0], eos_ids)
                if not going.all():
                    if not going.any():
                        break
                    keep = going.nonzero()[:, 0]
                    cache.batch_select_indices(keep)
                    rows, step, mask, positions = rows[keep], step[keep], mask[keep], positions[keep]
                mask = torch.cat([mask, torch.ones_like(step)], dim=1)
                positions = positions[:, -1:] + 1
                out = model(input_ids=step, attention_mask=mask, position_ids=positions, past_key_values=cache,
                            use_cache=True)
        progress(len(index))
    return answers


def _teacher(model, sequences: list[list[int]], topk: int, batch: int, progress, aux_layers: tuple = ()):
    """One teacher-forced pass: final-norm features, top-k next-token probabilities and (with
    aux_layers) the hidden states entering those layers, per position."""
    features, ids_out, probs_out, aux_out = [], [], [], []
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
            aux = (torch.cat([out.hidden_states[layer][row, :n] for layer in aux_layers], dim=-1).to(torch.bfloat16)
                   if aux_layers else None)
            results[i] = (out.hidden_states[-1][row, :n].to(torch.bfloat16), top.indices[row, :n], top_probs[row, :n], aux)
        progress(len(index))
    for i in range(len(sequences)):
        f, k, p, a = results[i]
        features.append(f)
        ids_out.append(k)
        probs_out.append(p)
        aux_out.append(a)
    return (torch.cat(features), torch.cat(ids_out), torch.cat(probs_out),
            torch.cat(aux_out) if aux_layers else None)


def _engine_data(target, backend, recipe: DataRecipe, ordered: list[list[int]], groups: list[int],
                 seed: int) -> DistillData:
    """Data of these prompts, answered at these temperature indices, sampled and recorded in the
    engine's own passes (training.fused)."""
    from tqdm import tqdm

    from .fused import sample_and_record

    layers = tuple(recipe.aux_layers)
    final = target.model.config.get_text_config().num_hidden_layers  # "layer N": the final-norm features
    generator = torch.Generator().manual_seed(seed)
    with tqdm(total=len(ordered), desc=f"sampling and recording ({backend.path})", unit="prompt",
              file=sys.stderr) as bar:
        records = sample_and_record(backend, ordered, [recipe.temperatures[k] for k in groups],
                                    recipe.max_new_tokens, target.eos_token_ids, recipe.topk,
                                    layers + (final,) if layers else (), recipe.batch, generator=generator,
                                    progress=bar.update)
    d = target.model.config.get_text_config().hidden_size
    hidden = torch.cat([r.hidden for r in records])
    return DistillData.of(ordered, [r.answer for r in records], target.model.get_output_embeddings().weight.shape[0],
                          hidden[:, -d:].contiguous(), torch.cat([r.topk_ids for r in records]),
                          torch.cat([r.topk_probs for r in records]).float(),
                          hidden[:, :-d].contiguous() if layers else None)


def _ordered_prompts(target, recipe: DataRecipe) -> tuple[list[list[int]], list[int]]:
    """The recipe's prompts as token ids in the data's sequence order (sequence_order), and the index
    of the temperature each is answered at."""
    prompts = [target.encode(text)[-recipe.max_prompt_tokens :] for _, text in recipe.prompts_text()]
    order = sequence_order(len(prompts), len(recipe.temperatures), recipe.samples)
    return [prompts[i] for i, _ in order], [k for _, k in order]


def sequence_order(prompts: int, temperatures: int, samples: int = 1) -> list[tuple[int, int]]:
    """(prompt index, temperature index) of each sequence of a data set, in its order: prompt i is
    answered at temperature i mod `temperatures`, and the prompts of one temperature come together;
    with `samples` > 1, every prompt is then answered samples − 1 more times at the last temperature
    (after the sequences of that temperature, so they still come together)."""
    first = [(i, k) for k in range(temperatures) for i in range(k, prompts, temperatures)]
    return first + [(i, temperatures - 1) for _ in range(samples - 1) for i in range(prompts)]


def build_data(target, recipe: DataRecipe, log=print, backend=None) -> DistillData:
    """Sample the target (a LoadedModel) and record its teacher signal; cached by target, recipe and
    (engine sampler) the backend's numeric path. backend: what the engine sampler runs on (default:
    the target's backend as generation would choose it, backends.lean.target_backend)."""
    return DistillData.load(data_files(target, recipe, log, backend))


def sequence_count(path: Path) -> int:
    """The sequences a data file holds (read from its header)."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        return f.get_slice("offsets").get_shape()[0] - 1


def data_files(target, recipe: DataRecipe, log=print, backend=None) -> list[Path]:
    """The cache files that hold the recipe's data (build_data), sampling what is not cached yet: one
    file, or one a chunk of CHUNK_SEQUENCES sequences in order. Several recipes' files read together
    (DistillData.load) are their data concatenated."""
    from tqdm import tqdm

    if recipe.sampler not in SAMPLERS:
        raise ValueError(f"unknown sampler {recipe.sampler!r}: use {' or '.join(SAMPLERS)}")
    identity = target_identity(target)
    folder, stem = cache_dir() / "distill", identity["name"].replace("/", "_")
    if recipe.sampler == "engine" and backend is None:
        from ..backends.lean import target_backend

        backend = target_backend(target)
    numeric_path = backend.path if recipe.sampler == "engine" else "transformers"
    def path_of(r: DataRecipe) -> Path:
        return folder / f"{stem}-{r.key(identity, target.dtype, numeric_path)}.safetensors"

    def part_path(c: int, count: int, whole: Path) -> Path:
        return whole.with_name(f"{whole.stem}.part{c + 1}of{count}.safetensors")

    def cached(whole: Path) -> list[Path] | None:
        if whole.is_file():
            return [whole]
        found = list(folder.glob(f"{whole.stem}.part*of*.safetensors"))
        if found:
            count = int(found[0].stem.rsplit("of", 1)[1])
            if all(part_path(c, count, whole).is_file() for c in range(count)):
                return [part_path(c, count, whole) for c in range(count)]
        return None

    path = path_of(recipe)
    candidates = [(path, "")]
    if not recipe.aux_layers:  # the same answers sampled for eagle3 hold these too (and aux features, unread)
        from ..drafters.eagle3_format import default_aux_layers

        layers = tuple(default_aux_layers(target.model.config.get_text_config().num_hidden_layers))
        candidates.append((path_of(replace(recipe, aux_layers=layers)), f", with layers {list(layers)}' inputs"))
    for whole, note in candidates:
        files = cached(whole)
        if files:
            log(f"distillation data: {whole.name if len(files) == 1 else whole.stem + '.part*'} (cached{note})")
            return files
    if len(candidates) > 1 and not any(folder.glob(f"{path.stem}.part*of*.safetensors")):
        whole = candidates[1][0]
        if any(folder.glob(f"{whole.stem}.part*of*.safetensors")):  # an eagle3 run's chunks, stopped part way
            log(f"distillation data: continuing {whole.stem}.part*{candidates[1][1]} (its answers serve this recipe)")
            recipe, path = replace(recipe, aux_layers=layers), whole
    plain = folder / f"{stem}-{replace(recipe, aux_layers=()).key(identity, target.dtype)}.safetensors"
    if recipe.sampler == "transformers" and recipe.aux_layers and plain.is_file():
        # the same answers without aux features: one teacher pass adds them
        data = DistillData.load(plain)
        with tqdm(total=data.sequences, desc="teacher pass (aux features)", unit="seq", file=sys.stderr) as bar:
            *_, data.aux = _teacher(target.model, data.sequence_list(), recipe.topk, max(1, recipe.batch // 4),
                                    bar.update, recipe.aux_layers)
        data.save(path)
        log(f"distillation data: {plain} + aux features of layers {list(recipe.aux_layers)} -> {path}")
        return [path]
    start = time.perf_counter()
    ordered, groups = _ordered_prompts(target, recipe)
    chunks = list(range(0, len(ordered), CHUNK_SEQUENCES))
    files = [path] if len(chunks) == 1 else [part_path(c, len(chunks), path) for c in range(len(chunks))]
    sequences = positions = answers = 0
    for c, (lo, file) in enumerate(zip(chunks, files)):
        if file.is_file():
            log(f"distillation data: chunk {c + 1} of {len(chunks)} cached ({file})")
            continue
        if len(chunks) > 1:
            log(f"distillation data: chunk {c + 1} of {len(chunks)}")
        hi, seed = lo + CHUNK_SEQUENCES, recipe.seed + 1_000_003 * c
        if recipe.sampler == "engine":
            data = _engine_data(target, backend, recipe, ordered[lo:hi], groups[lo:hi], seed)
        else:
            data = _transformers_data(target, recipe, ordered[lo:hi], groups[lo:hi], seed)
        data.save(file)
        sequences, positions = sequences + data.sequences, positions + data.tokens.numel()
        answers += int(data.token_counts.sum())
        del data  # a chunk's records are the most held at once
    seconds = time.perf_counter() - start
    log(f"distillation data: {sequences} sequences, {positions} positions, {answers} answer tokens sampled "
        f"in {seconds:.0f} s ({answers / max(seconds, 1e-9) * 3600:,.0f} an hour, on {numeric_path}) -> "
        f"{path if len(files) == 1 else path.stem + '.part*'}")
    return files


def _transformers_data(target, recipe: DataRecipe, ordered: list[list[int]], groups: list[int],
                       seed: int) -> DistillData:
    """Data of these prompts, answered at these temperature indices with transformers' model, then
    one teacher-forced pass."""
    from tqdm import tqdm

    model, tokenizer, eos = target.model, target.tokenizer, target.eos_token_ids
    torch.manual_seed(seed)
    answers: list[list[int]] = []
    with tqdm(total=len(ordered), desc="sampling the target", unit="prompt", file=sys.stderr) as bar:
        for k, temperature in enumerate(recipe.temperatures):  # the sequences of one temperature come together
            share = [p for p, group in zip(ordered, groups) if group == k]
            answers += _answers(model, tokenizer, share, temperature, recipe, eos, bar.update)
    sequences = [p + a for p, a in zip(ordered, answers)]
    with tqdm(total=len(sequences), desc="teacher pass", unit="seq", file=sys.stderr) as bar:
        features, topk_ids, topk_probs, aux = _teacher(model, sequences, recipe.topk, max(1, recipe.batch // 4),
                                                       bar.update, recipe.aux_layers)
    return DistillData.of(ordered, answers, model.get_output_embeddings().weight.shape[0], features, topk_ids,
                          topk_probs, aux)
