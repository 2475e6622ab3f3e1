"""Distillation data that outlives the machine it was sampled on: the target's sequences as small
token-id shards in a folder meant to be committed (e.g. data/distill/smollm2-135m/).

A shard holds what sampling cost: each sequence's prompt and answer as token ids (uint16 where the
vocabulary fits), its task, and the temperature it was answered at. The teacher signal the drafter
learns from (final-norm features, eagle3's layer inputs, top-k probabilities) is 1–2 KB a position,
so it is not stored: one teacher-forced pass rebuilds it from the ids (cached under
~/.cache/specdec/distill/shards/), far cheaper than sampling the answers again.

`manifest.json` says what the folder holds: the target it was sampled from (checked when read), how
it was sampled, and per shard its prompt sources, sequence and token counts and when it was made.
Shards are written whole (a temporary file, then a rename), so a run stopped at any moment leaves
every shard it finished and nothing half-written; new shards take prompts no shard used yet.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import sys
import time
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import SpecdecError
from ..models import target_identity
from ..paths import cache_dir
from ..tasks import corpus
from ..tasks.prompts import CHAT_QUESTIONS
from .data import DataRecipe, DistillData, training_prompts
from .topics import open_questions
from .train import held_out_sequences

MANIFEST = "manifest.json"
SHARD_SEQUENCES = 64
"""Sequences a shard: a stop loses at most the shard in progress (a few minutes of sampling)."""
TEMPERATURES = (0.0, 1.0)
TASKS = ("chat", "translate", "summarise", "code")
FORMAT = 1


@dataclass
class Sequences:
    """The sequences of shards, in order: prompt and answer token ids, task and temperature."""

    prompts: list[list[int]]
    answers: list[list[int]]
    tasks: list[str]
    temperatures: list[float]


def read_manifest(folder: str | Path, identity: dict | None = None) -> dict:
    """The folder's manifest (an empty one where there is none yet); with `identity`, checked to be the
    target's (target_identity): data sampled from another model teaches nothing about this one."""
    path = Path(folder) / MANIFEST
    if not path.is_file():
        return {"format": FORMAT, "target": identity, "shards": []}
    try:
        manifest = json.loads(path.read_text())
        manifest["shards"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise SpecdecError(f"{path} is not a distillation-data manifest ({exc}): give --data-dir a folder "
                           "train-drafter wrote, or an empty one") from None
    if identity is not None and manifest.get("target") not in (None, identity):
        theirs = (manifest.get("target") or {}).get("name", "another model")
        raise SpecdecError(f"{folder} holds data sampled from {theirs}, not from {identity['name']}: give --data-dir "
                           "a folder of this target's data (or an empty one)")
    return manifest


def _write_manifest(folder: Path, manifest: dict) -> None:
    tmp = folder / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=1) + "\n")
    tmp.replace(folder / MANIFEST)


def read_sequences(folder: str | Path, names: list[str] | None = None) -> Sequences:
    """The sequences of the folder's shards (or of the shards `names`), in the manifest's order."""
    folder = Path(folder)
    out = Sequences([], [], [], [])
    for entry in read_manifest(folder)["shards"]:
        if names is not None and entry["name"] not in names:
            continue
        part = _read_shard(folder / entry["name"])
        for field in ("prompts", "answers", "tasks", "temperatures"):
            getattr(out, field).extend(getattr(part, field))
    return out


def _read_shard(path: Path) -> Sequences:
    try:
        with np.load(path) as z:
            tokens, offsets, prompt_lengths = z["tokens"].astype(np.int64), z["offsets"], z["prompt_lengths"]
            tasks, temperatures = z["tasks"], z["temperatures"]
    except (OSError, ValueError, KeyError) as exc:
        raise SpecdecError(f"{path}: not a readable data shard ({exc}); remove it and its manifest entry") from None
    prompts, answers = [], []
    for a, b, n in zip(offsets[:-1], offsets[1:], prompt_lengths):
        prompts.append(tokens[a : a + n].tolist())
        answers.append(tokens[a + n : b].tolist())
    return Sequences(prompts, answers, [TASKS[t] for t in tasks], temperatures.astype(float).tolist())


