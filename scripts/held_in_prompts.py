"""Write held-in benchmark prompts: prompts the shipped drafter's training data answered (and did not
hold out), a few per task, as JSONL for `specdec bench --prompts FILE`.

    .venv/bin/python scripts/held_in_prompts.py --per-task 3 --out docs/results/held-in-prompts.jsonl

The data sets are those of `specdec train-drafter` with its defaults and `--chat-prompts 900`
(scripts/train_drafters.sh): the task mix (2000 prompts), then the everyday chat questions. A prompt's
sequence number in the concatenated data follows `training.data.sequence_order`, and the sequences
training holds out (`training.train.held_out_sequences`) are skipped here.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from specdec.training.data import DataRecipe, sequence_order  # noqa: E402
from specdec.training.train import held_out_sequences  # noqa: E402


def held_in(recipes: list[DataRecipe], per_task: int, seed: int) -> list[dict]:
    sequences = []  # (data set, prompt index, task, prompt, temperature) of each sequence of the data
    for number, recipe in enumerate(recipes):
        pairs = recipe.prompts_text()
        sequences += [(number, i, *pairs[i], recipe.temperatures[k])
                      for i, k in sequence_order(len(pairs), len(recipe.temperatures))]
    held_out = set(held_out_sequences([(number, i) for number, i, *_ in sequences]))
    kept = sorted(row for s, row in enumerate(sequences) if s not in held_out)  # in prompt order
    rows = [{"task": task, "prompt": text, "answered_at": temperature} for _, _, task, text, temperature in kept]
    rng = random.Random(f"held-in:{seed}")
    picked = []
    for task in ("chat", "translate", "summarise", "code"):
        of_task = [r for r in rows if r["task"] == task]
        picked += rng.sample(of_task, min(per_task, len(of_task)))
    return picked


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--per-task", type=int, default=3)
    parser.add_argument("--chat-prompts", type=int, default=900)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="docs/results/held-in-prompts.jsonl")
    args = parser.parse_args()
    recipes = [DataRecipe(), DataRecipe(prompts=args.chat_prompts, max_new_tokens=192, batch=64, mix="chat")]
    picked = held_in(recipes, args.per_task, args.seed)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in picked), encoding="utf-8")
    print(f"wrote {len(picked)} held-in prompts to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
