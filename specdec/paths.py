"""Where specdec keeps what it makes once and reuses: converted models, built kernels, training data."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def cache_dir() -> Path:
    """SPECDEC_CACHE, default ~/.cache/specdec."""
    return Path(os.environ.get("SPECDEC_CACHE", Path.home() / ".cache" / "specdec"))


@contextmanager
def locked(entry: Path) -> Iterator[None]:
    """Holds an exclusive lock beside a cache entry (`entry`.lock) while it is made, so that processes
    sharing the cache (two servers, parallel test workers) make it once and never read it
    half-written. Where the OS has no flock (not POSIX) or the cache is read-only, it does nothing."""
    try:
        import fcntl

        entry.parent.mkdir(parents=True, exist_ok=True)
        handle = open(entry.with_name(entry.name + ".lock"), "a")
    except (ImportError, OSError):
        yield
        return
    with handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