def write_shard(folder: str | Path, sequences: Sequences, identity: dict, settings: dict, sources: dict) -> str:
    """Add a shard of these sequences to the folder and its manifest; returns its name."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    manifest = read_manifest(folder, identity)
    manifest["target"] = identity
    lengths = [len(p) + len(a) for p, a in zip(sequences.prompts, sequences.answers)]
    flat = [t for p, a in zip(sequences.prompts, sequences.answers) for t in p + a]
    dtype = np.uint16 if identity["vocab_width"] <= 1 << 16 else np.int32
    arrays = {"tokens": np.asarray(flat, dtype=dtype),
              "offsets": np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
              "prompt_lengths": np.asarray([len(p) for p in sequences.prompts], dtype=np.int32),
              "tasks": np.asarray([TASKS.index(t) for t in sequences.tasks], dtype=np.uint8),
              "temperatures": np.asarray(sequences.temperatures, dtype=np.float32)}
    number = 1 + max((int(e["name"].split("-")[1].split(".")[0]) for e in manifest["shards"]), default=0)
    name = f"shard-{number:05d}.npz"
    tmp = folder / (name + ".tmp")
    with open(tmp, "wb") as f:
        np.savez_compressed(f, **arrays)
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(folder / name)
    manifest["shards"].append({
        "name": name, "sequences": len(lengths), "positions": int(sum(lengths)),
        "answer_tokens": int(sum(len(a) for a in sequences.answers)),
        "tasks": {t: sequences.tasks.count(t) for t in TASKS if t in sequences.tasks},
        "sampling": settings, "prompt_sources": sources,
        "sha256": hashlib.sha256((folder / name).read_bytes()).hexdigest()[:16],
        "made": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
    _write_manifest(folder, manifest)
    return name


def _prompt_key(ids: list[int]) -> str:
    return hashlib.sha1(np.asarray(ids, dtype=np.int64).tobytes()).hexdigest()


FOLLOW_UPS = ("Can you give me a concrete example?", "Can you explain that more simply?",
              "Summarise that in one sentence.", "Can you put the main points in a short list?", "Why is that?",
              "What is the most important thing to remember from this?", "Can you make it shorter?",
              "What do people often get wrong about this?", "How would you explain this to a child?",
              "Thanks! What should I try next?")
CONTINUE = ("Please go on.", "Continue, please.", "And then?")
"""Second turns: a follow-up question after an answer that ended by itself, a request to go on after
one that reached the length limit."""
CODE_EDITS = ("Rewrite this Python method with type hints, keeping its behaviour the same:",
              "Explain what this Python method does:", "Add a docstring to this Python method:",
              "Write a unit test for this Python method:", "Find a possible bug in this Python method, or say why "
              "there is none:")


def prompt_pool(seed: int = 0, target=None, done: Sequences | None = None, max_prompt_tokens: int = 320):
    """Every prompt the machine's text gives, as (task, text or chat messages), seeded: everyday chat
    questions (training.topics) alternating with the task mix (chat about commands and messages,
    translation, summaries, code; training.data.training_prompts) while both last, then the rest of
    either; then, alternating, second turns of the chats in `done` (see follow_ups; only with `target`)
    and edits of the standard library's methods (tasks.corpus.stdlib_methods)."""
    chat = [("chat", q) for q in open_questions(1 << 20, seed, exclude=set(CHAT_QUESTIONS))]
    tasks = training_prompts(8000, seed)
    yield from _alternate(chat, tasks)
    rng = random.Random(f"more-prompts:{seed}")
    second = [] if target is None or done is None else follow_ups(target, done, chat + tasks, rng, max_prompt_tokens)
    methods = corpus.stdlib_methods(5, 25)
    rng.shuffle(methods)
    code = [("code", f"{rng.choice(CODE_EDITS)}\n\n```python\n{source}\n```") for _, source in methods]
    yield from _alternate(second, code)


def _alternate(first: list, second: list):
    """first[0], second[0], first[1], second[1], ... while both last, then the rest of the longer."""
    for i in range(max(len(first), len(second))):
        yield from ([first[i]] if i < len(first) else []) + ([second[i]] if i < len(second) else [])


