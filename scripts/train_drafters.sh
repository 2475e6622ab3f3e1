#!/usr/bin/env bash
# Reproduces the trained-drafter results in the README: the self-distillation data (cached after the
# first run), an EAGLE head (the shipped drafter), Medusa heads, three draft-LM sizes, and one bench
# over all of them with prompt lookup beside them. About 40 min of data, 62 min of training and
# 20 min of benchmark on this project's 2-core machine.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-drafters}
S=.venv/bin/specdec
$S train-drafter --kind eagle --out "$OUT/eagle" --minutes 30 --overwrite
$S train-drafter --kind medusa --out "$OUT/medusa" --minutes 8 --overwrite
for size in s m l; do
  $S train-drafter --kind draft-lm --size "$size" --out "$OUT/lm-$size" --minutes 8 --overwrite
done
$S bench --drafter "$OUT/eagle" --drafter "$OUT/medusa" --drafter "$OUT/lm-s" --drafter "$OUT/lm-m" \
  --drafter "$OUT/lm-l" --drafter prompt-lookup --gammas 4,auto --temperatures 0,1 --prompts-per-task 3 \
  --max-new-tokens 128 --no-peers --out docs/results/bench-trained
