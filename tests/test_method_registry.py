"""The method registry (rlkit.methods.registry): today's keys choose the method they chose before
the registry, two settings choosing different methods are refused, and the registry is the only
place a config becomes a method's name."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from rlkit.config import load_config
from rlkit.methods import AGPO, DPO, PPO, Method, build_method, method_name

RLKIT = Path(__file__).resolve().parents[1] / "rlkit"


@pytest.mark.parametrize(
    "overrides, name, cls",
    [
        ([], "grpo", Method),
        (["algo.estimator=ebpo"], "grpo", Method),
        (["algo.estimator=agpo"], "grpo", Method),  # AGPO's advantage without its controllers
        (["agpo.enabled=true"], "agpo", AGPO),
        (["algo.estimator=agpo", "agpo.enabled=true"], "agpo", AGPO),
        (["algo.estimator=ppo"], "ppo", PPO),
        (["algo.estimator=dpo"], "dpo", DPO),
    ],
)
def test_todays_keys_choose_the_method(overrides, name, cls):
    cfg = load_config("tiny-cpu", overrides)
    assert method_name(cfg) == name
    assert type(build_method(cfg)) is cls


def test_two_methods_chosen_at_once_are_refused():
    cfg = SimpleNamespace(algo=SimpleNamespace(estimator="ppo"), agpo=SimpleNamespace(enabled=True))
    with pytest.raises(
        ValueError,
        match=r"agpo\.enabled=true and algo\.estimator=ppo|"
        r"algo\.estimator=ppo and agpo\.enabled=true",
    ):
        method_name(cfg)


def test_no_module_outside_the_registry_branches_on_a_method_name():
    """Outside rlkit/methods/ no code reads agpo.enabled or compares algo.estimator with a
    method's name: the config's checks read the components' declarations (issue 44 §3)."""
    branch = re.compile(r"\.enabled\b(?!=)|algo\.estimator\s*(==|!=|in\b)")
    found = [
        f"{path.relative_to(RLKIT)}:{n}"
        for path in RLKIT.rglob("*.py")
        if path.parent.name != "methods"
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if branch.search(line.split("#")[0]) and not line.lstrip().startswith(('"', 'f"'))
    ]
    assert found == []
