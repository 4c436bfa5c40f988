"""The documentation a user's clone gets is self-contained: no tracked file points to the
maintainers' `shared/` folder beside the repository, and every relative link in the Markdown
files and notebooks' Markdown cells names a file that is in the repository."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# Spelled in two parts so that this file does not match itself.
OUTSIDE_REFERENCES = ("../" + "shared", "shared" + "/spec")
LINK = re.compile(r"\]\(([^)\s]+)\)")


def tracked_files() -> list[Path]:
    try:
        listing = subprocess.run(
            ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True, text=True
        ).stdout
    except (OSError, subprocess.CalledProcessError) as error:
        pytest.skip(f"not a git checkout ({error}): no tracked files to check")
    return [ROOT / name for name in listing.split("\0") if name and (ROOT / name).is_file()]


def markdown_texts(path: Path) -> list[str]:
    """A Markdown file's text, or the sources of a notebook's Markdown cells."""
    if path.suffix == ".md":
        return [path.read_text(encoding="utf-8")]
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    return ["".join(cell["source"]) for cell in cells if cell["cell_type"] == "markdown"]


def test_no_tracked_file_points_outside_the_repository():
    offenders = [
        f"{path.relative_to(ROOT)}: {needle}"
        for path in tracked_files()
        for needle in OUTSIDE_REFERENCES
        if needle.encode() in path.read_bytes()
    ]
    assert not offenders, f"references to files outside the repository: {offenders}"


def test_relative_links_resolve_inside_the_repository():
    broken = []
    for path in tracked_files():
        if path.suffix not in (".md", ".ipynb"):
            continue
        for text in markdown_texts(path):
            for target in LINK.findall(text):
                if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
                    continue  # a URL or an anchor in the same page
                resolved = (path.parent / target.split("#")[0]).resolve()
                if not resolved.is_relative_to(ROOT) or not resolved.exists():
                    broken.append(f"{path.relative_to(ROOT)}: {target}")
    assert not broken, f"relative links to nothing in the repository: {broken}"
