"""A batch of four generations (SmolLM2, `--drafter auto`, gamma=auto, 160 new tokens each) decoded with the
measured choice of drafting or not (specdec.batching.SpeculationChoice) against drafting within the row budget
always, alternately on the same prompts; decode tokens/s once every prompt is prefilled and has its first token.

    .venv/bin/python docs/results/zen2-epyc/batch_choice_ab.py [--temperature 0|1] [--rounds 3]
"""

import argparse
import time

from specdec import SpecDec
from specdec.batching import Batch
from specdec.config import SamplingParams, SpecConfig
from specdec.prompts import task_prompts


def decode_rate(sd: SpecDec, texts: list[str], temperature: float, measure: bool) -> float:
    batch = Batch(sd.engine, max_batch=4, row_budget=16, measure_choice=measure)
    members = [batch.add(sd.encode([{"role": "user", "content": text}]), SamplingParams(temperature=temperature),
                         SpecConfig(gamma="auto", max_new_tokens=160)) for text in texts]
    while any(m.stats.new_tokens == 0 and not m.done for m in members):
        batch.step()  # prefill and first tokens, not timed
    start, tokens = time.perf_counter(), 0
    while batch.members:
        tokens += sum(len(emitted) for _, emitted in batch.step())
    rate = tokens / (time.perf_counter() - start)
    batch.close()
    return rate


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    sd = SpecDec(target="smollm2-135m", drafter="auto")
    prompts = [p.text for task in ("chat", "code", "translate") for p in task_prompts(task, 4, seed=7)]
    rates: dict[bool, list[float]] = {True: [], False: []}
    for i in range(args.rounds):
        texts = prompts[4 * (i % 3): 4 * (i % 3) + 4]
        for measure in (True, False):
            rates[measure].append(decode_rate(sd, texts, args.temperature, measure))
    print(f"T = {args.temperature}, 4 generations a batch, decode tok/s")
    print("measured choice:", [round(r, 1) for r in rates[True]])
    print("always draft:   ", [round(r, 1) for r in rates[False]])
    print("paired ratio:   ", [round(a / b, 3) for a, b in zip(rates[True], rates[False])])


if __name__ == "__main__":
    main()
