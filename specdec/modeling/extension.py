"""Builds a C++ source of this package into a Python module once per machine, and loads it.

The build (torch.utils.cpp_extension with ninja and the system C++ compiler, 20-40 s on 2 cores) is
cached under the specdec cache (SPECDEC_CACHE, default ~/.cache/specdec)/kernels, keyed by the
source (its text and place), torch (its version and place), Python and the CPU's flags, so later processes
load it in well under a second. Where
it cannot be built or `supported()` says the CPU lacks what the source needs, `load()` returns None
and `reason` says why; callers then run ATen. Its users: kernels.py (AVX-512 BF16), quant.py (GGUF blocks, AVX2) and
rowops.py (float32 norms, RoPE and attention, AVX2).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import platform
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import torch

from ..paths import cache_dir

try:
    import fcntl
except ImportError:  # not POSIX: no build lock of ours
    fcntl = None


def cpuinfo_field(name: str) -> str | None:
    """The first CPU's `name` line of /proc/cpuinfo ("flags", "model name"), or None where there is none."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(name):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def cpu_flags() -> set[str]:
    return set((cpuinfo_field("flags") or "").split())


@contextlib.contextmanager
def build_lock(build_dir: Path, name: str):
    """Holds the build directory against other processes while one builds or loads it. torch's own lock is a
    file that its builder deletes when done, so a build killed midway (Ctrl-C, a timeout) left it behind and
    every later process waited on it forever, saying nothing. This lock is an flock, which the kernel
    releases when its holder dies; under it no other specdec process is building, so a torch lock still
    there is such a leftover and is removed."""
    if fcntl is None:
        yield
        return
    with open(build_dir / "specdec.lock", "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"specdec: waiting for another process building {name} ...", file=sys.stderr, flush=True)
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            (build_dir / "lock").unlink(missing_ok=True)
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


class Extension:
    """A C++ source (and the sources it is linked with), built on first load(). `needs` names the CPU in the
    reasons it gives; `configure`, where given, sets the module up once it has loaded."""

    def __init__(self, source: Path, needs: str, off_variable: str, fallback: str, others: tuple[Path, ...] = (),
                 configure: Callable[[ModuleType], None] | None = None):
        self.source = source
        self.configure = configure
        self.sources = (source, *others)
        self.needs = needs
        self.off_variable = off_variable
        self.fallback = fallback
        self.module: ModuleType | None = None
        self.reason: str | None = None
        self._tried = False

    def _key(self) -> str:
        digest = hashlib.sha256()
        headers = [path.read_bytes() for path in sorted(self.source.parent.rglob("*.h"))]  # what sources include
        # torch's location too: the build's include paths name it, and ninja rebuilds when a command changes,
        # so two environments sharing the cache (a CI clone's and the user's) rebuilt over each other's build
        for part in (*(path.read_bytes() for path in self.sources), *headers, torch.__version__.encode(), sys.version.encode(),
                     " ".join(sorted(cpu_flags())).encode(), str(Path(torch.__file__).resolve().parent).encode(),
                     str(self.source.resolve()).encode()):
            digest.update(part)
        return digest.hexdigest()[:12]

    def build_dir(self) -> Path:
        """Where this machine's build of the source is cached."""
        return cache_dir() / "kernels" / f"{self.source.stem}-{self._key()}"

    def load(self) -> ModuleType | None:
        """The compiled module, building it on first use; None where it cannot run here."""
        if self._tried:
            return self.module
        self._tried = True
        if os.environ.get(self.off_variable, "1") == "0":
            self.reason = f"turned off by {self.off_variable}=0"
            return None
        if platform.machine() not in ("x86_64", "AMD64"):
            self.reason = f"{self.source.name} needs an x86-64 CPU with {self.needs}, this is {platform.machine()}"
            return None
        build_dir = self.build_dir()
        stem, key = build_dir.name.rsplit("-", 1)
        try:
            build_dir.mkdir(parents=True, exist_ok=True)
            try:  # torch looks for the ninja executable on PATH; the pip package keeps it beside Python
                import ninja

                os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + os.environ.get("PATH", "")
            except ImportError:
                pass
            from torch.utils.cpp_extension import load as build

            with build_lock(build_dir, self.source.name):
                if not any(build_dir.glob("*.so")):
                    print(f"specdec: building {self.source.name} once for this machine (~30 s) ...", file=sys.stderr,
                          flush=True)
                module = build(name=f"specdec_{stem}_{key}", sources=[str(path) for path in self.sources],
                               build_directory=str(build_dir),
                               extra_cflags=["-O3", "-fopenmp"], extra_ldflags=["-fopenmp"], verbose=False)
        except Exception as error:  # a missing compiler or headers: fall back, and say why
            detail = str(error).strip().splitlines()[-1] if str(error).strip() else repr(error)
            self.reason = (f"could not build {self.source.name} ({detail}); it needs a C++ compiler (g++) "
                           "and Python's headers")
            warnings.warn(f"specdec: {self.reason}. {self.fallback}", stacklevel=3)
            return None
        if not module.supported():
            self.reason = f"this CPU lacks {self.needs}"
            return None
        if self.configure is not None:
            self.configure(module)
        self.module = module
        return module
