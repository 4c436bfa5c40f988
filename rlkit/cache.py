"""Where rlkit keeps what it builds once and reuses: the tiny model, deduplicated datasets."""

from __future__ import annotations

import os
from pathlib import Path

from rlkit.paths import check_dir


def default_cache_dir() -> Path:
    """``$RLKIT_CACHE``, else (unset or empty) ``~/.cache/rlkit``: a directory, or a path where
    one can be made; a ValueError names ``RLKIT_CACHE`` when it cannot be (a file, under a file,
    a broken symlink, read-only)."""
    value = os.environ.get("RLKIT_CACHE")
    path = Path(value) if value else Path.home() / ".cache" / "rlkit"
    check_dir("RLKIT_CACHE" if value else "RLKIT_CACHE (unset: its default)", path)
    return path
