"""Self-distillation rate: answer tokens an hour of `build_data` for one data recipe, from a fresh
distillation cache (the converted models and kernels are reused), one JSON line on stdout.

    .venv/bin/python scripts/distill_rate.py '{"prompts": 256, "max_new_tokens": 64, "batch": 32,
        "aux_layers": [2, 15, 27], "sampler": "engine"}' [--target smollm2-135m]

The JSON holds training.data.DataRecipe's fields; run it once per sampler ("engine",
"transformers") to compare them side by side.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("recipe", help="DataRecipe fields as JSON")
    parser.add_argument("--target", default="smollm2-135m")
    args = parser.parse_args()
    from specdec.paths import cache_dir

    shared, fresh = cache_dir(), Path(tempfile.mkdtemp(prefix="specdec-distill-rate-"))
    shared.mkdir(parents=True, exist_ok=True)
    for entry in shared.iterdir():
        if entry.name != "distill":
            (fresh / entry.name).symlink_to(entry)
    os.environ["SPECDEC_CACHE"] = str(fresh)

    from specdec.models import load_model
    from specdec.training.data import DataRecipe, build_data

    fields = json.loads(args.recipe)
    fields["aux_layers"] = tuple(fields.get("aux_layers", ()))
    if "temperatures" in fields:
        fields["temperatures"] = tuple(fields["temperatures"])
    target = load_model(args.target, "auto")
    start = time.perf_counter()
    data = build_data(target, DataRecipe(**fields), log=lambda message: print(message, file=sys.stderr))
    seconds = time.perf_counter() - start
    answers = int(data.tokens.numel() - data.prompt_lengths.sum())
    print(json.dumps({"recipe": json.loads(args.recipe), "seconds": round(seconds, 1), "answer_tokens": answers,
                      "positions": int(data.tokens.numel()), "answer_tokens_per_hour": round(answers / seconds * 3600)}))


if __name__ == "__main__":
    main()
