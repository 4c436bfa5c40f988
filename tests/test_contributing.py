"""docs/contributing.md's worked examples run as written: the loss of "Adding a loss" registers
from the page's first code block, and the page's test of it (its second block) passes."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from rlkit.losses import LOSSES

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


def test_the_guides_loss_registers_and_its_test_passes(unclipped_loss, tmp_path, tiny_model_dir):
    namespace: dict = {"__name__": "test_unclipped"}
    exec(compile(code_blocks("Adding a loss")[1], "tests/test_unclipped.py", "exec"), namespace)
    namespace["test_unclipped_is_minus_ratio_times_advantage_and_trains"](tmp_path, tiny_model_dir)


def test_a_taken_or_unknown_loss_name_is_refused():
    from rlkit.losses import get_loss, register_loss

    with pytest.raises(ValueError, match="'vanilla' is already registered"):
        register_loss("vanilla")(lambda logp, sub, ctx: None)
    with pytest.raises(ValueError, match=r"unknown loss 'nope'; known: \[.*'vanilla'"):
        get_loss("nope")
