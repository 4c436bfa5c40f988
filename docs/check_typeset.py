"""Check, in a headless browser, that the math a reader sees is typeset.

    python docs/check_typeset.py site                       # every page of the built docs site
    python docs/check_typeset.py --lab notebooks/*.ipynb    # each notebook opened in JupyterLab
    python docs/check_typeset.py site --shots /tmp/shots    # and a screenshot of each page

`make docs-typeset` runs both on every page and lesson. ``--lab`` starts JupyterLab on a free
local port, without a token, its settings and workspaces in a temporary folder (every cell
rendered, not only those in view), and stops it at the end. Chromium loads
each page and runs its JavaScript (MathJax, in the site and in JupyterLab) for ``--budget``
milliseconds of virtual time, then dumps the page as the reader's browser holds it. A page
passes when it holds typeset math (MathJax's ``mjx-container`` elements) wherever its source
has math, and no raw TeX is left in its visible text, outside code: no ``$…$`` or ``\\(…\\)``
pair and no ``_{``/``^{``. The source has math when its Markdown holds a ``$`` pair (what
tests/test_math_typeset.py requires of every formula). Each failure names the page and the first
raw fragments; the exit status is 1 when a page fails.

This needs Chromium (Debian's ``chromium`` package), which CI's machines do not have: it is run
by hand, not by ``make test`` (tests/test_math_typeset.py checks the sources in every run).
"""

from __future__ import annotations

import argparse
import contextlib
import html.parser
import json
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

SKIPPED = {"code", "pre", "script", "style", "mjx-container", "textarea", "kbd"}
# code blocks (Pygments', CodeMirror's, and the hidden copy of each code cell the site's copy
# button reads), and JupyterLab's table of contents, a closed side panel whose entries show each
# heading's source
SKIPPED_CLASSES = {"highlight", "highlight-ipynb", "clipboard-copy-txt", "cm-editor", "cm-content"}
SKIPPED_CLASSES |= {"jp-TableOfContents-tree"}
# elements with no end tag: they neither open nor close a skipped region
VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "wbr"}
RAW_TEX = re.compile(r"(?<![\\\w])\$[^$\s][^$\n]{0,200}?\$|\\\(.{1,200}?\\\)|[_^]\{")
TYPESET = "<mjx-container"


class VisibleText(html.parser.HTMLParser):
    """The text of a page outside code, scripts and typeset math."""

    def __init__(self):
        super().__init__()
        self.depth, self.parts = 0, []

    def handle_starttag(self, tag, attrs):
        if tag in VOID:
            return
        classes = (dict(attrs).get("class") or "").split()
        if self.depth or tag in SKIPPED or any(c in SKIPPED_CLASSES for c in classes):
            self.depth += 1

    def handle_startendtag(self, tag, attrs):
        pass  # <br/>: nothing inside it

    def handle_endtag(self, tag):
        if self.depth and tag not in VOID:
            self.depth -= 1

    def handle_data(self, data):
        if not self.depth:
            self.parts.append(data)


def rendered(browser: str, url: str, budget: int, shot: Path | None) -> str:
    """The DOM of ``url`` after ``budget`` ms of virtual time (and its screenshot to ``shot``)."""
    flags = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars"]
    flags += ["--allow-file-access-from-files", f"--virtual-time-budget={budget}"]
    flags += ["--window-size=1280,2400"]
    out = subprocess.run([*flags, "--dump-dom", url], capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        raise RuntimeError(f"{browser} failed on {url}: {out.stderr[-2000:]}")
    if shot is not None:
        subprocess.run([*flags, f"--screenshot={shot}", url], capture_output=True, timeout=300)
    return out.stdout


def raw_fragments(dom: str) -> list[str]:
    parser = VisibleText()
    parser.feed(dom)
    text = "".join(parser.parts)
    return [m.group(0) for m in RAW_TEX.finditer(text)]


def has_math(markdown: str) -> bool:
    """Whether Markdown holds a ``$…$`` pair outside code (fenced, indented or inline)."""
    prose = re.sub(r"```.*?```|~~~.*?~~~|`[^`\n]*`", " ", markdown, flags=re.S)
    prose = re.sub(r"(?m)^(?: {4}|\t).*$", " ", prose)
    return re.search(r"(?<!\\)\$[^$\s][^$]*?\$", prose) is not None


def notebook_markdown(path: Path) -> str:
    cells = json.loads(path.read_text())["cells"]
    return "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")