def follow_ups(target, done: Sequences, first_turns: list[tuple[str, str]], rng: random.Random,
               max_prompt_tokens: int = 320) -> list[tuple[str, list[dict]]]:
    """("chat", messages) for each chat sequence of `done` whose question is among `first_turns` and
    which training does not hold out (train.held_out_sequences: its answer must stay unseen): the
    question, the target's own answer, and a follow-up (FOLLOW_UPS, or CONTINUE after an answer cut
    at the length limit), seeded."""
    text_of = {}
    for task, text in first_turns:
        if task == "chat":
            text_of.setdefault(_prompt_key(target.encode(text)[-max_prompt_tokens:]), text)
    held = set(held_out_sequences([tuple(p) for p in done.prompts]))
    eos = target.eos_token_ids
    out = []
    for s, (prompt, answer, task) in enumerate(zip(done.prompts, done.answers, done.tasks)):
        question = text_of.get(_prompt_key(prompt))
        if task != "chat" or s in held or question is None or not answer:
            continue
        ended = answer[-1] in eos
        reply = target.tokenizer.decode([t for t in answer if t not in eos], skip_special_tokens=True).strip()
        if reply:
            turn = rng.choice(FOLLOW_UPS if ended else CONTINUE)
            out.append(("chat", [{"role": "user", "content": question}, {"role": "assistant", "content": reply},
                                 {"role": "user", "content": turn}]))
    return out


def fresh_prompts(target, pool, used: set[str], count: int, max_prompt_tokens: int) -> list[tuple[str, list[int]]]:
    """The next `count` (task, prompt ids) of `pool` (an iterator of prompt_pool) that no shard used
    yet (fewer when it runs out); `used`: the prompt keys already taken (updated)."""
    out: list[tuple[str, list[int]]] = []
    for task, text in pool:
        ids = target.encode(text)[-max_prompt_tokens:]
        key = _prompt_key(ids)
        if key not in used:
            used.add(key)
            out.append((task, ids))
            if len(out) == count:
                break
    return out


def sample_shards(target, backend, folder: str | Path, deadline: float, should_stop, log=print,
                  max_new_tokens: int = 192, batch: int = 32, seed: int = 0, aux_layers: tuple = ()) -> list[str]:
    """Sample new shards into `folder` until `deadline` (time.monotonic()) or `should_stop()`, checked
    between shards; each is recorded locally with its teacher signal (and the hidden states entering
    `aux_layers`, eagle3's features) as it is sampled, so this machine needs no teacher pass for it.
    `backend`: the engine backend to sample on (None: transformers). Returns the new shards' names."""
    from .data import _engine_data, _transformers_data

    folder = Path(folder)
    identity = target_identity(target)
    manifest = read_manifest(folder, identity)
    done = read_sequences(folder) if manifest["shards"] else Sequences([], [], [], [])
    used = {_prompt_key(p) for p in done.prompts}
    recipe = DataRecipe(max_new_tokens=max_new_tokens, batch=batch, temperatures=TEMPERATURES, topk=TOPK,
                        aux_layers=tuple(aux_layers), sampler="engine" if backend is not None else "transformers")
    names, pool = [], prompt_pool(seed, target, done, recipe.max_prompt_tokens)
    while time.monotonic() < deadline and not should_stop():
        chosen = fresh_prompts(target, pool, used, SHARD_SEQUENCES, recipe.max_prompt_tokens)
        if not chosen:
            log("distillation data: every prompt the machine's text gives has been sampled")
            break
        shard_seed = seed * 1_000_003 + len(manifest["shards"])
        groups = [i % len(TEMPERATURES) for i in range(len(chosen))]
        prompts = [ids for _, ids in chosen]
        started = time.monotonic()
        if backend is not None:
            data = _engine_data(target, backend, recipe, prompts, groups, shard_seed)
        else:
            data = _transformers_data(target, recipe, prompts, groups, shard_seed)
        sequences = Sequences(prompts, [s[len(p):] for s, p in zip(data.sequence_list(), prompts)],
                              [task for task, _ in chosen], [TEMPERATURES[g] for g in groups])
        settings = {"max_new_tokens": max_new_tokens, "max_prompt_tokens": recipe.max_prompt_tokens,
                    "temperatures": list(TEMPERATURES), "seed": shard_seed,
                    "sampled_on": backend.path if backend is not None else "transformers"}
        sources = {"chat": f"training.topics.open_questions (seed {seed}); second turns of sampled chats "
                           "(training.shards.follow_ups)",
                   "tasks": f"training.data.training_prompts (seed {seed}): man pages, gettext catalogs, the "
                            "standard library's source; its classes' methods (tasks.corpus.stdlib_methods)"}
        name = write_shard(folder, sequences, identity, settings, sources)
        data.save(_teacher_cache(folder, name, identity, aux_layers))
        names.append(name)
        answer_tokens = sum(len(a) for a in sequences.answers)
        log(f"distillation data: {folder / name}: {len(prompts)} sequences, {answer_tokens} answer tokens in "
            f"{time.monotonic() - started:.0f} s")
        manifest = read_manifest(folder, identity)
    return names


