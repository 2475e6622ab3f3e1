"""Measure, then continue, a trained drafter on the chat chunks sampled so far.

`specdec train-drafter --chat-samples 4` samples 6 chunks of 2048 answers (~22 min each on a 2-vCPU
VNNI host); this session stopped after the first chunks to leave time for training. This script
does what train-drafter does after sampling (load the data, hold out every 20th prompt, train, save),
on the chunk files that exist:

    python docs/results/drafter-vnni/train_on_parts.py --init specdec/data/drafters/smollm2-135m \
        --parts ~/.cache/specdec/distill/smollm2-135m-<key>.part1of6.safetensors ...part2of6... \
        --measure-only
    python docs/results/drafter-vnni/train_on_parts.py --init ... --parts ... --minutes 50 --out DIR

The task mix has 40 prompts (a multiple of 20): the chat prompts held out are then those the shipped
drafter's run held out (its task mix had 2000), so the measure stays on questions it never saw.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

import torch

from specdec.backends.gguf import load_dtype
from specdec.backends.lean import target_backend
from specdec.drafters.nets import DraftNet
from specdec.drafters.trained import build_net, read_net, save_drafter
from specdec.models import load_model
from specdec.training.data import DataRecipe, DistillData, data_files, sequence_count
from specdec.training.train import (
    Objective,
    TrainRecipe,
    Windows,
    draft_vocabulary,
    held_out_agreement,
    held_out_sequences,
    mass_covered,
    sequence_prompts,
    train,
)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--init", required=True)
    ap.add_argument("--parts", nargs="+", required=True)
    ap.add_argument("--minutes", type=float, default=50)
    ap.add_argument("--steps", type=int)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--feature-loss", type=float, default=1.0)
    ap.add_argument("--out")
    ap.add_argument("--measure-only", action="store_true")
    ap.add_argument("--draft-temperatures", type=float, nargs="+",
                    help="with --measure-only: Σmin(p, q) at T = 1 with q drawn at each of these temperatures "
                         "(the verifier is told that q, so any is exact; a better-calibrated q is accepted more)")
    ap.add_argument("--vocab", type=int, nargs="+",
                    help="eagle, with --measure-only: measure with the draft vocabulary widened to each of these sizes "
                         "(the drafter's ids plus the ones the data's target emits most; the head rows are the target's)")
    ap.add_argument("--add-layers", type=int, default=0,
                    help="eagle: grow the drafter by this many layers, each starting as the identity (its output "
                         "projections zero), so training starts from the drafter's own drafts")
    args = ap.parse_args()
    log = lambda m: print(f"train_on_parts: {m}", file=sys.stderr, flush=True)  # noqa: E731

    target = load_model("smollm2-135m", load_dtype("auto", "auto", "smollm2-135m"))
    start = read_net(args.init, target)
    if args.add_layers:
        grown = DraftNet(replace(start.config, layers=start.config.layers + args.add_layers), start.vocab,
                         start.embed, start.head)
        grown.load_state_dict(start.state_dict(), strict=False)  # the new blocks are the missing keys
        with torch.no_grad():
            for block in grown.blocks[start.config.layers :]:
                block.o.weight.zero_()
                block.down.weight.zero_()
        grown.config.recipe = start.config.recipe
        start = grown
    backend = target_backend(target)  # the path the task mix is sampled on, if not cached
    tasks = data_files(target, DataRecipe(prompts=40, max_new_tokens=64), log, backend)
    parts = [Path(p).expanduser() for p in args.parts]
    data = DistillData.load([*tasks, *parts], features=True, aux=False)
    n_tasks = sum(sequence_count(f) for f in tasks)
    sets = {"tasks": range(0, n_tasks), "chat": range(n_tasks, data.sequences)}
    log(f"{data.sequences} sequences ({data.sequences - n_tasks} chat), {int(data.token_counts.sum())} answer tokens")
    if args.measure_only:
        held = held_out_sequences(sequence_prompts(data))
        taken = set(held)
        chat = sets["chat"]
        inside = [s for s in chat if s not in taken]
        if args.draft_temperatures:
            import specdec.training.train as training

            plain_agreement, result = training.agreement, {}
            for tau in args.draft_temperatures:
                training.agreement = lambda logits, *rest, tau=tau: plain_agreement(logits / tau, *rest)
                objective = Objective(start.float(), 1.0, 3)
                result[f"held-out chat, q at temperature {tau}"] = held_out_agreement(
                    objective, Windows(data, [s for s in held if s in chat], 160, 1, 0.3))
                log(json.dumps(result))
            training.agreement = plain_agreement
            print(json.dumps(result, indent=1))
            return 0
        if args.vocab:
            result = {}
            for size in args.vocab:
                wide = draft_vocabulary(data, size, set(start.vocab.tolist()))
                net = build_net(start.config, wide, target.model)
                net.load_state_dict({**start.state_dict(), "vocab": wide})
                objective = Objective(net.float(), 1.0, 3)
                result[f"held-out chat, vocabulary {wide.numel()}"] = dict(
                    held_out_agreement(objective, Windows(data, [s for s in held if s in chat], 160, 1, 0.3)),
                    mass_covered=round(mass_covered(data, wide), 4))
                log(json.dumps(result))
            print(json.dumps(result, indent=1))
            return 0
        objective = Objective(start.float(), 1.0, 3)
        result = {
            "held-out chat": held_out_agreement(objective, Windows(data, [s for s in held if s in chat], 160, 1, 0.3)),
            "held-in chat (new answers)": held_out_agreement(objective, Windows(data, inside, 160, 1, 0.3)),
        }
        print(json.dumps(result, indent=1))
        return 0
    recipe = TrainRecipe(kind=start.config.kind, layers=start.config.layers, ffn=start.config.ffn,
                         medusa_heads=start.config.medusa_heads, vocab_size=start.vocab.numel(),
                         minutes=args.minutes, steps=args.steps, lr=args.lr, feature_loss=args.feature_loss)
    earlier = dict(start.config.recipe)  # train() continues `start` itself: its recipe is replaced
    net = train(target, data, recipe, log, start=start, sets=sets)
    net.config.recipe["continued_from"] = {"path": args.init, "recipe": earlier}
    net.config.recipe["data"] = {"prompts": 40, "max_new_tokens": 64, "chat_prompts": 2910, "chat_max_new_tokens": 256,
                                 "chat_samples": 4, "chat_chunks": [p.name for p in parts],
                                 "answer_tokens": int(data.token_counts.sum()), "positions": int(data.tokens.numel()),
                                 "sampled_on": backend.path}
    save_drafter(net, args.out)
    log(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
