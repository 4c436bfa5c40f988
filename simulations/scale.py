"""The notebooks' two scales, and where a run at the reduced one may write.

Every notebook reads ``RLKIT_NB_SCALE``: unset (or ``full``) is the scale its committed outputs
come from; ``ci`` (``make test``) runs a miniature. At the miniature scale each figure and run
directory goes to a temporary folder of the kernel's own instead of the notebook's folder, so a test
run never overwrites a committed full-scale figure or a full-scale run under ``notebooks/runs/``,
and two test runs at once never share a directory.
"""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import tempfile
from pathlib import Path


def ci_scale() -> bool:
    """Whether this process runs the notebooks' reduced CI scale (``RLKIT_NB_SCALE=ci``)."""
    return os.environ.get("RLKIT_NB_SCALE") == "ci"


@functools.cache
def _ci_root() -> Path:
    """This process's temporary folder for CI-scale output, removed when the process exits."""
    root = Path(tempfile.mkdtemp(prefix="rlkit-nb-ci-"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    return root


def output_dir(path: str | Path) -> Path:
    """Where a notebook writes what it calls ``path`` (relative to the notebook's folder):
    ``path`` itself at full scale, the same relative path in a temporary folder at CI scale."""
    path = Path(path)
    if path.is_absolute():
        raise ValueError(f"output_dir takes a path relative to the notebook, got {path}")
    return _ci_root() / path if ci_scale() else path
