"""The committed notebooks as a student opens them (issue 17): outputs free of warnings and
machine paths, the kernelspec JupyterLab writes (opening a notebook leaves git clean), and every
figure or run a notebook writes routed through the CI-scale redirect (``make test`` leaves the
tracked tree as it was)."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb")) + sorted(
    (ROOT / "notebooks" / "results").glob("*.ipynb")
)
IPYKERNEL_SPEC = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}
MACHINE_PATH = re.compile(r"/root\b|/home/|/work/|/tmp/|\.venv|site-packages")
# writes that bypass simulations.scale.output_dir / simulations.plotting.figure_path
UNREDIRECTED_WRITE = re.compile(r"savefig\(|[\"']figures/|Path\([\"']runs/")


def output_texts(cell) -> list[str]:
    """Every text an output of ``cell`` shows: streams, tracebacks, non-image display data."""
    texts = []
    for out in cell.get("outputs", []):
        texts.append(out.get("text", ""))
        texts += out.get("traceback", [])
        texts += [v for k, v in out.get("data", {}).items() if not k.startswith("image/")]
    return [t if isinstance(t, str) else "".join(t) for t in texts]


def test_there_are_notebooks():
    assert len(NOTEBOOKS) >= 9


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_committed_outputs_have_no_warnings_paths_or_reprs(path):
    nb = nbformat.read(path, as_version=4)
    problems = []
    for i, cell in enumerate(nb.cells):
        for out in cell.get("outputs", []):
            if out.output_type == "error" or out.get("name") == "stderr":
                problems.append(f"cell {i}: {out.output_type} {out.get('text', '')[:100]!r}")
        for text in output_texts(cell):
            if "PosixPath(" in text or MACHINE_PATH.search(text):
                problems.append(f"cell {i}: {text[:100]!r}")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_kernelspec_is_the_one_jupyterlab_writes(path):
    assert nbformat.read(path, as_version=4).metadata.kernelspec == IPYKERNEL_SPEC


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_figures_and_runs_are_written_through_the_ci_redirect(path):
    nb = nbformat.read(path, as_version=4)
    bypasses = [
        f"cell {i}: {line.strip()}"
        for i, cell in enumerate(nb.cells)
        if cell.cell_type == "code"
        for line in cell.source.splitlines()
        if UNREDIRECTED_WRITE.search(line)
    ]
    assert not bypasses, (
        "use simulations.plotting.save/figure_path or simulations.scale.output_dir:\n"
        + "\n".join(bypasses)
    )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_figures_keep_the_shared_readable_text_sizes(path):
    # rlkit/figure_style.py sizes every text for its saved resolution; a notebook's own
    # fontsize=6 legend was a 5-7 px glyph at 80 dpi
    nb = nbformat.read(path, as_version=4)
    own_sizes = [
        f"cell {i}: {line.strip()}"
        for i, cell in enumerate(nb.cells)
        if cell.cell_type == "code"
        for line in cell.source.splitlines()
        if re.search(r"fontsize=|labelsize=", line)
    ]
    assert not own_sizes, "\n".join(own_sizes)


def test_make_notebooks_allows_root_only_as_root():
    dry_run = subprocess.run(
        ["make", "-n", "notebooks"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    jupyter = [line for line in dry_run.splitlines() if "jupyter lab" in line]
    assert len(jupyter) == 1
    assert ("--allow-root" in jupyter[0]) == (os.geteuid() == 0)


def test_a_ci_scale_nbval_run_leaves_no_file_behind(tmp_path):
    """A notebook run as ``make test`` runs it (nbval, RLKIT_NB_SCALE=ci) writes its figure and
    run directory to a temporary folder that is gone afterwards: nothing new next to the notebook,
    nothing left in the system's temporary folder."""
    folder, system_tmp = tmp_path / "notebooks", tmp_path / "tmp"
    folder.mkdir()
    system_tmp.mkdir()
    shutil.copy(ROOT / "notebooks/conftest.py", folder)
    cell = nbformat.v4.new_code_cell(
        "from simulations import plotting\n"
        "from simulations.scale import output_dir\n"
        "fig, _ = plotting.figure()\n"
        'plotting.save(fig, "06_curves")\n'
        'run = output_dir("runs/06")\n'
        "run.mkdir(parents=True)\n"
        '(run / "metrics.jsonl").write_text("{}")\n'
        "assert plotting.figure_path('06_curves').is_file()"
    )
    nbformat.write(nbformat.v4.new_notebook(cells=[cell]), folder / "nb.ipynb")
    env = os.environ | {"RLKIT_NB_SCALE": "ci", "TMPDIR": str(system_tmp)}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "--nbval-lax", "-p", "no:cacheprovider", "-q", "nb.ipynb"],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert sorted(p.name for p in folder.iterdir()) == ["conftest.py", "nb.ipynb"]
    assert list(system_tmp.iterdir()) == []
