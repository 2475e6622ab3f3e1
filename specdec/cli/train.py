"""`specdec train-drafter`: make a drafter for a target that has no small sibling.

    specdec train-drafter --target smollm2-135m --kind eagle --out drafters/smollm2-eagle --minutes 30

Samples the target on prompts built from text on the machine (cached, shared by every kind and
size), trains the kind asked for, and saves it; use it with `--drafter DIR` anywhere.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from ..config import WEIGHTS
from ..errors import SpecdecError
from .options import add_dtype, add_target, output_directory

DEFAULT_LR = 2e-3
"""The peak learning rate of a new drafter's training."""


def run(args: argparse.Namespace) -> int:

    from ..drafters.checkpoint import is_trained_drafter, save_drafter
    from ..drafters.nets import KINDS
    from ..plan import make_plan
    from ..training.data import DataRecipe, DistillData, data_files, sequence_count
    from ..training.shards import summary as shard_summary
    from ..training.train import (
        SIZES,
        StopRequest,
        TrainRecipe,
        aux_layers_for,
        read_optimizer_state,
        save_optimizer_state,
        train,
    )

    if args.resume:
        if args.init or args.out and Path(args.out).resolve() != Path(args.resume).resolve():
            raise SpecdecError("--resume DIR continues the drafter in DIR and writes it back there: leave out --out and "
                               "--init (or use --init DIR --out NEW to keep DIR as it is)")
        if not is_trained_drafter(args.resume):
            raise SpecdecError(f"--resume {args.resume} holds no trained drafter: give a directory written by "
                               "train-drafter (or start one with --out)")
        args.init, args.out, args.overwrite = args.resume, args.resume, True
    if not args.out:
        raise SpecdecError("give --out DIR (where the drafter is written) or --resume DIR (a drafter to continue)")
    if args.time_limit is not None and args.time_limit <= 0 or args.sample_minutes is not None and args.sample_minutes < 0:
        raise SpecdecError("--time-limit must be positive and --sample-minutes 0 or more")
    if args.sample_minutes and not args.data_dir:
        raise SpecdecError("--sample-minutes samples new shards into a --data-dir: give one (e.g. data/distill/smollm2-135m)")
    began = time.monotonic()
    out = Path(args.out)
    if out.is_dir() and any(out.iterdir()) and not (is_trained_drafter(out) and args.overwrite):
        what = "a trained drafter" if is_trained_drafter(out) else "files that are not a trained drafter"
        raise SpecdecError(f"{out} already holds {what}: choose another --out"
                           + (" or pass --overwrite" if is_trained_drafter(out) else ""))
    if args.kind not in KINDS:
        raise SpecdecError(f"unknown --kind {args.kind!r}: use one of {', '.join(KINDS)}")
    if any(value is not None and value <= 0 for value in (args.minutes, args.steps, args.lr)):
        raise SpecdecError("--minutes, --steps and --lr must be positive")
    if args.vocab < 2 or args.prompts < 1 or args.max_new_tokens < 1 or args.chat_max_new_tokens < 1:
        raise SpecdecError("--vocab must be at least 2, --prompts and the --max-new-tokens options at least 1")
    if args.chat_prompts < 0:
        raise SpecdecError("--chat-prompts must be 0 or more")
    if args.chat_samples < 1:
        raise SpecdecError("--chat-samples must be at least 1 (answers to each chat question)")
    if args.layers is not None and (args.layers < 1 or args.kind not in ("draft-lm", "eagle")):
        raise SpecdecError("--layers takes a count of at least 1, for --kind draft-lm or eagle (eagle3 has one layer, "
                           "as vLLM and SGLang load it; medusa has heads: --medusa-heads)")
    if args.feature_loss < 0:
        raise SpecdecError("--feature-loss must be 0 or more (0: the token loss alone)")
    if args.unroll < 1:
        raise SpecdecError("--unroll must be at least 1 (the draft steps trained on)")
    if args.weights not in ("auto", "float") and args.sampler != "engine":
        raise SpecdecError(f"--weights {args.weights} is what the engine sampler runs the target on: use --sampler engine")
    output_directory(args.out)  # before the target loads: minutes of training must have somewhere to go
    size = SIZES[args.size] if args.kind == "draft-lm" else dict(layers=1, ffn=1536)
    earlier = None
    if args.init:  # checked before the target loads; its weights are read (and checked against it) below
        from ..drafters.checkpoint import read_config

        if not is_trained_drafter(args.init):
            raise SpecdecError(f"--init {args.init} holds no trained drafter: give a directory written by train-drafter")
        earlier = read_config(args.init)
        if earlier.kind != args.kind:
            raise SpecdecError(f"--init {args.init} is a {earlier.kind} drafter, not {args.kind}: use --kind {earlier.kind}")
        size = dict(layers=earlier.layers, ffn=earlier.ffn)
        args.layers, args.ffn, args.medusa_heads = None, None, earlier.medusa_heads
        if args.lr is None:  # a trained drafter goes on at its own peak: twice it undoes what it learnt
            args.lr = float(earlier.recipe.get("lr") or DEFAULT_LR)
    if args.lr is None:
        args.lr = DEFAULT_LR
    recipe = TrainRecipe(kind=args.kind, layers=args.layers or size["layers"], ffn=args.ffn or size["ffn"],
                         medusa_heads=args.medusa_heads, vocab_size=args.vocab, steps=args.steps,
                         minutes=args.minutes if args.minutes is not None else 30.0, batch=args.batch, seed=args.seed,
                         lr=args.lr, unroll=args.unroll, aux_layers=parse_layers(args.aux_layers),
                         bf16={"auto": None, "bf16": True, "fp32": False}[args.precision],
                         feature_loss=args.feature_loss)
    log = lambda message: print(f"specdec: {message}", file=sys.stderr)  # noqa: E731
    # the dtype generation loads (float32 where the GGUF blocks run): the engine sampler records the numbers of
    # the path the drafter will draft for, at the blocks' many-row speed
    plan = make_plan(args.target, (), args.dtype, args.weights, device=args.device)
    target = plan.load()
    if earlier is not None and earlier.kind == "eagle3":
        recipe.aux_layers = tuple(earlier.aux_layers)
    aux = aux_layers_for(recipe, target) if args.kind == "eagle3" else ()
    recipes = [DataRecipe(prompts=args.prompts, max_new_tokens=args.max_new_tokens, seed=args.data_seed,
                          batch=args.data_batch, aux_layers=aux, sampler=args.sampler)]
    if args.chat_prompts:  # short prompts: twice the rows per batch
        recipes.append(DataRecipe(prompts=args.chat_prompts, max_new_tokens=args.chat_max_new_tokens,
                                  seed=args.data_seed, batch=args.data_batch * 2, mix="chat", aux_layers=aux,
                                  sampler=args.sampler, samples=args.chat_samples))
    backend = None
    if args.sampler == "engine":  # the backend generation runs on (the GGUF blocks where they run)
        backend = plan.target_pass(target)
        if backend.can_fork:
            log(f"sampling the target on {backend.path}")
        else:  # one sequence at a time would be far slower than transformers' batched sampler
            log(f"the {backend.path} backend runs one sequence at a time: sampling with transformers instead")
            backend = None
            for r in recipes:
                r.sampler = "transformers"
    start = None
    if earlier is not None:
        from ..drafters.trained import read_net

        start = read_net(args.init, target)
        recipe.vocab_size = start.vocab.numel()
    stop = StopRequest(lambda: log("interrupted: keeping what is done (finished shards; the drafter trained so far), "
                                   "then stopping (again to abandon it)"))
    with stop:
        if args.data_dir:  # the committed shards, grown first by --sample-minutes of sampling
            data, sets, held_out, recipe.minutes, data_shards = shard_data(args, target, backend, aux, began, stop,
                                                                           log)
            if data is None:
                return 0
        else:
            files, held_out = [data_files(target, r, log, backend) for r in recipes], None
            # read together, not concatenated: millions of positions' features are never held twice
            data = DistillData.load([f for fs in files for f in fs], features=args.kind != "eagle3",
                                    aux=args.kind == "eagle3")
            sets, at = {}, 0
            for name, fs in zip(("tasks", "chat"), files):
                count = sum(sequence_count(f) for f in fs)
                sets[name], at = range(at, at + count), at + count
        moments = {}
        optimizer_state = None
        if args.resume and start is not None:
            optimizer_state = read_optimizer_state(args.resume, start.float())
            log(f"continuing {args.resume} " + ("with its optimiser state" if optimizer_state else
                                                "(no optimiser state saved beside it: the moments start afresh)"))
        net = train(target, data, recipe, log, start=start, sets=sets, optimizer_state=optimizer_state,
                    keep_optimizer=moments.update, stop=stop, held_out=held_out)
    if earlier is not None and not args.resume:
        net.config.recipe["continued_from"] = {"path": str(args.init), "recipe": earlier.recipe}
    if args.data_dir:
        net.config.recipe["data"] = {"data_dir": str(args.data_dir), **shard_summary(args.data_dir),
                                     "trained_on_shards": data_shards}
    else:
        net.config.recipe["data"] = {"prompts": args.prompts, "max_new_tokens": args.max_new_tokens,
                                     "seed": args.data_seed, "chat_prompts": args.chat_prompts,
                                     "chat_max_new_tokens": args.chat_max_new_tokens,
                                     "chat_samples": args.chat_samples, "answer_tokens": int(data.token_counts.sum()),
                                     "positions": int(data.tokens.numel()),
                                     "sampled_on": backend.path if backend is not None else "transformers"}
    if args.resume:  # one line a run: the curve across sessions
        runs = earlier.recipe.get("runs") or ([run_summary(earlier.recipe)] if "steps_done" in earlier.recipe else [])
        net.config.recipe["runs"] = runs + [run_summary(net.config.recipe)]
    save_drafter(net, out)
    if args.resume or args.data_dir:
        save_optimizer_state(moments, out)
    megabytes = sum(f.stat().st_size for f in out.iterdir()) / 1e6
    log(f"wrote {out} ({megabytes:.1f} MB); use it with --drafter {out}")
    return 0


