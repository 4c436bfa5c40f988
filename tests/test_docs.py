"""The documentation a user's clone gets is self-contained: no tracked file points to the
maintainers' `shared/` folder beside the repository, and every relative link in the Markdown
files and notebooks' Markdown cells names a file that is in the repository, and its anchor
(``#…``), if it has one, a heading of that page. The README starts the user (issue 43): Learn,
Train and Reproduce in its first 40 lines, under 20 KB; the documentation site's nav (mkdocs.yml,
built by `make docs`) holds the README, every docs page and every notebook."""

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


def heading_anchors(path: Path) -> set[str]:
    """The anchors GitHub gives the headings of a Markdown file or notebook: the heading's text
    without its links' targets, lower-cased, punctuation other than ``-`` and ``_`` dropped,
    spaces as ``-``, and ``-1``, ``-2`` … after a repeated one. Headings inside code fences are
    code, not headings."""
    anchors, seen = set(), {}
    for text in markdown_texts(path):
        fenced = False
        for line in text.splitlines():
            if line.lstrip().startswith("```"):
                fenced = not fenced
            heading = None if fenced else re.match(r"#{1,6} +(.*?) *#* *$", line)
            if heading:
                words = re.sub(r"\[([^]]*)\]\([^)]*\)", r"\1", heading.group(1)).lower()
                slug = re.sub(r"[^\w\- ]", "", words).replace(" ", "-")
                anchors.add(f"{slug}-{seen[slug]}" if slug in seen else slug)
                seen[slug] = seen.get(slug, 0) + 1
    return anchors


def broken_links(paths: list[Path], root: Path) -> list[str]:
    """Each relative link in the Markdown of ``paths`` that names no file under ``root``, or an
    anchor (``#…``, in the same page or another Markdown file or notebook) that no heading
    there has, as ``file: target``."""
    broken = []
    for path in paths:
        if path.suffix not in (".md", ".ipynb"):
            continue
        for text in markdown_texts(path):
            for target in LINK.findall(text):
                if re.match(r"[a-z][a-z0-9+.-]*:", target):
                    continue  # a URL
                name, _, anchor = target.partition("#")
                resolved = (path.parent / name).resolve() if name else path
                if not resolved.is_relative_to(root) or not resolved.exists():
                    broken.append(f"{path.relative_to(root)}: {target}")
                elif (
                    anchor
                    and resolved.suffix in (".md", ".ipynb")
                    and anchor not in heading_anchors(resolved)
                ):
                    broken.append(f"{path.relative_to(root)}: {target} (no such heading)")
    return broken


def test_relative_links_resolve_inside_the_repository():
    broken = broken_links(tracked_files(), ROOT)
    assert not broken, f"relative links to nothing in the repository: {broken}"


def test_links_to_a_missing_file_or_heading_are_reported(tmp_path):
    (tmp_path / "other.md").write_text(
        "# Other page\n\n## Step 2 · the `prior` (EBPO)\n\n```\n# not a heading\n```\n## Again\n"
        "## Again\n",
        encoding="utf-8",
    )
    page = tmp_path / "page.md"
    good = ["other.md", "other.md#other-page", "other.md#step-2--the-prior-ebpo", "#page"]
    good += ["other.md#again-1", "https://example.org/x#y"]
    bad = ["missing.md", "other.md#no-such-heading", "#nowhere", "other.md#not-a-heading"]
    bad += ["other.md#again-2"]
    page.write_text(
        "# Page\n\n" + "\n".join(f"[link]({t})" for t in good + bad) + "\n", encoding="utf-8"
    )
    reported = [line.split(": ", 1)[1].split(" (")[0] for line in broken_links([page], tmp_path)]
    assert reported == bad


README = ROOT / "README.md"
# the lessons in reading order, as the README's Learn list links them: the file order
READING_ORDER = sorted(p.name[:2] for p in (ROOT / "notebooks").glob("*.ipynb"))


def readme_sections(lines: int = 40) -> dict[str, str]:
    """The README's ``## `` sections that start within its first ``lines`` lines, cut there."""
    head = "\n".join(README.read_text(encoding="utf-8").splitlines()[:lines])
    parts = re.split(r"^## +", head, flags=re.M)[1:]
    return {part.split("\n", 1)[0].strip(): part for part in parts}


def test_the_readme_starts_the_user_within_40_lines():
    sections = readme_sections()
    assert list(sections)[:3] == ["Learn", "Train", "Reproduce"], list(sections)
    learn, train, reproduce = sections["Learn"], sections["Train"], sections["Reproduce"]
    lessons = re.findall(r"\]\(notebooks/(\d\d)_[a-z0-9_]+\.ipynb(?:#[^)]*)?\)", learn)
    assert lessons == READING_ORDER
    assert set(lessons) == {p.name[:2] for p in (ROOT / "notebooks").glob("*.ipynb")}
    assert "](docs/glossary.md)" in learn
    assert re.search(r"rlkit train(\s|$)", train), "Train has no `rlkit train`"
    preset = re.search(r"rlkit train --config ([\w-]+)", train)
    assert preset and (ROOT / "rlkit" / "configs" / f"{preset.group(1)}.yaml").is_file()
    assert "rlkit plan --config" in train
    # the quick start's two commands, each doing all set-up on a fresh machine
    assert re.findall(r"^make (\w+)", reproduce, re.M) == ["demo", "test"]


def test_the_readme_is_under_20_kb_and_its_moved_parts_are_linked():
    text = README.read_text(encoding="utf-8")
    assert len(text.encode()) <= 20 * 1024, f"README.md is {len(text.encode())} bytes"
    for page in ("course", "demo", "results", "training", "runs", "benchmarks", "glossary"):
        assert f"](docs/{page}.md)" in text, f"the README does not link docs/{page}.md"


def test_the_docs_site_nav_holds_the_readme_every_page_and_every_notebook():
    config = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    nav = config.split("\nnav:\n", 1)[1]
    entries = re.findall(
        r"^\s+- (?:[^\n]*?: )?((?:docs|notebooks)/[^\s]+|README\.md)\s*$", nav, re.M
    )
    assert len(entries) == len(set(entries)), "a page is in the nav twice"
    pages = {"README.md"} | {f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")}
    pages |= {f"notebooks/{p.name}" for p in (ROOT / "notebooks").glob("*.ipynb")}
    pages |= {
        f"notebooks/results/{p.name}" for p in (ROOT / "notebooks" / "results").glob("*.ipynb")
    }
    assert set(entries) == pages
    assert re.search(r"^strict: true$", config, re.M), "mkdocs.yml must build strictly"
    assert "mkdocs build --strict" in (ROOT / "Makefile").read_text(encoding="utf-8")
    assert "make docs" in (ROOT / ".ci" / "run").read_text(encoding="utf-8")
