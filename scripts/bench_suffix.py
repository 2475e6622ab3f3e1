"""The suffix drafter's history across requests (docs/results.md): each chat question is answered
plainly, then by `--drafter suffix` (the history holds earlier questions' answers only), then asked
again (the history holds this answer). Greedy, 128 new tokens, speedup = tokens/s over the plain
run of the same question.

    .venv/bin/python scripts/bench_suffix.py [--questions 4]
"""

import argparse
import statistics

from specdec import SpecDec
from specdec.prompts import CHAT_QUESTIONS

parser = argparse.ArgumentParser()
parser.add_argument("--questions", type=int, default=4)
args = parser.parse_args()

sd = SpecDec(drafter="suffix")
sd.generate("hi", max_new_tokens=8)
sd.generate("hi", max_new_tokens=4, gamma=0)
rows = []
for question in CHAT_QUESTIONS[: args.questions]:
    plain = sd.generate(question, max_new_tokens=128, gamma=0)
    first = sd.generate(question, max_new_tokens=128)
    again = sd.generate(question, max_new_tokens=128)
    assert first.token_ids == plain.token_ids == again.token_ids  # greedy: the same answer every time
    base = plain.stats.tokens_per_second
    rows.append((first.stats.tokens_per_second / base, again.stats.tokens_per_second / base, again.stats.tau))
    print(f"{question[:48]!r}: first {rows[-1][0]:.2f}x, asked again {rows[-1][1]:.2f}x (tau {rows[-1][2]:.2f})",
          flush=True)
print(f"median: first {statistics.median(r[0] for r in rows):.2f}x, asked again {statistics.median(r[1] for r in rows):.2f}x")
