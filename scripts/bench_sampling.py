"""What sampling costs beside a target step: warping a round's rows into p (temperature, top-k, top-p),
a draw, a seeded (drafter-invariant) draw, and the penalties' counts and subtraction, per round of
n scored rows, on a built-in target's real logits (the rows of a chat answer it wrote itself). A
plain decoding step of SmolLM2 on the GGUF blocks is ~3-6 ms on the hosts measured; anything here
near that is worth a look (docs/results.md: a whole-vocabulary sort for top-p cost ~5 ms a row).

    .venv/bin/python scripts/bench_sampling.py [--target smollm2-135m] [--rows 1,4,16] [--repeats 50]
"""

import argparse
import statistics
import time

import torch

from specdec import SpecDec
from specdec.config import SamplingParams
from specdec.prompts import task_prompts
from specdec.sampling import adjust, coupled_draw, probs, row_counts, sample

SETTINGS = {
    "T=1": SamplingParams(temperature=1.0),
    "T=0.7 top-p 0.9": SamplingParams(temperature=0.7, top_p=0.9),
    "T=0.7 top-k 50": SamplingParams(temperature=0.7, top_k=50),
    "T=1 top-p 0.95": SamplingParams(temperature=1.0, top_p=0.95),
}


def real_logits(target: str) -> torch.Tensor:
    """(rows, V) the target's logits over a chat prompt and the answer it gave (float32)."""
    sd = SpecDec(target=target, drafter="none", weights="float")
    prompt = task_prompts("chat", 1, seed=0)[0].text
    result = sd.generate(prompt, max_new_tokens=96)
    ids = torch.tensor([result.prompt_ids + result.token_ids])
    with torch.inference_mode():
        logits = sd.target.model(ids).logits[0].float()
    return logits[len(result.prompt_ids) - 1 :]


def ms(f, repeats: int) -> float:
    f()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        f()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def round_costs(logits: torch.Tensor, n: int, repeats: int, output_counts: torch.Tensor) -> list[str]:
    """The table's cells for rounds of n scored rows."""
    rows = logits[:n]
    cells = [f"{ms(lambda s=s: probs(rows, s), repeats):.3f}" for s in SETTINGS.values()]
    p = probs(rows[:1], SETTINGS["T=1"])[0]
    generator = torch.Generator().manual_seed(0)
    cells.append(f"{ms(lambda: sample(p, generator), repeats):.3f}")
    position = iter(range(10**9))  # a fresh position each time: no cached noise
    cells.append(f"{ms(lambda: coupled_draw(p, 1, next(position)), repeats):.3f}")
    drafts = logits[1:n].argmax(dim=-1)
    sees = torch.ones(n, n - 1, dtype=torch.bool).tril(-1)
    penalised = SamplingParams(temperature=1.0, frequency_penalty=0.5, presence_penalty=0.3)
    cells.append(f"{ms(lambda: adjust(rows, penalised, row_counts(output_counts, drafts, sees)), repeats):.3f}")
    return cells


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--target", default="smollm2-135m")
    parser.add_argument("--rows", default="1,4,16")
    parser.add_argument("--repeats", type=int, default=50)
    args = parser.parse_args()
    logits = real_logits(args.target)
    vocab = logits.shape[-1]
    print(f"{args.target}: {logits.shape[0]} rows of real logits, vocabulary {vocab}; median ms a round of n rows")
    print("| n | " + " | ".join(f"p, {name}" for name in SETTINGS) + " | a draw | a seeded draw | penalties |")
    print("|---" * (len(SETTINGS) + 4) + "|")
    output_counts = torch.zeros(vocab)
    output_counts[torch.randint(0, vocab, (100,), generator=torch.Generator().manual_seed(0))] += 1
    for n in [int(x) for x in args.rows.split(",")]:
        print(f"| {n} | " + " | ".join(round_costs(logits, n, args.repeats, output_counts)) + " |")


if __name__ == "__main__":
    main()
