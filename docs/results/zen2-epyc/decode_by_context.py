"""Plain decoding's time a step after prompts of several lengths (the start of man pages, as plain text),
the built-in SmolLM2 on the default path: median ms a step over 3 generations of 48 tokens. Compare two
checkouts by running it alternately with PYTHONPATH=OTHER_CHECKOUT.

    .venv/bin/python docs/results/zen2-epyc/decode_by_context.py
"""

import statistics

import specdec
from specdec import SpecDec, corpus


def main() -> None:
    sd = SpecDec(target="smollm2-135m", drafter="none")
    ids = sd.tokenizer(" ".join(text for _, text in corpus.man_pages(40, seed=1)))["input_ids"]
    print(specdec.__file__)
    for n in (400, 1500, 3000):
        prompt = sd.tokenizer.decode(ids[:n])
        steps = []
        for _ in range(3):
            stats = sd.generate(prompt, max_new_tokens=48, chat=False).stats
            steps.append(stats.decode_seconds / max(1, stats.target_calls))
        print(f"{n} prompt tokens: {statistics.median(steps) * 1e3:.2f} ms a step ({stats.path})")


if __name__ == "__main__":
    main()