def shard_data(args, target, backend, aux: tuple, began: float, stop, log):
    """--data-dir: sample new shards there for --sample-minutes (half of --time-limit when only that is
    given), then read the shards' sequences with their teacher signal: the teacher pass a machine makes once
    takes at most half of what --time-limit leaves, so training always gets the rest, on the shards it reached.
    Returns (data, sequences by task, held-out sequences, training minutes, shards read), or Nones when a
    stop came before training."""
    from ..training.data import DistillData
    from ..training.shards import held_out_and_tasks, read_manifest, sample_shards, teacher_files

    limit = args.time_limit * 60 if args.time_limit else None
    sampling = args.sample_minutes * 60 if args.sample_minutes is not None else (limit / 2 if limit else 0)
    deadline = time.monotonic() + sampling  # --sample-minutes of sampling, within the run's --time-limit
    if limit:
        deadline = min(deadline, began + limit)
    if sampling > 0:
        new = sample_shards(target, backend, args.data_dir, deadline, lambda: stop.requested, log,
                            max_new_tokens=args.chat_max_new_tokens, batch=args.data_batch, seed=args.data_seed,
                            aux_layers=aux)
        log(f"distillation data: {len(new)} new shards in {args.data_dir}")
    if stop.requested:
        log("stopped before training: the shards sampled are kept; run again to train on them")
        return None, None, None, None, 0
    teacher_deadline = None if not limit else time.monotonic() + (began + limit - time.monotonic()) / 2
    files = teacher_files(target, args.data_dir, log, aux_layers=aux, deadline=teacher_deadline,
                          should_stop=lambda: stop.requested)
    if stop.requested:
        log("stopped before training: the shards and their teacher signal are kept; run again to train on them")
        return None, None, None, None, 0
    if not files and read_manifest(args.data_dir)["shards"]:
        log("the time limit ran out in the teacher pass: what it made is kept; run again to train")
        return None, None, None, None, 0
    if not files:
        raise SpecdecError(f"{args.data_dir} holds no data shards yet: give --sample-minutes M (or --time-limit) "
                           "to sample some first")
    data = DistillData.load(list(files.values()), features=args.kind != "eagle3", aux=args.kind == "eagle3")
    held_out, sets = held_out_and_tasks(args.data_dir, files)
    minutes = args.minutes if args.minutes is not None else 30.0
    if limit:
        left = (limit - (time.monotonic() - began)) / 60 - 0.5  # half a minute to measure and save
        if left <= 0:
            log("the time limit ran out before training: the shards are kept; run again to train on them")
            return None, None, None, None, 0
        minutes = min(minutes, left) if args.minutes is not None else left
    return data, sets, held_out, minutes, len(files)


