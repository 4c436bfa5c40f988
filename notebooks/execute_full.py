"""Re-execute the notebooks at full scale and check the figures the README quotes from them.

    python notebooks/execute_full.py                 # every notebook, then the README check
    python notebooks/execute_full.py 03_entropy_decay.ipynb
    python notebooks/execute_full.py --check-only    # only compare the README with the outputs

Each notebook runs in place, in its own folder (so figures land in notebooks/figures/), with
RLKIT_NB_SCALE unset (full scale) and one thread; its outputs become the committed ones.

The README check: in the README's notebooks table, every figure in backticks after the notebook's
name (for example `-0.0138 [-0.0206, -0.00701]`) is quoted from that notebook's outputs and must
appear verbatim in them. A figure that no longer appears is reported and the exit status is 1.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

HERE = Path(__file__).resolve().parent
README = HERE.parent / "README.md"
ROW = re.compile(r"^\|\s*`(\d\d_[a-z_]+)`\s*\|(.*)$")
QUOTED = re.compile(r"`([^`]+)`")


def execute(path: Path) -> float:
    """Run ``path`` in place at full scale; returns the wall time in seconds."""
    os.environ.pop("RLKIT_NB_SCALE", None)
    os.environ["OMP_NUM_THREADS"] = "1"
    nb = nbformat.read(path, as_version=4)
    start = time.time()
    NotebookClient(
        nb,
        timeout=None,
        kernel_name="python3",
        resources={"metadata": {"path": str(HERE)}},
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


def quoted_figures(readme: Path = README) -> dict[str, list[str]]:
    """{notebook stem: [figures quoted in backticks in its row of the notebooks table]}."""
    out = {}
    for line in readme.read_text().splitlines():
        match = ROW.match(line)
        if match:
            out[match.group(1)] = QUOTED.findall(match.group(2))
    return out


def check_readme(readme: Path = README, notebook_dir: Path = HERE) -> list[str]:
    """The README figures that do not appear in their notebook's outputs."""
    missing = []
    for stem, figures in quoted_figures(readme).items():
        text = output_text(notebook_dir / f"{stem}.ipynb")
        missing += [f"{stem}: {fig}" for fig in figures if fig not in text]
    return missing


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("notebooks", nargs="*", help="notebook files (default: all)")
    parser.add_argument("--check-only", action="store_true", help="skip execution")
    args = parser.parse_args(argv)
    if not args.check_only:
        paths = [HERE / Path(n).name for n in args.notebooks] or sorted(HERE.glob("*.ipynb"))
        for path in paths:
            print(f"{path.name}: executing at full scale ...", flush=True)
            print(f"{path.name}: done in {execute(path):.0f} s", flush=True)
    missing = check_readme()
    if missing:
        print("README figures not found in the notebook outputs:", *missing, sep="\n  ")
        return 1
    count = sum(len(v) for v in quoted_figures().values())
    print(f"README: all {count} quoted figures match the notebook outputs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
