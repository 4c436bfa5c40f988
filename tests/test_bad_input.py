"""Bad input is one clear error before any work: configs, datasets, rewards, estimator input.

The command line answers exit code 2 and one line naming the problem, before a model is loaded.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from rlkit.advantages import ESTIMATORS, MAX_ABS_REWARD, get_estimator
from rlkit.cli import main
from rlkit.rewards import RewardScorer
from rlkit.tasks.math_datasets import load_math_problems


@pytest.fixture
def no_model_load(monkeypatch):
    """Fail the test if a model is loaded: every error here must come before that. (rlkit.trainer
    is imported here, not at the top, so reward workers unpickling `odd_reward` stay light.)"""
    import rlkit.trainer as trainer_module

    def refuse(spec, **kwargs):
        raise AssertionError(f"the model was loaded before the error ({spec.name_or_path})")

    monkeypatch.setattr(trainer_module, "load_policy", refuse)


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def error_line(capsys, command: str = "train") -> str:
    """The CLI's error: one line (progress bars of a dataset build aside), no traceback."""
    err = capsys.readouterr().err
    assert "Traceback" not in err
    line = err.strip().splitlines()[-1]
    assert line.startswith(f"rlkit {command}: error: "), line
    return line


# ---------------------------------------------------------------------------- config
# 413 bytes whose aliases expand to 10**9 leaves (a bomb like it hung the loader)
BILLION_LAUGHS = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{n}: &{n} [{', '.join([f'*{p}'] * 10)}]\n" for p, n in zip("abcdefgh", "bcdefghi")
)


@pytest.mark.parametrize(
    "yaml_text, message",
    [
        ("steps: [1, 2\n", "invalid YAML (line 2"),
        ("", "is empty"),
        ("# only a comment\n", "is empty"),
        ("steps: 3\nseed: 1\nsteps: 4\n", "duplicate key 'steps'"),
        ("optim:\n  lr: .nan\n", "optim.lr must be a finite number"),
        ("algo:\n  options: {eps: .inf}\n", "algo.options.eps must be a finite number"),
        (BILLION_LAUGHS, "invalid YAML (line 2, column 8): alias *a: YAML aliases are not"),
        ("steps: 3\nseed: &s 1\neval: {every: *s}\n", "alias *s"),
        ("algo: " + "[" * 5000 + "]" * 5000 + "\n", "invalid YAML: nested too deeply"),
    ],
    ids=lambda value: value[:20] if isinstance(value, str) else value,
)
def test_bad_config_files(tmp_path, capsys, no_model_load, yaml_text, message):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml_text)
    assert main(["train", "--config", str(path), f"output_dir={tmp_path / 'run'}"]) == 2
    assert message in error_line(capsys)
    assert not (tmp_path / "run").exists()


