"""Train an eagle3 and an eagle drafter on one self-distillation data set for the same minutes
(the comparison in docs/results.md, "EAGLE-3 against EAGLE on the same data and time").

    .venv/bin/python scripts/train_eagle3_vs_eagle.py --minutes 12 --prompts 1200 --chat-prompts 300 --out drafters

The data is `specdec train-drafter`'s (cached under ~/.cache/specdec/distill), recorded with the
hidden states entering the eagle3 drafter's layers; eagle ignores them. Each drafter is saved to
OUT/eagle3 and OUT/eagle, and its held-out agreement curve is in its config.json.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from specdec.drafters.trained import save_drafter  # noqa: E402
from specdec.models import load_model  # noqa: E402
from specdec.training.data import DataRecipe, DistillData, build_data  # noqa: E402
from specdec.training.train import TrainRecipe, aux_layers_for, train  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="smollm2-135m")
    parser.add_argument("--minutes", type=float, default=12.0)
    parser.add_argument("--prompts", type=int, default=1200)
    parser.add_argument("--chat-prompts", type=int, default=300)
    parser.add_argument("--eagle3-vocab", type=int, default=4096, help="eagle3's draft vocabulary (its head is saved)")
    parser.add_argument("--eagle3-ffn", type=int, default=1024)
    parser.add_argument("--out", default="drafters")
    args = parser.parse_args()
    target = load_model(args.target, "auto", "cpu")
    eagle3 = TrainRecipe(kind="eagle3", vocab_size=args.eagle3_vocab, ffn=args.eagle3_ffn, minutes=args.minutes)
    aux = aux_layers_for(eagle3, target)
    recipes = [DataRecipe(prompts=args.prompts, aux_layers=aux)]
    if args.chat_prompts:
        recipes.append(DataRecipe(prompts=args.chat_prompts, max_new_tokens=192, batch=64, mix="chat", aux_layers=aux))
    data = DistillData.concat([build_data(target, recipe) for recipe in recipes])
    print(f"data: {data.tokens.numel()} positions, {int(data.token_counts.sum())} answer tokens", flush=True)
    for recipe in (eagle3, TrainRecipe(kind="eagle", minutes=args.minutes)):
        net = train(target, data, recipe, progress=False)
        net.config.recipe["data"] = {"prompts": args.prompts, "chat_prompts": args.chat_prompts,
                                     "positions": int(data.tokens.numel())}
        print(f"{recipe.kind}: saved {save_drafter(net, Path(args.out) / recipe.kind)}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