def run_summary(recipe: dict) -> dict:
    """One training run, as the drafter's recipe["runs"] keeps it: when, how long, on what, and its
    held-out α by task and draft position."""
    return {key: recipe.get(key)
            for key in ("finished", "steps_done", "seconds", "interrupted", "data", "final_loss", "held_out")}


def parse_layers(text: str | None) -> tuple[int, ...] | None:
    """--aux-layers "2,15,27" -> (2, 15, 27); None when not given."""
    if not text:
        return None
    try:
        return tuple(int(part) for part in text.split(","))
    except ValueError:
        raise SpecdecError(f"--aux-layers {text!r}: give layer numbers separated by commas, e.g. 2,15,27") from None


def register(sub) -> None:
    p = sub.add_parser("train-drafter", help="train a drafter (draft-lm, medusa, eagle or eagle3) for a target")
    add_target(p)
    p.add_argument("--kind", required=True, help="draft-lm, medusa, eagle or eagle3")
    p.add_argument("--out", default=None, help="directory to write the drafter to")
    p.add_argument("--resume", default=None, metavar="DIR",
                   help="continue the drafter in DIR (weights, and AdamW's moments where saved beside it) and write it "
                        "back there, with this run added to its recipe's runs")
    p.add_argument("--data-dir", default=None, metavar="DIR",
                   help="train on the token-id shards in DIR (e.g. data/distill/smollm2-135m, committed to the "
                        "repository), their teacher signal rebuilt here by one teacher-forced pass")
    p.add_argument("--sample-minutes", type=float, default=None,
                   help="first sample new shards into --data-dir for this long, on prompts no shard used yet")
    p.add_argument("--time-limit", type=float, default=None, metavar="MINUTES",
                   help="the whole run's clock: sampling (half of it unless --sample-minutes), the teacher pass, "
                        "training and saving; SIGTERM or Ctrl-C also stop it with everything saved")
    p.add_argument("--size", default="s", choices=("s", "m", "l"),
                   help="draft-lm size: s = 1 layer, m = 2 layers, l = 4 layers (MLP width 1536)")
    p.add_argument("--layers", type=int, default=None,
                   help="override the draft-lm's or eagle's layer count (eagle: 1 by default)")
    p.add_argument("--ffn", type=int, default=None, help="override the MLP width")
    p.add_argument("--medusa-heads", type=int, default=4, help="Medusa heads (tokens proposed per round)")
    p.add_argument("--aux-layers", default=None, metavar="I,J,K",
                   help="eagle3: the target layers whose incoming hidden states it reads (default: 2, N/2, N-3)")
    p.add_argument("--unroll", type=int, default=3,
                   help="eagle/eagle3: draft steps unrolled in training (training-time test; default: %(default)s)")
    p.add_argument("--vocab", type=int, default=8192, help="draft vocabulary size (default: %(default)s)")
    p.add_argument("--minutes", type=float, default=None, help="training time (default: 30)")
    p.add_argument("--steps", type=int, default=None, help="train for this many steps instead of --minutes")
    p.add_argument("--lr", type=float, default=None,
                   help=f"peak learning rate (cosine schedule; default: {DEFAULT_LR}, or the drafter's own with --resume "
                        "or --init)")
    p.add_argument("--feature-loss", type=float, default=1.0,
                   help="eagle: weight of the feature regression beside the token loss; 0 trains on tokens "
                        "alone, as EAGLE-3 does (default: %(default)s)")
    p.add_argument("--precision", default="auto", choices=("auto", "bf16", "fp32"),
                   help="training's matrix products: bf16 under autocast (float32 weights and losses), fp32, or "
                        "auto (bf16 where the CPU has fast bf16 matmuls; default)")
    p.add_argument("--batch", type=int, default=16, help="windows per step (default: %(default)s)")
    p.add_argument("--prompts", type=int, default=2000, help="prompts the target answers (default: %(default)s)")
    p.add_argument("--max-new-tokens", type=int, default=64, help="answer length (default: %(default)s)")
    p.add_argument("--chat-prompts", type=int, default=0,
                   help="also answer this many everyday chat questions at length (a second cached data set; "
                        "up to ~2900 distinct; default: %(default)s)")
    p.add_argument("--chat-max-new-tokens", type=int, default=192, help="their answer length (default: %(default)s)")
    p.add_argument("--chat-samples", type=int, default=1,
                   help="answers to each chat question: one at the rotation's temperature (0 or 1), the others "
                        "further draws at temperature 1 (default: %(default)s)")
    p.add_argument("--data-batch", type=int, default=32, help="prompts sampled together (default: %(default)s)")
    p.add_argument("--data-seed", type=int, default=0)
    p.add_argument("--sampler", default="engine", choices=("engine", "transformers"),
                   help="engine: sample the target on the backend specdec generates with and record its teacher "
                        "signal in the same passes (the GGUF blocks where generation runs them: --dtype auto loads "
                        "a built-in target in float32 there; --dtype bfloat16 samples on the bf16 path instead); "
                        "transformers: transformers' "
                        "model, then a teacher-forced pass (the float model's numbers; data cached before this "
                        "option existed). Default: %(default)s")
    p.add_argument("--seed", type=int, default=0, help="training seed")
    add_dtype(p)
    p.add_argument("--device", default="cpu")
    p.add_argument("--weights", default="auto", choices=WEIGHTS,
                   help="the target's weights while it answers (as generate's --weights; default: auto): train for the "
                        "model you will generate with, e.g. q8_0 for a model you run quantised (also ~4x faster sampling)")
    p.add_argument("--init", default=None, metavar="DIR",
                   help="continue training the drafter saved in DIR (same kind and target; its sizes are kept)")
    p.add_argument("--overwrite", action="store_true", help="replace a trained drafter already in --out")
    p.set_defaults(handler=run)