def test_a_config_file_over_the_size_limit_is_refused_unread(tmp_path, capsys, no_model_load):
    from rlkit.config import MAX_CONFIG_BYTES

    path = tmp_path / "huge.yaml"
    path.write_text("steps: 3\n" + "# padding\n" * (MAX_CONFIG_BYTES // 10))
    assert main(["train", "--config", str(path), f"output_dir={tmp_path / 'run'}"]) == 2
    assert f"config {path} is larger than 1024 KiB" in error_line(capsys)
    path.write_bytes(b"steps: 3\n\xff\xfe\n")  # e.g. a checkpoint given as the config
    assert main(["train", "--config", str(path), f"output_dir={tmp_path / 'run'}"]) == 2
    assert f"config {path} is not UTF-8 text" in error_line(capsys)


@pytest.mark.parametrize(
    "override, message",
    [
        ("algo.options={bogus: 1}", "unknown config key algo.options.bogus"),
        ("agpo.clip={eps_bse: 0.2}", "unknown config key agpo.clip.eps_bse"),
        ("agpo.temperature={lamda: 0.1}", "unknown config key agpo.temperature.lamda"),
        ("agpo.temperature={tau_base: 2}", "agpo.temperature.tau_base is set by the trainer"),
        ("agpo.clip={eps_min: 0.5, eps_max: 0.1}", "agpo.clip: clip epsilon bounds"),
        (("algo.estimator=ebpo", "algo.options={prior: sometimes}"), "unknown EBPO prior"),
        ("optim.lr=nan", "optim.lr must be a finite number"),
        ("loss.kl_coef=.inf", "loss.kl_coef must be a finite number"),
        ("loss.eps_low=1.0", "loss.eps_low must be < 1"),
        ("rollout.group_size=1", "rollout.group_size=1 with algo.estimator=grpo"),
        ("output_dir=", "output_dir must name a directory"),
        ("model.name_or_path=/no/such/model", "model.name_or_path /no/such/model does not exist"),
        ("task.name=/no/such/data.jsonl", "task.name: dataset file not found"),
        ("task.name=gsm9k", "task.name: dataset: unknown dataset 'gsm9k'"),
    ],
)
def test_bad_overrides(tmp_path, capsys, no_model_load, tiny_model_dir, override, message):
    overrides = override if isinstance(override, tuple) else (override,)
    args = [f"model.name_or_path={tiny_model_dir}", f"output_dir={tmp_path / 'run'}"]
    assert main(["train", *args, *overrides]) == 2
    assert message in error_line(capsys)
    assert not (tmp_path / "run").exists()


def test_group_of_one_is_fine_for_ebpo_only():
    from rlkit.config import load_config

    assert load_config("tiny-cpu", ["algo.estimator=ebpo", "rollout.group_size=1"])
    with pytest.raises(ValueError, match="rollout.group_size=1 with algo.method=agpo"):
        load_config("tiny-cpu", ["algo.estimator=ebpo", "algo.method=agpo", "rollout.group_size=1"])


def test_output_dir_that_is_a_file_or_under_one(tmp_path, capsys, no_model_load):
    file = tmp_path / "file"
    file.write_text("x")
    assert main(["train", f"output_dir={file}"]) == 2
    assert "is a file, not a directory" in error_line(capsys)
    assert main(["train", f"output_dir={file / 'run'}"]) == 2
    assert f"is under {file}, which is a file" in error_line(capsys)


def test_output_dir_not_writable(tmp_path, capsys, no_model_load, monkeypatch):
    monkeypatch.setattr(os, "access", lambda path, mode: False)
    assert main(["train", f"output_dir={tmp_path / 'run'}"]) == 2
    assert "is not writable" in error_line(capsys)


def test_validating_a_config_does_not_import_the_model_stack():
    code = (
        "import sys; from rlkit.config import load_config; load_config('qwen3-8b-qlora'); "
        "print(sorted(m for m in ('transformers', 'peft', 'datasets') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# ----------------------------------------------------------------------------- paths
@pytest.fixture
def broken_links(tmp_path) -> dict:
    """A symlink loop and a dangling symlink in ``tmp_path``, each with what the checks call it
    (``Path.exists()`` is False for both)."""
    loop, dangling = tmp_path / "loop", tmp_path / "dangling"
    loop.symlink_to("loop")
    dangling.symlink_to(tmp_path / "nowhere")
    return {
        loop: "a symlink loop",
        dangling: f"a dangling symlink (to {tmp_path / 'nowhere'}, which does not exist)",
    }


def test_output_dir_through_a_broken_symlink(capsys, no_model_load, broken_links):
    for link, what in broken_links.items():
        assert main(["train", f"output_dir={link}"]) == 2
        assert f"output_dir {link} is {what}: fix or remove the link" in error_line(capsys)
        assert main(["train", f"output_dir={link / 'run'}"]) == 2
        assert f"output_dir {link / 'run'} is under {link}, {what}" in error_line(capsys)


def test_model_dataset_or_config_behind_a_broken_symlink(
    capsys, no_model_load, tiny_model_dir, broken_links
):
    """Each said it did not exist, though its path does (as a link that cannot be followed)."""
    for link, what in broken_links.items():
        cases = [
            ("model.name_or_path", link),
            ("model.name_or_path", link / "model.gguf"),
            ("task.name", link / "data.jsonl"),
            ("config", link / "config.yaml"),
        ]
        for key, path in cases:
            args = [f"model.name_or_path={tiny_model_dir}", f"output_dir={link.parent / 'run'}"]
            args += ["--config", str(path)] if key == "config" else [f"{key}={path}"]
            assert main(["train", *args]) == 2
            where = f"is {what}" if path == link else f"is under {link}, {what}"
            assert f"{key} {path} {where}" in error_line(capsys)


def test_a_lock_that_cannot_be_taken_leaves_nothing_to_release(broken_links, monkeypatch):
    import gc

    from rlkit.rundir import RunLock

    unraisable = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    for link in broken_links:
        with pytest.raises(OSError):
            RunLock(link)
    gc.collect()
    assert [str(u.exc_value) for u in unraisable] == []


def test_rlkit_cache_that_cannot_be_a_directory(
    tmp_path, capsys, no_model_load, tiny_model_dir, monkeypatch, broken_links
):
    file = tmp_path / "file"
    file.write_text("x")
    cases = {file: f"RLKIT_CACHE {file} is a file, not a directory"}
    cases[file / "cache"] = f"RLKIT_CACHE {file / 'cache'} is under {file}, which is a file"
    for link, what in broken_links.items():
        cases[link] = f"RLKIT_CACHE {link} is {what}"
        cases[link / "cache"] = f"RLKIT_CACHE {link / 'cache'} is under {link}, {what}"
    rows = [{"question": f"{i}+1?", "answer": i + 1} for i in range(4)]
    data = write_jsonl(tmp_path / "data.jsonl", rows)
    for cache, message in cases.items():
        monkeypatch.setenv("RLKIT_CACHE", str(cache))
        assert main(dataset_args(tmp_path, tiny_model_dir, data, "rollout.num_prompts=1")) == 2
        assert message in error_line(capsys)


def test_an_empty_rlkit_cache_means_unset(monkeypatch, tmp_path):
    from rlkit.cache import default_cache_dir

    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("RLKIT_CACHE", "")
    assert default_cache_dir() == tmp_path / ".cache" / "rlkit"  # not the current directory


def test_plot_refuses_a_broken_run_directory_or_out(tmp_path, capsys, broken_links):
    run = tmp_path / "run"
    run.mkdir()
    write_jsonl(run / "metrics.jsonl", [{"step": 1, "reward": 0.5}])
    for link, what in broken_links.items():
        assert main(["plot", str(link)]) == 2
        assert f"run directory {link} is {what}" in error_line(capsys, "plot")
        assert main(["plot", str(run), "--out", str(link / "curves.png")]) == 2
        message = f"--out {link / 'curves.png'} is under {link}, {what}"
        assert message in error_line(capsys, "plot")
    file = tmp_path / "file"
    file.write_text("x")
    assert main(["plot", str(run), "--out", str(file / "curves.png")]) == 2
    message = f"--out {file / 'curves.png'} is under {file}, which is a file"
    assert message in error_line(capsys, "plot")
    assert main(["plot", str(run), "--out", str(run)]) == 2
    assert f"--out {run} is a directory: name a file" in error_line(capsys, "plot")


def test_eval_and_build_tiny_refuse_a_broken_symlink(capsys, broken_links):
    for link, what in broken_links.items():
        assert main(["eval", "--checkpoint", str(link)]) == 2
        assert f"--checkpoint {link} is {what}" in error_line(capsys, "eval")
        assert main(["build-tiny", "--out", str(link / "tiny")]) == 2
        assert f"--out {link / 'tiny'} is under {link}, {what}" in error_line(capsys, "build-tiny")


def test_sweep_spec_or_out_and_demo_out_behind_a_broken_path(tmp_path, capsys, broken_links):
    """Each names the setting: the spec file, the spec's ``out``, the demo's ``--out`` (they said
    "not found" and "output_dir …/GRPO/G2/seed0", a directory the user never named)."""
    file = tmp_path / "file"
    file.write_text("x")
    spec = tmp_path / "spec.yaml"
    for link, what in broken_links.items():
        assert main(["sweep", str(link)]) == 2
        assert f"sweep spec {link} is {what}" in error_line(capsys, "sweep")
        spec.write_text(f"base: tiny-cpu\narms: {{A: []}}\nseeds: [0]\nout: {link / 'runs'}\n")
        assert main(["sweep", "--dry-run", str(spec)]) == 2
        message = f"sweep spec: out {link / 'runs'} is under {link}, {what}"
        assert message in error_line(capsys, "sweep")
        assert main(["demo", "--out", str(link / "demo")]) == 2
        assert f"--out {link / 'demo'} is under {link}, {what}" in error_line(capsys, "demo")
    spec.write_text(f"base: tiny-cpu\narms: {{A: []}}\nseeds: [0]\nout: {file / 'runs'}\n")
    assert main(["sweep", "--dry-run", str(spec)]) == 2
    message = f"sweep spec: out {file / 'runs'} is under {file}, which is a file"
    assert message in error_line(capsys, "sweep")
    assert main(["demo", "--out", str(file)]) == 2
    assert f"--out {file} is a file, not a directory" in error_line(capsys, "demo")


# ------------------------------------------------------------------------------ data
def dataset_args(tmp_path, tiny_model_dir, path, *extra):
    return [
        "train",
        f"model.name_or_path={tiny_model_dir}",
        f"output_dir={tmp_path / 'run'}",
        f"task.name={path}",
        "task.num_eval=1",
        *extra,
    ]


def test_empty_dataset_file(tmp_path, capsys, no_model_load, tiny_model_dir):
    path = tmp_path / "empty.jsonl"
    path.write_text("\n")
    assert main(dataset_args(tmp_path, tiny_model_dir, path)) == 2
    assert f"dataset file {path} is empty" in error_line(capsys)


def test_malformed_jsonl_line_is_named(tmp_path, capsys, no_model_load, tiny_model_dir):
    path = tmp_path / "broken.jsonl"
    path.write_text('{"question": "1+1?", "answer": "2"}\n\n{"question": "2+2?", "answer": 4\n')
    assert main(dataset_args(tmp_path, tiny_model_dir, path)) == 2
    assert f"dataset file {path}, line 3: malformed JSON" in error_line(capsys)


def test_hub_dataset_while_offline(tmp_path, capsys, no_model_load, tiny_model_dir, monkeypatch):
    import datasets

    def offline(*args, **kwargs):
        raise ConnectionError("Couldn't reach 'openai/gsm8k' on the Hub (LocalEntryNotFoundError)")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    assert main(dataset_args(tmp_path, tiny_model_dir, "gsm8k")) == 2
    line = error_line(capsys)
    assert "dataset gsm8k: could not load openai/gsm8k" in line and "ConnectionError" in line


def test_dataset_too_small_to_split(tmp_path, capsys, no_model_load, tiny_model_dir):
    path = write_jsonl(
        tmp_path / "tiny.jsonl", [{"question": f"{i}+1?", "answer": i + 1} for i in range(3)]
    )
    assert main(dataset_args(tmp_path, tiny_model_dir, path, "task.num_eval=3")) == 2
    assert "3 problems are too few to hold out task.num_eval=3" in error_line(capsys)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["task.arithmetic={train_size: 0}"],
            "the training split of task.name=arithmetic is empty with "
            "task.arithmetic.train_size=0: training needs problems",
        ),
        (
            ["task.name=word_problems", "task.word_problems={train_size: 0, seed: 3}"],
            "the training split of task.name=word_problems is empty with "
            "task.word_problems.train_size=0, task.word_problems.seed=3: training needs problems",
        ),
        (
            ["steps=3", "task.shift={step: 2, arithmetic: {train_size: 0}}"],
            "the training split of task.shift.arithmetic is empty with "
            "task.shift.arithmetic.train_size=0: training needs problems",
        ),
        (
            ["task.name=word_problems", "task.word_problems={eval_size: 0}"],
            "the eval split of task.name=word_problems is empty with "
            "task.word_problems.eval_size=0: evaluation needs problems",
        ),
    ],
    ids=["arithmetic", "word-problems", "shift", "eval"],
)
def test_an_empty_split_names_the_setting_that_emptied_it(
    tmp_path, capsys, no_model_load, tiny_model_dir, overrides, message
):
    args = [f"model.name_or_path={tiny_model_dir}", f"output_dir={tmp_path / 'run'}"]
    assert main(["train", *args, "eval.num_problems=8", *overrides]) == 2
    line = error_line(capsys)
    assert message in line and "num_prompts=0" not in line


