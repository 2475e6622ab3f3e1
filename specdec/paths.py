"""Where specdec keeps what it makes once and reuses: converted models, built kernels, training data."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """SPECDEC_CACHE, default ~/.cache/specdec."""
    return Path(os.environ.get("SPECDEC_CACHE", Path.home() / ".cache" / "specdec"))
