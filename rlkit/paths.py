"""Paths a user names (``output_dir``, ``RLKIT_CACHE``, ``--out``, ``--readme`` …), checked before
they are used: a ValueError naming the setting and the path, not an OSError traceback.

A leaf module (no rlkit imports), so that rlkit.config and rlkit.cache can both use it.

- :func:`check_link`: neither the path nor a folder above it is a symlink that cannot be
  followed (a loop, or a link to nothing): ``Path.exists()`` is False for both, so a check
  that relies on it lets them through to a confusing ``mkdir`` error.
- :func:`check_dir`: a directory that exists or can be made (and written).
- :func:`check_file`: a file that can be written.
- :func:`check_exists`: a folder or a file to read.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

# what os.stat says of a symlink whose target is missing
_MISSING = (errno.ENOENT, errno.ENOTDIR)


def _broken_link(path: Path) -> tuple[Path, str] | None:
    """The nearest of ``path`` and the folders above it that is a symlink which cannot be
    followed, with what is wrong with it; None when there is none."""
    for candidate in (path, *path.parents):
        if not candidate.is_symlink():  # (False below a broken link too: lstat fails there)
            continue
        try:
            candidate.stat()
        except OSError as err:
            if err.errno == errno.ELOOP:
                return candidate, "a symlink loop"
            if err.errno in _MISSING:
                target = os.readlink(candidate)
                return candidate, f"a dangling symlink (to {target}, which does not exist)"
    return None


def check_link(key: str, path: str | Path) -> None:
    """``path`` can be followed: neither it nor a folder above it is a symlink loop or a
    dangling symlink. A ValueError names ``key``, the path and the link."""
    path = Path(path)
    broken = _broken_link(path)
    if broken is None:
        return
    link, what = broken
    where = f"is {what}" if link == path else f"is under {link}, {what}"
    raise ValueError(f"{key} {path} {where}: fix or remove the link, or choose another {key}")


def _check_nearest_folder(key: str, path: Path, start: Path) -> None:
    """The nearest existing of ``start`` and the folders above it is a folder this process may
    write in: what creating ``path`` needs."""
    existing = next(p for p in (start, *start.parents) if p.exists())
    if not existing.is_dir():
        raise ValueError(f"{key} {path} is under {existing}, which is a file")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ValueError(f"{key} {path} is not writable ({existing} is read-only)")


def check_dir(key: str, path: str | Path) -> None:
    """``path`` is a directory or can be made one: no broken symlink on the way, not a file, not
    under a file, and in a folder this process may write. A ValueError names ``key`` and the
    path."""
    path = Path(path)
    check_link(key, path)
    if path.exists() and not path.is_dir():
        raise ValueError(f"{key} {path} is a file, not a directory")
    _check_nearest_folder(key, path, path)


def check_file(key: str, path: str | Path) -> None:
    """``path`` can be written as a file: no broken symlink on the way, not a directory, and its
    folder exists or can be made in a writable one. A ValueError names ``key`` and the path."""
    path = Path(path)
    check_link(key, path)
    if path.is_dir():
        raise ValueError(f"{key} {path} is a directory: name a file")
    _check_nearest_folder(key, path, path.parent)


def check_exists(key: str, path: str | Path, folder: bool) -> None:
    """``path`` exists, as a folder (``folder``) or a file, and can be followed. A ValueError
    names ``key``, the path and what it is instead."""
    path = Path(path)
    check_link(key, path)
    if not path.exists():
        raise ValueError(f"{key} {path} does not exist")
    if folder and not path.is_dir():
        raise ValueError(f"{key} {path} is a file, not a directory")
    if not folder and path.is_dir():
        raise ValueError(f"{key} {path} is a directory, not a file")
