"""What a bench row was measured on: the CPU (its model name and the instructions that decide the path),
the commit of the code, the date. `specdec bench --report` groups rows by CPU kind with these."""

from __future__ import annotations

import datetime
import subprocess
from functools import cache
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from ..modeling.extension import cpu_flags, cpuinfo_field

ISA = (("amx_int8", "AMX-INT8"), ("amx_bf16", "AMX-BF16"), ("avx512_vnni", "AVX-512 VNNI"),
       ("avx512_bf16", "AVX-512 BF16"), ("avx2", "AVX2"))
"""The CPU flags the compute paths choose on, as the report names them (AVX2 only where no AVX-512 is)."""


def cpu_kind(model_name: str | None = None, flags: set[str] | None = None) -> str:
    """e.g. "AMD EPYC (AVX-512 VNNI, AVX-512 BF16)" or "Intel Xeon (AMX-INT8, AMX-BF16, AVX-512 VNNI, ...)"."""
    name = model_name if model_name is not None else _model_name()
    flags = cpu_flags() if flags is None else flags
    named = [label for flag, label in ISA if flag in flags]
    if any(label.startswith(("AVX-512", "AMX")) for label in named):
        named = [label for label in named if label != "AVX2"]
    return f"{name} ({', '.join(named) or 'no AVX2'})"


def _model_name() -> str:
    return " ".join((cpuinfo_field("model name") or "unknown CPU").split())


@cache
def commit() -> str:
    """The git commit of the code measured (`+changes` where the tree differs from it), or the version where
    specdec is not run from a checkout."""
    root = Path(__file__).resolve().parents[2]
    try:
        release = f"specdec {version('specdec')}"
    except PackageNotFoundError:
        release = "specdec (not installed)"
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=10, check=True).stdout.strip()
        changed = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no", "specdec"],
                                 capture_output=True, text=True, timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return release
    return head + ("+changes" if changed else "") if head else release


def stamp() -> dict:
    """The fields every bench row carries: cpu, commit, date (UTC)."""
    return {"cpu": cpu_kind(), "commit": commit(),
            "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d")}
