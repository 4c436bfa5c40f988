"""The method registry (rlkit.methods.registry) and the one method switch, ``algo.method``: each
older key (``agpo.enabled=true``, ``algo.estimator=ppo``/``dpo``, rlkit.config.aliases) chooses
the method it chose before, a saved config of an old run loads, settings choosing different
methods are refused naming both, and the registry is the only place a config becomes a
method's name."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from rlkit.config import config_from_dict, load_config
from rlkit.methods import AGPO, DPO, PPO, Method, build_method, method_name
from rlkit.rundir import check_resume_config, saved_config

RLKIT = Path(__file__).resolve().parents[1] / "rlkit"
FIXTURE = Path(__file__).resolve().parent / "golden" / "resume_fixture" / "config.yaml"


@pytest.mark.parametrize(
    "overrides, name, cls, estimator",
    [
        ([], "grpo", Method, "grpo"),
        (["algo.estimator=ebpo"], "grpo", Method, "ebpo"),
        (["algo.estimator=agpo"], "grpo", Method, "agpo"),  # AGPO's advantage alone
        (["agpo.enabled=false"], "grpo", Method, "grpo"),  # an older key choosing nothing
        (["agpo.enabled=true"], "agpo", AGPO, "grpo"),
        (["algo.estimator=agpo", "agpo.enabled=true"], "agpo", AGPO, "agpo"),
        (["algo.estimator=ppo"], "ppo", PPO, "ppo"),
        (["algo.estimator=dpo"], "dpo", DPO, "dpo"),
        (["algo.method=grpo"], "grpo", Method, "grpo"),
        (["algo.method=agpo"], "agpo", AGPO, "grpo"),
        (["algo.method=agpo", "algo.estimator=agpo"], "agpo", AGPO, "agpo"),
        (["algo.method=agpo", "agpo.enabled=true"], "agpo", AGPO, "grpo"),  # the same method
        (["algo.method=ppo"], "ppo", PPO, "ppo"),  # the method's own estimator
        (["algo.method=dpo"], "dpo", DPO, "dpo"),
        (["algo.method=ppo", "algo.estimator=ppo"], "ppo", PPO, "ppo"),
    ],
)
def test_algo_method_and_each_older_key_choose_the_method(overrides, name, cls, estimator):
    cfg = load_config("tiny-cpu", overrides)
    assert (method_name(cfg), cfg.algo.method, cfg.algo.estimator) == (name, name, estimator)
    assert type(build_method(cfg)) is cls
    assert "enabled" not in cfg.to_dict()["agpo"]  # the older key leaves the schema


def test_a_saved_config_of_an_old_run_loads_with_its_method():
    """A run directory's config.yaml written before algo.method: agpo.enabled, no algo.method."""
    saved = yaml.safe_load(FIXTURE.read_text())
    assert saved["agpo"]["enabled"] is True and "method" not in saved["algo"]
    cfg = config_from_dict(saved)
    assert method_name(cfg) == "agpo" and cfg.algo.estimator == saved["algo"]["estimator"]
    old = load_config("tiny-cpu").to_dict()
    old["agpo"]["enabled"] = True
    del old["algo"]["method"]
    assert method_name(config_from_dict(old)) == "agpo"
    assert config_from_dict(old) == load_config("tiny-cpu", ["algo.method=agpo"])


@pytest.mark.parametrize(
    "older, today",
    [(["agpo.enabled=true"], ["algo.method=agpo"]), (["algo.estimator=ppo"], ["algo.method=ppo"])],
)
def test_a_run_directory_written_before_algo_method_resumes_and_replans(tmp_path, older, today):
    """Its config.yaml (the older key, no algo.method) is read back as the config today's keys
    give: what resuming and a sweep's re-planning compare (rlkit.rundir.check_resume_config)."""
    saved = load_config("tiny-cpu", [*older, f"output_dir={tmp_path}"]).to_dict()
    del saved["algo"]["method"]
    if older[0].startswith("agpo"):
        saved["agpo"]["enabled"] = True
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(saved, sort_keys=False))
    wanted = load_config("tiny-cpu", [*today, f"output_dir={tmp_path}"])
    check_resume_config(saved_config(tmp_path, check_paths=False), wanted)
    assert saved_config(tmp_path, check_paths=False) == wanted


