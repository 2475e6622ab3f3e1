"""Continuous batching in process (no HTTP): b chat prompts decoded together by specdec.decoding.batching.Batch,
greedy, until each has its tokens; total tokens/s and ms per batch step, for each b. What the server's
engine can do, to compare with scripts/bench_serve.py's rates through HTTP.

    .venv/bin/python scripts/bench_batch_run.py [--sequences 1,4,8] [--tokens 96] [--drafter none] [--gamma 0]
"""

import argparse
import time

import torch

from specdec.api import SpecDec
from specdec.config import SamplingParams, SpecConfig
from specdec.decoding.batching import Batch
from specdec.tasks.prompts import task_prompts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sequences", default="1,4,8")
    parser.add_argument("--tokens", type=int, default=96)
    parser.add_argument("--drafter", default="none")
    parser.add_argument("--gamma", default="0", help="an integer or auto")
    args = parser.parse_args()
    counts = [int(n) for n in args.sequences.split(",")]
    specdec = SpecDec("smollm2-135m", drafter=args.drafter)
    prompts = [specdec.encode(p.text) for p in task_prompts("chat", max(counts))]
    gamma = args.gamma if args.gamma == "auto" else int(args.gamma)
    print(f"smollm2-135m on {specdec.decoding.engine.target.path}, drafter {args.drafter}, gamma {gamma}, {args.tokens} tokens")
    for count in counts:
        batch = Batch(specdec.decoding.engine, max_batch=max(counts))
        start = time.perf_counter()
        members = [batch.add(p, SamplingParams(), SpecConfig(max_new_tokens=args.tokens, gamma=gamma))
                   for p in prompts[:count]]
        steps = 0
        with torch.inference_mode():
            while batch.members:
                batch.step()
                steps += 1
        seconds = time.perf_counter() - start
        batch.close()
        tokens = sum(len(m.tokens) for m in members)
        print(f"{count} sequences: {tokens / seconds:.1f} tok/s, {steps} steps, {seconds / steps * 1e3:.1f} ms a step")


if __name__ == "__main__":
    main()