def check(name: str, dom: str, expects_math: bool) -> str | None:
    """Why the page fails, or None."""
    raw = raw_fragments(dom)
    if raw:
        return f"{name}: raw TeX left in the page: {' | '.join(raw[:3])}"
    if expects_math and TYPESET not in dom:
        return f"{name}: its source has math, the page no typeset formula (did MathJax load?)"
    return None


@contextlib.contextmanager
def jupyterlab(root: Path) -> Iterator[str]:
    """A JupyterLab server on ``root``, its URL; stopped on exit."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with tempfile.TemporaryDirectory(prefix="rlkit-lab-") as tmp:
        tracker = Path(tmp, "settings", "@jupyterlab", "notebook-extension")
        tracker.mkdir(parents=True)
        (tracker / "tracker.jupyterlab-settings").write_text('{"windowingMode": "none"}')
        command = [sys.executable, "-m", "jupyterlab", "--no-browser", f"--port={port}"]
        command += ["--ip=127.0.0.1", "--IdentityProvider.token=", f"--ServerApp.root_dir={root}"]
        command += [f"--LabApp.user_settings_dir={tmp}/settings"]
        command += [f"--LabApp.workspaces_dir={tmp}/workspaces", "--allow-root"]
        server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        url = f"http://127.0.0.1:{port}"
        try:
            for _ in range(120):
                with contextlib.suppress(OSError):
                    urllib.request.urlopen(f"{url}/lab", timeout=2)
                    break
                time.sleep(0.5)
            else:
                raise RuntimeError("JupyterLab did not start within a minute")
            yield url
        finally:
            server.terminate()
            server.wait(timeout=30)


def site_pages(site: Path) -> list[tuple[str, Path, bool]]:
    """(name, page, whether its source has math) for the site's pages from Markdown/notebooks."""
    root = site.parent
    pages = []
    for page in sorted(site.rglob("*.html")):
        rel = page.relative_to(site)
        for source in (root / rel.with_suffix(".md"), root / rel.with_suffix(".ipynb")):
            if rel.name == "index.html":  # a folder's README is its index page
                source = root / rel.parent / "README.md"
            if source.exists():
                text = (
                    notebook_markdown(source) if source.suffix == ".ipynb" else source.read_text()
                )
                pages.append((str(rel), page, has_math(text)))
                break
    return pages


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("site", nargs="?", type=Path, help="the built site (make docs: site/)")
    parser.add_argument("--lab", nargs="+", type=Path, default=[], help="notebooks to open")
    parser.add_argument("--budget", type=int, default=20000, help="virtual ms per page")
    parser.add_argument("--shots", type=Path, help="a folder for a screenshot of each page")
    args = parser.parse_args(argv)
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        parser.error("needs Chromium on PATH (Debian: apt-get install chromium)")
    if args.shots:
        args.shots.mkdir(parents=True, exist_ok=True)
    jobs = []  # (name, url, expects math)
    if args.site:
        for name, page, math in site_pages(args.site.resolve()):
            jobs.append((f"site/{name}", page.as_uri(), math))
    if not jobs and not args.lab:
        parser.error("nothing to check: name the site, or --lab and notebooks")
    failures = []
    with contextlib.ExitStack() as stack:
        if args.lab:
            lab = stack.enter_context(jupyterlab(Path.cwd()))
            for notebook in args.lab:
                url = f"{lab}/lab/tree/{notebook.as_posix()}"
                jobs.append((f"lab/{notebook.name}", url, has_math(notebook_markdown(notebook))))
        for name, url, math in jobs:
            shot = args.shots / (re.sub(r"[^\w.-]+", "_", name) + ".png") if args.shots else None
            why = check(name, rendered(browser, url, args.budget, shot), math)
            print(f"{'FAIL' if why else 'ok  '} {name}{'' if math else ' (no math)'}", flush=True)
            if why:
                failures.append(why)
    for why in failures:
        print(why, file=sys.stderr)
    print(f"{len(jobs) - len(failures)} of {len(jobs)} pages typeset")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
