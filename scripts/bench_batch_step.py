"""What a batched target pass costs: b sequences (each with a 200-token context) scoring r new
positions each in one forward_many, median milliseconds over 7 passes, on the built-in model with
the default dtype. The row-budget default of `specdec serve` comes from this curve.

    .venv/bin/python scripts/bench_batch_step.py [--sequences 1,2,4,8,16] [--rows 1,2,4,8]
"""

import argparse
import statistics
import time

import torch

from specdec.api import SpecDec
from specdec.backends import Step


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sequences", default="1,2,4,8,16")
    parser.add_argument("--rows", default="1,2,4,8")
    args = parser.parse_args()
    sizes, rows = [int(x) for x in args.sequences.split(",")], [int(x) for x in args.rows.split(",")]
    sd = SpecDec(drafter="none")
    target = sd.engine.target
    sequences = [target] + [target.fork() for _ in range(max(sizes) - 1)]
    generator = torch.Generator().manual_seed(0)
    vocab = sd.tokenizer.vocab_size
    for sequence in sequences:
        sequence.prefill(torch.randint(0, vocab, (200,), generator=generator))

    def pass_ms(b: int, r: int, reps: int = 7) -> float:
        times = []
        for _ in range(reps):
            work = [(s, Step(torch.randint(0, vocab, (r,), generator=generator))) for s in sequences[:b]]
            start = time.perf_counter()
            target.forward_many(work)
            times.append(time.perf_counter() - start)
            for s in sequences[:b]:
                s.rollback(200)
        return statistics.median(times) * 1e3

    print(f"{sd.target.name} ({target.path}, {target.dtype}); ms per pass, b sequences x r positions each")
    print("| b | " + " | ".join(f"r = {r}" for r in rows) + " |")
    print("|---|" + "---|" * len(rows))
    with torch.inference_mode():
        pass_ms(1, 1)  # warm-up
        for b in sizes:
            print(f"| {b} | " + " | ".join(f"{pass_ms(b, r):.0f}" for r in rows) + " |", flush=True)


if __name__ == "__main__":
    main()
