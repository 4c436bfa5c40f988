"""SHA-256 of files, for checkpoints' manifests and the GGUF conversion cache.

A leaf module (no rlkit imports): rlkit.models.gguf cannot import rlkit.checkpoint, which
imports rlkit.config, which imports rlkit.models.gguf.
"""

from __future__ import annotations

import hashlib
from pathlib import Path


def file_sha256(path: str | Path) -> str:
    """Hex SHA-256 of the file's bytes, read in 1 MiB blocks (a multi-GB checkpoint never sits in
    memory whole)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
