"""docs/contributing.md's worked examples run as written: the loss of "Adding a loss", the
method of "Adding a method", the estimator of "Adding an estimator", the task of "Adding a task"
and the engine of "Adding an engine" register from each section's first code block, and the
section's test of it (its second block) passes."""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path

import pytest

from rlkit.advantages import ESTIMATORS
from rlkit.engines import ENGINES
from rlkit.losses import LOSSES
from rlkit.methods import METHODS
from rlkit.tasks import TASKS

GUIDE = Path(__file__).resolve().parents[1] / "docs" / "contributing.md"


def code_blocks(section: str) -> list[str]:
    """The ```python blocks of the guide's ``## section``."""
    text = GUIDE.read_text().split(f"## {section}\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


@pytest.fixture
def unclipped_loss():
    """The guide's loss file, run as the module ``rlkit.losses.unclipped`` would be."""
    source = code_blocks("Adding a loss")[0]
    exec(compile(source, "rlkit/losses/unclipped.py", "exec"), {"__name__": "unclipped"})
    yield LOSSES["unclipped"]
    del LOSSES["unclipped"]


def run_guide_test(section: str, name: str, *args) -> None:
    """The section's second code block, run as its test file, and its test ``name``."""
    namespace: dict = {"__name__": name}
    exec(compile(code_blocks(section)[1], f"tests/{name}.py", "exec"), namespace)
    tests = [value for key, value in namespace.items() if key.startswith("test_")]
    assert len(tests) == 1
    tests[0](*args)


def test_the_guides_loss_registers_and_its_test_passes(unclipped_loss, tmp_path, tiny_model_dir):
    run_guide_test("Adding a loss", "test_unclipped", tmp_path, tiny_model_dir)


@pytest.fixture
def annealed_clip_method():
    """The guide's method file, run as the module ``rlkit.methods.annealed_clip`` would be."""
    source = code_blocks("Adding a method")[0]
    exec(compile(source, "rlkit/methods/annealed_clip.py", "exec"), {"__name__": "annealed_clip"})
    yield METHODS["annealed_clip"]
    del METHODS["annealed_clip"]


def test_the_guides_method_registers_and_its_test_passes(
    annealed_clip_method, tmp_path, tiny_model_dir
):
    run_guide_test("Adding a method", "test_annealed_clip", tmp_path, tiny_model_dir)


@pytest.fixture
def median_estimator():
    """The guide's estimator file, run as the module ``rlkit.advantages.median`` would be."""
    source = code_blocks("Adding an estimator")[0]
    exec(compile(source, "rlkit/advantages/median.py", "exec"), {"__name__": "median"})
    yield ESTIMATORS["median"]
    del ESTIMATORS["median"]


def test_the_guides_estimator_registers_and_its_test_passes(
    median_estimator, tmp_path, tiny_model_dir
):
    run_guide_test("Adding an estimator", "test_median_baseline", tmp_path, tiny_model_dir)


@pytest.fixture
def reverse_digits_task(monkeypatch):
    """The guide's task file, run as the module ``rlkit.tasks.reverse_digits`` (a dataclass
    needs its module in ``sys.modules``)."""
    module = types.ModuleType("rlkit.tasks.reverse_digits")
    monkeypatch.setitem(sys.modules, module.__name__, module)
    source = code_blocks("Adding a task")[0]
    exec(compile(source, "rlkit/tasks/reverse_digits.py", "exec"), vars(module))
    yield TASKS["reverse_digits"]
    del TASKS["reverse_digits"]


def test_the_guides_task_registers_and_its_test_passes(
    reverse_digits_task, tmp_path, tiny_model_dir
):
    run_guide_test("Adding a task", "test_reverse_digits", tmp_path, tiny_model_dir)


@pytest.fixture
def penalised_engine():
    """The guide's engine file, run as the module ``rlkit.engines.hf_penalised`` would be."""
    source = code_blocks("Adding an engine")[0]
    exec(compile(source, "rlkit/engines/hf_penalised.py", "exec"), {"__name__": "hf_penalised"})
    yield ENGINES["hf_penalised"]
    del ENGINES["hf_penalised"]


def test_the_guides_engine_registers_and_its_test_passes(
    penalised_engine, tmp_path, tiny_model_dir
):
    run_guide_test("Adding an engine", "test_hf_penalised", tmp_path, tiny_model_dir)


def test_a_taken_or_unknown_loss_name_is_refused():
    from rlkit.losses import get_loss, register_loss

    with pytest.raises(ValueError, match="'vanilla' is already registered"):
        register_loss("vanilla")(lambda logp, sub, ctx: None)
    with pytest.raises(ValueError, match=r"unknown loss 'nope'; known: \[.*'vanilla'"):
        get_loss("nope")


def test_a_taken_or_unknown_method_name_is_refused():
    from rlkit.methods import Method, get_method, register_method

    with pytest.raises(ValueError, match="'grpo' is already registered"):
        register_method("grpo")(type("Again", (Method,), {}))
    with pytest.raises(ValueError, match=r"unknown method 'nope'; known: \[.*'grpo'"):
        get_method("nope")


def test_a_taken_task_name_is_refused():
    from rlkit.tasks import register_task

    with pytest.raises(ValueError, match="'arithmetic' is already registered"):
        register_task("arithmetic")(lambda task_cfg: None)
