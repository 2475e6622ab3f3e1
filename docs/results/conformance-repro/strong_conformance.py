"""Rerun the trained kinds' conformance check (tests/test_trained.py) with more samples, seed after seed.

A CI run failed test_specdec_verify_passes_each_kind[medusa] (quick settings, gamma = auto) on its
bonus-token PIT (p = 7.8e-5, N = 199). This asks whether that was the check's 1e-3 false alarm or a
law that is off: 3000 short runs and 40 long runs a seed (bonus tokens up to ~660), seeds 1 000 003
apart so that no two runs share a generation.

    python docs/results/conformance-repro/strong_conformance.py medusa 3 0 5      # kind, gamma, seeds
    python docs/results/conformance-repro/strong_conformance.py medusa auto 0 6
"""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tests"))

from test_trained import MC_PROMPT, MC_VOCAB, random_drafter  # noqa: E402

from helpers import tiny_llama  # noqa: E402
from specdec.backends import LeanBackend  # noqa: E402
from specdec.config import SamplingParams  # noqa: E402
from specdec.conformance import Settings, run_conformance  # noqa: E402
from specdec.engine import SpeculativeEngine  # noqa: E402

kind, gamma = sys.argv[1], sys.argv[2] if sys.argv[2] == "auto" else int(sys.argv[2])
target = tiny_llama(MC_VOCAB, layers=2, seed=10, init=0.15)
backend = LeanBackend(target)
plain = SpeculativeEngine(backend, None)
spec = SpeculativeEngine(backend, random_drafter(kind, target, torch.tensor([0, 1, 3, 4]), seed=3))
settings = Settings(samples=3000, long_runs=40, long_tokens=48, bonus_rescores=1500, parity_tokens=48, parity_seeds=3)
for s in range(int(sys.argv[3]), int(sys.argv[4])):
    report = run_conformance("tiny", torch.float32, plain, spec, backend, [MC_PROMPT],
                             SamplingParams(temperature=0.7, top_p=0.9), gamma, settings, seed=s * 1_000_003)
    tests = [(t.name[:30], t.samples, round(t.p_value, 5)) for c in report.checks for t in c.tests]
    print(s, report.passed, tests, flush=True)