def test_rows_without_an_answer_are_skipped_and_counted(tmp_path):
    rows = [
        {"question": "1+1?", "answer": "2"},
        {"question": "2+2?", "answer": None},
        {"question": "3+3?", "answer": ""},
        {"question": None, "answer": "5"},
    ]
    path = write_jsonl(tmp_path / "nulls.jsonl", rows)
    with pytest.warns(UserWarning, match="skipped 3 rows without a question or answer"):
        problems = load_math_problems(path, template="plain")
    assert [(p.prompt, p.answer) for p in problems] == [("1+1?", "2")]
    with pytest.raises(ValueError, match="no row with both a question and an answer"):
        with pytest.warns(UserWarning):
            load_math_problems(write_jsonl(tmp_path / "none.jsonl", rows[1:]))


def test_conflicting_duplicate_questions_are_counted(tmp_path):
    rows = [
        {"question": "1+1?", "answer": "2"},
        {"question": "1+1?", "answer": "3"},
        {"question": "1+1?", "answer": "2"},  # an exact repeat: no conflict
        {"question": "2+2?", "answer": "4"},
    ]
    with pytest.warns(UserWarning, match="1 repeated questions have a different answer"):
        problems = load_math_problems(write_jsonl(tmp_path / "dups.jsonl", rows))
    assert [p.answer for p in problems] == ["2", "4"]