TOPK = 32


def _teacher_cache(folder: Path, name: str, identity: dict, aux_layers: tuple) -> Path:
    entry = read_manifest(folder)["shards"]
    digest = next(e["sha256"] for e in entry if e["name"] == name)
    stem = identity["name"].replace("/", "_")
    aux = "-aux" + "-".join(map(str, aux_layers)) if aux_layers else ""
    return cache_dir() / "distill" / "shards" / f"{stem}-{identity['weights']}-{digest}{aux}.safetensors"


def teacher_files(target, folder: str | Path, log=print, batch: int = 8, aux_layers: tuple = (),
                  deadline: float | None = None, should_stop=None) -> dict[str, Path]:
    """For the folder's shards, local files of their sequences with the teacher signal (final-norm
    features, top-k, and the hidden states entering `aux_layers`), made by one teacher-forced pass where
    this machine has none yet; read them together with DistillData.load. {shard name: file}, in the
    manifest's order; empty when the folder holds no shard. The pass takes the newest shards first and stops
    between shards at `deadline` (time.monotonic()) or `should_stop()`: the shards it did not reach are left
    out (a fresh machine's pass over every shard can outlast a run; the next run on it adds them)."""
    from tqdm import tqdm

    from .data import _teacher

    folder = Path(folder)
    identity = target_identity(target)
    manifest = read_manifest(folder, identity)
    files = {e["name"]: _teacher_cache(folder, e["name"], identity, tuple(aux_layers)) for e in manifest["shards"]}
    missing = [e for e in reversed(manifest["shards"]) if not files[e["name"]].is_file()]
    if missing:
        total = sum(e["sequences"] for e in missing)
        log(f"distillation data: teacher pass over {len(missing)} of {len(files)} shards ({total} sequences)")
        width = target.model.get_output_embeddings().weight.shape[0]
        with tqdm(total=total, desc="teacher pass", unit="seq", file=sys.stderr) as bar:
            for entry in missing:
                if deadline is not None and time.monotonic() >= deadline or should_stop is not None and should_stop():
                    left = [e["name"] for e in missing if not files[e["name"]].is_file()]
                    log(f"distillation data: the teacher pass stopped with {len(left)} shards left: training on "
                        f"the other {len(files) - len(left)} (a later run on this machine adds them)")
                    break
                path = files[entry["name"]]
                part = read_sequences(folder, [entry["name"]])
                whole = [p + a for p, a in zip(part.prompts, part.answers)]
                features, ids, probs, aux = _teacher(target.model, whole, TOPK, batch, bar.update, tuple(aux_layers))
                path.parent.mkdir(parents=True, exist_ok=True)
                DistillData.of(part.prompts, part.answers, width, features, ids, probs, aux).save(path)
    return {name: path for name, path in files.items() if path.is_file()}


def held_out_and_tasks(folder: str | Path, names: Collection[str]) -> tuple[list[int], dict[str, set[int]]]:
    """The held-out sequences (train.held_out_sequences over every shard of the folder, so a run on some of
    them holds out what a run on all would) and the sequences of each task, as indices into the
    concatenation of the shards `names` alone, in the manifest's order."""
    everything = read_sequences(folder)
    counts = [(e["name"], e["sequences"]) for e in read_manifest(folder)["shards"]]
    local, at, kept = {}, 0, 0
    for name, count in counts:
        if name in names:
            local.update({at + i: kept + i for i in range(count)})
            kept += count
        at += count
    held = [local[s] for s in held_out_sequences([tuple(p) for p in everything.prompts]) if s in local]
    tasks = {t: {local[i] for i, x in enumerate(everything.tasks) if x == t and i in local} for t in TASKS}
    return held, {t: s for t, s in tasks.items() if s}


def summary(folder: str | Path) -> dict:
    """Totals of the folder's data: shards, sequences, positions, answer tokens, bytes on disk."""
    folder = Path(folder)
    shards = read_manifest(folder)["shards"]
    return {"shards": len(shards), "sequences": sum(e["sequences"] for e in shards),
            "positions": sum(e["positions"] for e in shards),
            "answer_tokens": sum(e["answer_tokens"] for e in shards),
            "bytes": sum((folder / e["name"]).stat().st_size for e in shards if (folder / e["name"]).is_file())}
