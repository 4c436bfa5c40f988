"""Where rlkit keeps what it builds once and reuses: the tiny model, deduplicated datasets."""

from __future__ import annotations

import os
from pathlib import Path


def default_cache_dir() -> Path:
    """``$RLKIT_CACHE``, else ``~/.cache/rlkit``."""
    return Path(os.environ.get("RLKIT_CACHE", Path.home() / ".cache" / "rlkit"))
