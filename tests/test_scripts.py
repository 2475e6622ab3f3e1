"""The measurement scripts start: each answers --help, and bench_step runs end to end on a tiny target
(they are not benchmarks here, only proof that they still fit the code they measure)."""

import subprocess
import sys
from pathlib import Path

import pytest

from helpers import save_tiny_model

SCRIPTS = Path(__file__).parent.parent / "scripts"


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("script", sorted(p.name for p in SCRIPTS.glob("*.py")))
def test_each_script_answers_help(script):
    done = run(str(SCRIPTS / script), "--help")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage:"), done.stdout


def test_each_script_is_listed_in_the_readme():
    readme = (SCRIPTS / "README.md").read_text()
    scripts = sorted(p.name for p in SCRIPTS.iterdir() if p.suffix in (".py", ".sh"))
    assert len(scripts) <= 8, scripts
    assert [s for s in scripts if f"`{s}`" not in readme] == []


def test_bench_step_runs_on_a_tiny_target(tmp_path):
    target = save_tiny_model(tmp_path / "target", max_positions=512)
    done = run(str(SCRIPTS / "bench_step.py"), "--target", str(target), "--repeats", "1", "--rows", "1,2",
               "--prefill", "16", "--no-plain")
    assert done.returncode == 0, done.stderr
    assert "v=1.00" in done.stdout and "tokens/s" in done.stdout, done.stdout


def test_bench_step_runs_on_a_gguf_file(tmp_path):
    """A .gguf target (the user-scale models docs/benchmarks.md measures) runs on its blocks' paths."""
    from specdec.bench.gguf_models import Shape, write_random
    from specdec.modeling import quant

    if quant.load() is None:
        pytest.skip(f"quant.cpp does not run here: {quant.unavailable_reason()}")
    target = write_random(tmp_path / "tiny.gguf", kind="Q8_0", vocab=600,
                          shape=Shape(hidden=256, layers=2, heads=4, kv_heads=2, ffn=512))
    done = run(str(SCRIPTS / "bench_step.py"), "--target", str(target), "--repeats", "1", "--rows", "1,2",
               "--prefill", "16")
    assert done.returncode == 0, done.stderr
    assert "gguf-int8 avx2" in done.stdout and "v=1.00" in done.stdout and "tokens/s" in done.stdout, done.stdout