def test_prompts_longer_than_the_context_are_counted(tmp_path, tiny_model_dir):
    from test_trainer import make_config

    from rlkit.trainer import Trainer

    long_question = "what is " + "1+" * 70 + "1?"  # > 128 characters: the tiny model's context
    rows = [{"question": long_question, "answer": "71"}] + [
        {"question": f"{i}+1?", "answer": str(i + 1)} for i in range(9)
    ]
    path = write_jsonl(tmp_path / "long.jsonl", rows)
    cfg = make_config(tmp_path / "run", tiny_model_dir, f"task.name={path}", "task.num_eval=2")
    with pytest.warns(UserWarning, match="1 of 10 prompts are longer than 124 tokens"):
        Trainer(cfg).close()


@pytest.mark.parametrize("tokens", [128, 10**20])
def test_max_new_tokens_beyond_the_models_context(tmp_path, capsys, tiny_model_dir, tokens):
    """The tiny Llama's context is 128 tokens: 128 new tokens leave no room for a prompt."""
    from test_trainer import tiny_overrides

    overrides = tiny_overrides(tmp_path / "run", tiny_model_dir, f"rollout.max_new_tokens={tokens}")
    message = (
        f"rollout.max_new_tokens={tokens} does not fit the context of "
        f"model.name_or_path={tiny_model_dir} (128 tokens, max_position_embeddings, the prompt "
        "included): set rollout.max_new_tokens below 128"
    )
    assert main(["train", *overrides]) == 2
    assert message in error_line(capsys)
    assert main(["plan", "--config", "tiny-cpu", *overrides]) == 2
    assert message in error_line(capsys, "plan")


