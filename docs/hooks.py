"""mkdocs hooks (mkdocs.yml): the documentation site mirrors the repository.

README.md is the home page, docs/*.md keep their place under docs/ and notebooks/*.ipynb theirs
under notebooks/ (rendered by mkdocs-jupyter), so a relative link written for GitHub, in the
README, a docs page or a notebook's Markdown, names the same file on the site. Every other
repository file such a link names (a figure, benchmarks/README.md, a module's source) is copied
into the site at its own path, and its links are followed in turn when it is a page.

mkdocs checks the links of Markdown pages itself; a notebook's HTML comes from nbconvert, past
mkdocs' checks, so :func:`on_page_content` points its relative links at the site's pages and
reports (as a warning, which ``mkdocs build --strict`` turns into a failure) any that names no
file of the site. After the build, the MathJax copy that the ``docs`` extra installs
(django-static-mathjax, MathJax 3's ``es5`` build, no Django needed) goes to
``site/assets/mathjax/`` so that math is typeset offline.
"""

from __future__ import annotations

import html as html_lib
import logging
import posixpath
import re
import shutil
from importlib import resources
from pathlib import Path

from mkdocs.plugins import event_priority
from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parent.parent
LINK = re.compile(r"\]\(([^)\s]+)\)")  # a Markdown link's or image's target
HEADING = re.compile(r'(<h[1-6] id="([^"]+)">)(.*?)(</h[1-6]>)', re.S)
HREF = re.compile(r"""(\b(?:href|src)=)(["'])([^"']*)\2""")
URL = re.compile(r"[a-z][a-z0-9+.-]*:", re.I)  # http:, mailto:, data: …
MATHJAX = "assets/mathjax"
log = logging.getLogger("mkdocs.hooks.rlkit")


def _texts(path: Path) -> list[str]:
    """The Markdown of a page, or of a notebook's Markdown cells."""
    if path.suffix == ".md":
        return [path.read_text(encoding="utf-8")]
    if path.suffix == ".ipynb":
        import json

        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        return ["".join(cell["source"]) for cell in cells if cell["cell_type"] == "markdown"]
    return []


def _linked(uri: str) -> list[str]:
    """Repository paths (relative to ROOT, ``/``-separated) of the files the page at ``uri``
    links to that exist; links to nothing are left to mkdocs' and the tests' checks."""
    found = []
    for text in _texts(ROOT / uri):
        for target in LINK.findall(text):
            name = target.split("#", 1)[0]
            if not name or URL.match(name) or name.startswith("/"):
                continue
            resolved = posixpath.normpath(posixpath.join(posixpath.dirname(uri), name))
            if not resolved.startswith("../") and (ROOT / resolved).is_file():
                found.append(resolved)
    return found


@event_priority(100)  # before mkdocs-jupyter's on_files, which wraps the notebooks
def on_files(files: Files, config) -> Files:
    docs = Path(config.docs_dir).resolve()
    ours = [f for f in files if f.src_dir and Path(f.src_dir).resolve() == docs]
    site = Files([f for f in files if f not in ours])  # the theme's assets, as they are
    uris = ["README.md"] + [f"docs/{f.src_uri}" for f in ours if not f.inclusion.is_excluded()]
    notebooks = sorted((ROOT / "notebooks").glob("*.ipynb")) + sorted(
        (ROOT / "notebooks" / "results").glob("*.ipynb")
    )
    uris += [p.relative_to(ROOT).as_posix() for p in notebooks]
    seen = set()
    while uris:
        uri = uris.pop(0)
        if uri in seen:
            continue
        seen.add(uri)
        site.append(File(uri, str(ROOT), config.site_dir, config.use_directory_urls))
        uris.extend(_linked(uri))
    return site


def on_page_content(html: str, page, config, files: Files) -> str:
    """A notebook's links to repository files, pointed at their pages and copies on the site."""
    if not page.file.src_uri.endswith(".ipynb"):
        return html
    here = posixpath.dirname(page.file.src_uri)

    def point(match: re.Match) -> str:
        target = match.group(3)
        name, hash_, anchor = target.partition("#")
        if not name or URL.match(name) or name.startswith("/"):
            return match.group(0)
        uri = posixpath.normpath(posixpath.join(here, name))
        file = files.get_file_from_path(uri)
        if file is None:
            log.warning(f"{page.file.src_uri} links to '{target}', which is not in the site")
            return match.group(0)
        url = file.url_relative_to(page.file) + hash_ + anchor
        return f"{match.group(1)}{match.group(2)}{url}{match.group(2)}"

    return HEADING.sub(_github_anchor, HREF.sub(point, html))


def _github_anchor(match: re.Match) -> str:
    """A notebook heading with GitHub's anchor for it too (``part-2--one-run``, where mkdocs
    writes ``part-2-one-run``), so that a link written for GitHub lands on it."""
    text = html_lib.unescape(re.sub(r"<[^>]*>", "", match.group(3))).replace("¶", "")
    slug = re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")
    if not slug or slug == match.group(2):
        return match.group(0)
    return f'{match.group(1)}<a id="{slug}"></a>{match.group(3)}{match.group(4)}'


def on_post_build(config) -> None:
    """MathJax, from the installed django-static-mathjax, into the site."""
    source = resources.files("mathjax") / "static" / "mathjax" / "es5"
    out = Path(config.site_dir) / MATHJAX
    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(str(source), out, ignore=shutil.ignore_patterns("sre", "*.map"))
