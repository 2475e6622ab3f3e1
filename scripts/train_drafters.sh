#!/usr/bin/env bash
# Reproduces the trained-drafter results in the README: the self-distillation data (cached after the
# first run: the task mix, ~41 min, and 900 everyday chat questions answered at length, ~23 min),
# an EAGLE head (the shipped drafter), Medusa heads, three draft-LM sizes, and one bench over all of
# them with prompt lookup beside them. About 64 min of data, 62 min of training and 20 min of
# benchmark on this project's 2-core machine.
# (The shipped drafter and the README's draft-size table came from this script at commit e63e3a1,
# before the chat data and the current training recipe.)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-drafters}
S=.venv/bin/specdec
DATA="--chat-prompts 900"
$S train-drafter --kind eagle --out "$OUT/eagle" --minutes 30 $DATA --overwrite
$S train-drafter --kind medusa --out "$OUT/medusa" --minutes 8 $DATA --overwrite
for size in s m l; do
  $S train-drafter --kind draft-lm --size "$size" --out "$OUT/lm-$size" --minutes 8 $DATA --overwrite
done
$S bench --drafter "$OUT/eagle" --drafter "$OUT/medusa" --drafter "$OUT/lm-s" --drafter "$OUT/lm-m" \
  --drafter "$OUT/lm-l" --drafter prompt-lookup --gammas 4,auto --temperatures 0,1 --prompts-per-task 3 \
  --max-new-tokens 128 --no-peers --out docs/results/bench-trained
