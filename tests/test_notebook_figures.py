"""notebooks/execute_full.py: the check that README figures are quoted from notebook outputs."""

import importlib.util
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("execute_full", ROOT / "notebooks/execute_full.py")
execute_full = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(execute_full)


def _notebook(folder: Path, stem: str, printed: str) -> None:
    cell = nbformat.v4.new_code_cell("print(x)")
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=printed)]
    nbformat.write(nbformat.v4.new_notebook(cells=[cell]), folder / f"{stem}.ipynb")


def test_check_readme_flags_a_figure_missing_from_the_outputs(tmp_path):
    _notebook(tmp_path, "01_demo", "gap: -0.0121 [-0.0167, -0.0074]\n")
    readme = tmp_path / "README.md"
    readme.write_text(
        "| notebook | claim | what we find |\n|---|---|---|\n"
        "| `01_demo` | a claim | gap `-0.0121 [-0.0167, -0.0074]`, other `0.5` |\n"
    )
    assert execute_full.quoted_figures(readme) == {"01_demo": ["-0.0121 [-0.0167, -0.0074]", "0.5"]}
    assert execute_full.check_readme(readme, tmp_path) == ["01_demo: 0.5"]


def test_the_committed_readme_matches_the_committed_notebooks():
    assert execute_full.quoted_figures(), "the README's notebooks table quotes no figure"
    assert execute_full.check_readme() == []