# --------------------------------------------------------------------------- rewards
def odd_reward(completion: str, answer: str):
    """Module level so worker processes can unpickle it."""
    if completion == "huge":
        return 1e308  # finite in float64, inf in float32
    if completion == "bool":
        return True
    if completion == "text":
        return "1"
    if completion == "none":
        return None
    if completion == "mv-timeout":
        from math_verify.errors import TimeoutException

        raise TimeoutException("Timeout during parsing")
    return 1.0


@pytest.mark.parametrize("workers", [0, 1])
def test_odd_reward_values_are_counted_not_coerced(workers):
    completions = ["huge", "bool", "text", "none", "fine"]
    with RewardScorer(odd_reward, num_workers=workers, timeout_s=30) as scorer:
        batch = scorer.score(completions, ["1"] * len(completions))
    assert batch.rewards.tolist() == [0.0, 0.0, 0.0, 0.0, 1.0]
    assert (batch.num_errors, batch.num_timeouts) == (4, 0)


@pytest.mark.parametrize("workers", [0, 1])
def test_math_verify_timeout_is_a_timeout(workers):
    with RewardScorer(odd_reward, num_workers=workers, timeout_s=30) as scorer:
        batch = scorer.score(["mv-timeout", "fine"], ["1", "1"])
    assert batch.rewards.tolist() == [0.0, 1.0]
    assert (batch.num_errors, batch.num_timeouts) == (0, 1)


# ------------------------------------------------------------------------ estimators
@pytest.mark.parametrize("name", sorted(ESTIMATORS))
def test_estimators_never_emit_nan_for_huge_rewards(name):
    est = get_estimator(name)
    rewards = torch.tensor(
        [[MAX_ABS_REWARD, MAX_ABS_REWARD, MAX_ABS_REWARD], [-MAX_ABS_REWARD, 0.0, MAX_ABS_REWARD]],
        dtype=torch.float64,
    )
    for _ in range(3):  # history priors accumulate
        advantages = est(rewards, prompt_ids=["a", "b"]).advantages  # SPO keys by prompt
        assert torch.isfinite(advantages).all()
    # a constant group has no signal (the shrinkage baselines of EBPO and JSPO give it one, as
    # SPO's tracker; PPO's per-row input is the reward itself, its baseline the value head)
    if name not in ("ebpo", "jspo", "jspo_plus_plus", "jspo_page", "spo", "ppo"):
        assert advantages[0].abs().max() <= 1e-9 * MAX_ABS_REWARD
    with pytest.raises(ValueError, match=r"\|r\| <= 1e\+150 \(got 1e\+200\)"):
        est(torch.tensor([[1e200, -1e200]], dtype=torch.float64))


def test_json_file_as_one_document_or_as_lines(tmp_path):
    rows = [{"question": "1+1?", "answer": "2"}, {"question": "2+2?", "answer": "4"}]
    document = tmp_path / "doc.json"
    document.write_text(json.dumps(rows))
    lines = write_jsonl(tmp_path / "lines.json", rows)
    assert [p.answer for p in load_math_problems(document)] == ["2", "4"]
    assert [p.answer for p in load_math_problems(lines)] == ["2", "4"]
    broken = tmp_path / "broken.json"
    broken.write_text('[{"question": "1+1?",\n "answer": }]')
    with pytest.raises(ValueError, match="broken.json, line 1: malformed JSON"):
        load_math_problems(broken)
