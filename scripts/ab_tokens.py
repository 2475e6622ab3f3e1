"""Tokens/s of plain decoding (an open-chat prompt, 5 generations) and of the default drafter (3
code-editing prompts, twice each), medians, in one line: run it alternately against two checkouts to
compare them on one host, whose speed drifts between minutes, e.g.

    for i in 1 2 3 4 5; do
        PYTHONPATH=OLD_CHECKOUT .venv/bin/python scripts/ab_tokens.py; .venv/bin/python scripts/ab_tokens.py
    done

(PYTHONPATH puts the other checkout's specdec before the installed one; each builds its own kernels.)
"""

import statistics

import specdec
from specdec import SpecDec
from specdec.prompts import task_prompts


def main() -> None:
    plain = SpecDec(target="smollm2-135m", drafter="none")
    auto = SpecDec(target="smollm2-135m", drafter="auto")
    edits = [p.text for p in task_prompts("code-edit", 3, seed=0)]
    chat = task_prompts("chat", 1, seed=0)[0].text
    plain.generate(chat, max_new_tokens=16)  # warm-up
    auto.generate(edits[0], max_new_tokens=16)
    a = [plain.generate(chat, max_new_tokens=128).stats.tokens_per_second for _ in range(5)]
    b = [auto.generate(p, max_new_tokens=128).stats.tokens_per_second for p in edits for _ in range(2)]
    print(f"{specdec.__file__}: plain {statistics.median(a):.0f} tok/s, auto on code-edit {statistics.median(b):.0f} tok/s")


if __name__ == "__main__":
    main()
