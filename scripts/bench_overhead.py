"""The host-side time of a decoding round outside the compiled kernels: Python, small ATen ops, the
sampler, the drafter's bookkeeping and the gamma policy — what a round costs beyond the weights it
reads. Every callable of the loaded extension modules (quant.cpp, rowops.cpp, kernels.cpp) is timed
where it is called; the rest of a generation's wall time, over its target calls, is the overhead.

    .venv/bin/python scripts/bench_overhead.py [--runs 5] [--tokens 128]

One line per configuration: median overhead per target call (min-max over the runs), the kernels'
time per call, and tokens/s. Compare two checkouts by running it with PYTHONPATH=OTHER_CHECKOUT too
(alternately: the host's speed drifts); the overhead column hardly depends on the memory speed the
kernels see, so it compares across runs better than tokens/s.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time
from types import ModuleType

import specdec
from specdec import SpecDec
from specdec.modeling import kernels, quant, rowops
from specdec.tasks.prompts import task_prompts

CONFIGS = [  # (label, drafter, temperature, seed, task)
    ("plain T=0", "none", 0.0, None, "chat"),
    ("plain T=1 seeded", "none", 1.0, 1, "chat"),
    ("plain T=1", "none", 1.0, None, "chat"),
    ("auto T=0 chat", "auto", 0.0, None, "chat"),
    ("auto T=0 code-edit", "auto", 0.0, None, "code-edit"),
    ("trained T=0 chat", "trained", 0.0, None, "chat"),
    ("trained T=1 chat", "trained", 1.0, None, "chat"),
    ("trained T=1 chat seeded", "trained", 1.0, 1, "chat"),
    ("trained-tree T=0 chat", "trained-tree", 0.0, None, "chat"),
]


class KernelClock:
    """Seconds spent inside the extension modules' functions since the last reset."""

    def __init__(self, modules: list[ModuleType]):
        self.seconds = 0.0
        for module in modules:
            for name in dir(module):
                value = getattr(module, name)
                if not name.startswith("_") and callable(value) and not isinstance(value, type):
                    setattr(module, name, self._timed(value))

    def _timed(self, function):
        @functools.wraps(function)
        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - start
        return timed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--only", default=None, help="run only the configurations whose label contains this")
    args = parser.parse_args()
    engines: dict[str, SpecDec] = {}
    clock = None
    print(specdec.__file__)
    for label, drafter, temperature, seed, task in CONFIGS:
        if args.only and args.only not in label:
            continue
        if drafter not in engines:
            engines[drafter] = SpecDec(target="smollm2-135m", drafter=drafter)
        if clock is None:  # after the first load: the extensions are built and loaded by then
            clock = KernelClock([m for m in (quant.load(), rowops.load(), kernels.load()) if m is not None])
        sd = engines[drafter]
        prompt = task_prompts(task, 1, seed=0)[0].text
        sd.generate(prompt, max_new_tokens=16, temperature=temperature, seed=seed)  # warm-up
        overheads, kernel_ms, rates = [], [], []
        for _ in range(args.runs):
            clock.seconds = 0.0
            start = time.perf_counter()
            result = sd.generate(prompt, max_new_tokens=args.tokens, temperature=temperature, seed=seed)
            wall = time.perf_counter() - start
            calls = result.stats.target_calls
            overheads.append((wall - clock.seconds) / calls * 1e3)
            kernel_ms.append(clock.seconds / calls * 1e3)
            rates.append(result.stats.new_tokens / wall)
        print(f"{label:26s} overhead {statistics.median(overheads):.3f} ms a call ({min(overheads):.3f}-{max(overheads):.3f})"
              f" | kernels {statistics.median(kernel_ms):.2f} ms a call | {statistics.median(rates):.1f} tok/s"
              f" | calls {result.stats.target_calls} tau {result.stats.tau:.2f}", flush=True)


if __name__ == "__main__":
    main()
