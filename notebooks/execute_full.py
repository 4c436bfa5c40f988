"""Re-execute the notebooks at full scale and check the figures docs/course.md quotes from them.

    python notebooks/execute_full.py                 # every notebook, then the pages' checks
    python notebooks/execute_full.py 07_entropy_decay.ipynb results/synthesis.ipynb
    python notebooks/execute_full.py --check-only    # only compare the pages with the outputs

After the notebooks (not with --check-only), one committed seed of each arm of the headline
claims (the two that survive the project-wide Holm correction) is trained again and compared with
its ``summary.json``. A sweep whose runs recorded rlkit's pinned CPU kernels (``portable`` or
``avx2``, docs/tiny-default.md "Across CPUs") is re-run under the same kernels and must come back
identical (``rlkit reproduce --exact``); a sweep made before the pins (``native``, an AMD EPYC's own
kernels) is re-run under AVX2 kernels and must come back within the seeds' spread.

Each notebook runs in place, in its own folder (so a lesson's figures land in notebooks/figures/,
a results notebook's in notebooks/results/figures/), with RLKIT_NB_SCALE unset (full scale) and
one thread; its outputs become the committed ones.

The quotes check: in docs/course.md's table of the lessons and docs/results.md's table of the
results notebooks (``results/<name>``), every quote in backticks after the notebook's name is a
figure with its label, ``label … figure`` (for example
`AGPO − GRPO (eval/greedy_accuracy, … -0.2 [-2.3, +2.0]`), quoted from that notebook's outputs.
One output line must hold every part of the quote, in order, each as whole words (not inside a
longer number or name), with any text between them; runs of spaces count as one. So a figure
that moved to another arm's line no longer matches. A quote that does not match, or that has no
label, is reported and the exit status is 1. So is a generated verdict table in docs/results.md
that is not what ``rlkit verdicts`` renders from results/*/summary.json.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

from rlkit.verdicts import stale_line

HERE = Path(__file__).resolve().parent
COURSE = HERE.parent / "docs" / "course.md"  # the lessons' table, with the quoted figures
VERDICTS = HERE.parent / "docs" / "results.md"  # the results notebooks' table; the verdict table
PAGES = (COURSE, VERDICTS)  # the pages whose notebook tables quote figures
RESULTS = HERE.parent / "results"
# a table row naming a lesson (`03_vanishing_gradients`) or a results notebook (`results/synthesis`)
ROW = re.compile(r"^\|\s*`((?:results/)?[a-z0-9_]+)`\s*\|(.*)$")
QUOTED = re.compile(r"`([^`]+)`")
GAP = "…"  # between a quote's parts: any text on the same output line
# (results folder, arm, seed): the headline claims' arms, the first seed of each sweep
HEADLINE_RUNS = [
    ("22_ebpo", "EBPO", 0),
    ("22_ebpo", "GRPO", 0),
    ("22_ebpo_hard_32", "EBPO_G2", 16),
    ("22_ebpo_hard_32", "GRPO_G2", 16),
]


def execute(path: Path) -> float:
    """Run ``path`` in place at full scale; returns the wall time in seconds."""
    os.environ.pop("RLKIT_NB_SCALE", None)
    os.environ.pop("RLKIT_EXERCISE_ANSWERS", None)  # the committed outputs are a student's view
    os.environ["OMP_NUM_THREADS"] = "1"
    nb = nbformat.read(path, as_version=4)
    start = time.time()
    NotebookClient(
        nb,
        timeout=None,
        kernel_name="python3",
        resources={"metadata": {"path": str(path.parent)}},
        coalesce_streams=True,  # one output per stream, however the kernel flushed it
    ).execute()
    nbformat.write(nb, path)
    return time.time() - start


def output_text(path: Path) -> str:
    """All text a notebook printed or displayed (stream and text/plain outputs)."""
    nb = nbformat.read(path, as_version=4)
    parts = []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if "text" in out:
                parts.append(out["text"])
            parts.append(out.get("data", {}).get("text/plain", ""))
    return "\n".join(parts)


def quoted_figures(*pages: Path) -> dict[str, list[str]]:
    """{notebook (its path under notebooks/, without .ipynb): [figures quoted in backticks in its
    row of a notebooks table]}, over ``pages`` (default :data:`PAGES`)."""
    out = {}
    for page in pages or PAGES:
        for line in page.read_text().splitlines():
            match = ROW.match(line)
            if match:
                out[match.group(1)] = QUOTED.findall(match.group(2))
    return out


def quote_pattern(quote: str) -> re.Pattern | None:
    """A quote ``label … figure`` as a regex over one whitespace-collapsed output line: its parts in
    order, each delimited by spaces or the line's ends (a part may end before ``;``, ``,`` or
    ``:``); None for a quote without a label."""
    parts = [" ".join(part.split()) for part in quote.split(GAP)]
    if len(parts) < 2 or not all(parts):
        return None
    return re.compile(".*".join(rf"(?<!\S){re.escape(part)}(?![^\s;,:])" for part in parts))


def check_readme(readme: Path | None = None, notebook_dir: Path = HERE) -> list[str]:
    """The quotes of ``readme`` (default: every page of :data:`PAGES`) that no line of their
    notebook's outputs holds, and those without a label."""
    missing = []
    for stem, quotes in quoted_figures(*([readme] if readme else [])).items():
        lines = [
            " ".join(line.split())
            for line in output_text(notebook_dir / f"{stem}.ipynb").splitlines()
        ]
        for quote in quotes:
            pattern = quote_pattern(quote)
            if pattern is None:
                missing.append(f"{stem}: {quote} (no label: quote it as `label {GAP} figure`)")
            elif not any(pattern.search(line) for line in lines):
                missing.append(f"{stem}: {quote}")
    return missing


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "notebooks",
        nargs="*",
        help="notebooks under notebooks/, e.g. 07_entropy_decay.ipynb or results/synthesis.ipynb (default: all)",
    )
    parser.add_argument("--check-only", action="store_true", help="skip execution")
    args = parser.parse_args(argv)
    if not args.check_only:
        lessons, results = sorted(HERE.glob("*.ipynb")), sorted(HERE.glob("results/*.ipynb"))
        paths = [HERE / n for n in args.notebooks] or lessons + results
        for path in paths:
            print(f"{path.name}: executing at full scale ...", flush=True)
            print(f"{path.name}: done in {execute(path):.0f} s", flush=True)
    failed = [] if args.check_only else reproduce_headline_runs()
    missing, stale = check_readme(), stale_line(VERDICTS, RESULTS)
    if missing:
        header = "docs/course.md's and docs/results.md's quotes not on one line of the outputs:"
        print(header, *missing, sep="\n  ")
    else:
        count = sum(len(v) for v in quoted_figures().values())
        print(f"docs/course.md, docs/results.md: all {count} quoted figures match their outputs")
    if stale:
        print(f"docs/results.md's verdict table is stale: {stale}")
    else:
        print("docs/results.md: the pre-registered verdict table matches results/*/summary.json")
    if failed:
        print("Headline runs that did not come back as their kernels require:", *failed)
    return 1 if missing or stale or failed else 0


def reproduce_headline_runs() -> list[str]:
    """:data:`HEADLINE_RUNS` re-run and compared (:func:`rlkit.reproduce.reproduce`, from the
    repository's root, where the summaries' spec paths point): exactly where the sweep's runs
    recorded pinned kernels, within the seeds' spread under AVX2 kernels where they did not; the
    runs that fail."""
    from rlkit.reproduce import recorded_kernels, reproduce

    failed, cwd = [], os.getcwd()
    os.chdir(HERE.parent)
    try:
        for name, arm, seed in HEADLINE_RUNS:
            summary = json.loads((RESULTS / name / "summary.json").read_text())
            pinned = recorded_kernels(summary) != "native"
            kernels = None if pinned else "avx2"  # None: the kernels the runs recorded
            if reproduce(RESULTS / name, arm, seed, kernels=kernels, exact=pinned):
                failed.append(f"{name} {arm} seed {seed}")
    finally:
        os.chdir(cwd)
    return failed


if __name__ == "__main__":
    sys.exit(main())