@pytest.mark.parametrize(
    "overrides, first, second",
    [
        (["algo.method=grpo", "agpo.enabled=true"], "agpo.enabled=true", "algo.method=grpo"),
        (["algo.method=ppo", "agpo.enabled=true"], "agpo.enabled=true", "algo.method=ppo"),
        (["algo.method=agpo", "algo.estimator=ppo"], "algo.estimator=ppo", "algo.method=agpo"),
        (["algo.method=ppo", "algo.estimator=dpo"], "algo.estimator=dpo", "algo.method=ppo"),
        (["agpo.enabled=true", "algo.estimator=ppo"], "agpo.enabled=true", "algo.estimator=ppo"),
    ],
)
def test_settings_choosing_different_methods_are_refused_naming_both(overrides, first, second):
    with pytest.raises(ValueError, match=rf"^{first} and {second} choose different methods"):
        load_config("tiny-cpu", overrides)


def test_a_method_with_another_estimator_than_its_own_is_refused_naming_both():
    with pytest.raises(
        ValueError,
        match=r"^algo\.method=ppo with algo\.estimator=ebpo: .*set algo\.estimator=ppo",
    ):
        load_config("tiny-cpu", ["algo.method=ppo", "algo.estimator=ebpo"])


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["algo.method=nope"], r"algo\.method: unknown method 'nope'; known: \['agpo', 'dpo',"),
        (["algo.method=3"], r"algo\.method must be a string, got 3"),
        (["agpo.enabled=maybe"], r"agpo\.enabled must be true or false, got 'maybe'"),
    ],
)
def test_an_unknown_method_lists_the_known(overrides, message):
    with pytest.raises(ValueError, match=message):
        load_config("tiny-cpu", overrides)


def test_no_module_branches_on_a_method_name():
    """No code in rlkit reads agpo.enabled, compares algo.method or compares anything with a
    method's name: the methods and the config's checks read the components' declarations
    (issue 44 §3); the older keys are read once, by rlkit.config.aliases, as data."""
    names = "|".join(("grpo", "agpo", "ppo", "dpo"))
    branch = re.compile(
        rf"\.enabled\b(?!=)|algo\.method\s*(==|!=|in\b)|(==|!=)\s*[\"']({names})[\"']"
    )
    found = [
        f"{path.relative_to(RLKIT)}:{n}"
        for path in RLKIT.rglob("*.py")
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if branch.search(line.split("#")[0]) and not line.lstrip().startswith(('"', 'f"'))
    ]
    assert found == []


@pytest.mark.parametrize(
    ("overrides", "method", "estimator"),
    [
        (["algo.estimator=ppo"], "ppo", "ppo"),
        (["agpo.enabled=true", "algo.estimator=agpo"], "agpo", "agpo"),
        (["algo.method=dpo"], "dpo", "dpo"),
    ],
)
def test_the_overrides_choose_over_a_saved_configs_method(tmp_path, overrides, method, estimator):
    """A config saved with today's key (``algo.method: grpo``, as every run writes it) and an
    override by an older key (``rlkit eval --checkpoint RUN algo.estimator=ppo``): the override
    chooses; two choices within the overrides are still refused naming both."""
    saved = tmp_path / "config.yaml"
    saved.write_text("algo: {method: grpo, estimator: grpo}\n")
    cfg = load_config(str(saved), overrides)
    assert (cfg.algo.method, cfg.algo.estimator) == (method, estimator)
    with pytest.raises(
        ValueError, match=r"agpo.enabled=true and algo.method=grpo choose different"
    ):
        load_config(str(saved), ["agpo.enabled=true", "algo.method=grpo"])
