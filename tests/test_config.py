"""Config loading, overrides and validation: bad input fails before any work, naming the key."""

from __future__ import annotations

import pytest

from rlkit.config import TrainConfig, inactive_clips, load_config, preset_names


def test_presets_load():
    assert {"tiny-cpu", "qwen3-8b-qlora", "llama3-8b-qlora"} <= set(preset_names())
    for name in preset_names():
        cfg = load_config(name)
        assert isinstance(cfg, TrainConfig)
    qwen = load_config("qwen3-8b-qlora")
    assert (qwen.model.mode, qwen.model.compute_dtype, qwen.rollout.group_size) == (
        "qlora",
        "bfloat16",
        8,
    )
    assert load_config("llama3-8b-qlora").rollout.group_size == 4


def test_default_is_tiny_cpu():
    cfg = load_config()
    assert cfg.model.name_or_path == "builtin:tiny" and cfg.task.name == "arithmetic"


def test_overrides_are_typed_and_nested():
    cfg = load_config(
        "tiny-cpu",
        [
            "algo.estimator=ebpo",
            "algo.options={prior: batch}",
            "rollout.group_size=4",
            "optim.lr=1e-5",
            "agpo.enabled=true",
        ],
    )
    assert cfg.algo.estimator == "ebpo" and cfg.algo.options == {"prior": "batch"}
    assert cfg.rollout.group_size == 4 and cfg.optim.lr == 1e-5 and cfg.agpo.enabled is True


@pytest.mark.parametrize(
    "override, message",
    [
        ("rollout.grup_size=4", "unknown config key rollout.grup_size"),
        ("nonsense=1", "unknown config key nonsense"),
        ("algo.estimator=ppo", "algo.estimator must be one of"),
        ("rollout.group_size=0", "rollout.group_size must be > 0"),
        ("rollout.group_size=two", "rollout.group_size must be an integer"),
        ("loss.loss_agg=sum", "loss.loss_agg must be one of"),
        ("loss.kl_estimator=k2", "loss.kl_estimator must be one of"),
        (
            "loss.ratio_temperature=hot",
            "loss.ratio_temperature must be 'sampling' or a positive number",
        ),
        ("agpo.probe=half", "agpo.probe must be one of"),
        ("rollout.top_p=1.5", "rollout.top_p must be in"),
        ("optim.lr=-1", "optim.lr must be > 0"),
        ("model.mode=int8", "mode"),
        ("rollout.order=random", "rollout.order must be one of"),
        ("agpo.enabled=maybe", "agpo.enabled must be true or false"),
        ("rollout", "must look like key=value"),
        ("rollout.generation_batch_size=-1", "rollout.generation_batch_size must be >= 0"),
        ("eval.batch_size=0", "eval.batch_size must be > 0"),
        ("optim.logprob_chunk_size=-2", "optim.logprob_chunk_size must be >= 0"),
        ("optim.logprob_micro_batch_size=-1", "optim.logprob_micro_batch_size must be >= 0"),
        ("eval.at_start=sometimes", "eval.at_start must be true or false"),
        ("task.shift={step: 0, arithmetic: {}}", "task.shift.step must be an integer >= 1"),
        (
            "task.shift={step: 5, arithmetic: {topics: [div]}}",
            r"^task\.shift\.arithmetic: topics: unknown topic 'div'",
        ),
        (
            "task.shift={step: 5, arithmetic: {topcs: [mul]}}",
            r"^unknown config key task\.shift\.arithmetic\.topcs; known",
        ),
        ("task.shift={step: 5, arithmetic: {}, when: 3}", "unknown config key task.shift.when"),
        ("task.shift={step: 5}", "task.shift.arithmetic must be a mapping"),
        ("task.shift={step: 100, arithmetic: {}}", r"task.shift.step \(100\) must be below steps"),
    ],
)
def test_bad_values_name_the_key(override, message):
    with pytest.raises(ValueError, match=message):
        load_config("tiny-cpu", [override])


def test_unknown_preset_lists_known_ones():
    with pytest.raises(ValueError, match="unknown preset 'tiny-gpu'.*tiny-cpu"):
        load_config("tiny-gpu")


def test_yaml_file_and_bad_top_level(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("steps: 3\nalgo: {estimator: rloo}\n")
    cfg = load_config(str(path))
    assert cfg.steps == 3 and cfg.algo.estimator == "rloo"
    path.write_text("- a\n- b\n")
    with pytest.raises(ValueError, match="mapping"):
        load_config(str(path))
    path.write_text("algo: 3\n")
    with pytest.raises(ValueError, match="algo must be a mapping"):
        load_config(str(path))


def test_agpo_dispersion_and_an_explicit_estimator_dispersion_must_agree():
    agree = ["algo.estimator=agpo", "agpo.dispersion=mad", "algo.options={dispersion: mad}"]
    assert load_config("tiny-cpu", agree).agpo.dispersion == "mad"
    conflict = ["algo.estimator=agpo", "agpo.dispersion=iqr", "algo.options={dispersion: mad}"]
    with pytest.raises(ValueError, match=r"agpo\.dispersion.*algo\.options\.dispersion"):
        load_config("tiny-cpu", conflict)


def test_task_shift_refuses_the_difficulty_curriculum_and_other_tasks():
    shift = "task.shift={step: 5, arithmetic: {topics: [mul]}}"
    with pytest.raises(ValueError, match="rollout.order=difficulty"):
        load_config("tiny-cpu", [shift, "rollout.order=difficulty"])
    with pytest.raises(ValueError, match="task.shift only applies to task.name=arithmetic"):
        load_config("tiny-cpu", [shift, "task.name=gsm8k"])


def test_shared_prompt_forward_refuses_gradient_checkpointing():
    with pytest.raises(
        ValueError, match="optim.share_prompt_forward=true with model.gradient_checkpointing"
    ):
        load_config(
            "tiny-cpu", ["optim.share_prompt_forward=true", "model.gradient_checkpointing=true"]
        )
    assert load_config("tiny-cpu", ["optim.share_prompt_forward=true"]).optim.share_prompt_forward


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ([], []),  # the default symmetric ε: nothing was asked of it
        (["loss.eps_high=0.28"], ["loss.eps_high=0.28 (loss.eps_low=0.2)"]),
        (["loss.dual_clip=3"], ["loss.dual_clip=3"]),
        (["algo.estimator=agpo", "agpo.enabled=true"], ["agpo.adaptive_clip=true"]),
        (["algo.estimator=agpo", "agpo.enabled=true", "agpo.adaptive_clip=false"], []),
        (["loss.dual_clip=3", "optim.mini_batch_size=256"], ["loss.dual_clip=3"]),  # all rows
        (["loss.dual_clip=3", "optim.mini_batch_size=64"], []),  # 4 mini-batches of 256 rows
        (["loss.eps_high=0.28", "optim.update_epochs=2"], []),
    ],
)
def test_clips_that_cannot_act_are_named(overrides, expected):
    """tiny-cpu: 32 prompts × 8 = 256 rows, one epoch over one mini-batch (docs/algorithms.md §4)."""
    assert inactive_clips(load_config("tiny-cpu", overrides)) == expected


def test_paths_expand_home_and_environment_variables(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("RLKIT_TEST_RUNS", str(tmp_path / "runs"))
    (tmp_path / "model").mkdir()
    (tmp_path / "runs").mkdir()
    (tmp_path / "data.jsonl").write_text('{"question": "1+1?", "answer": "2"}\n')
    cfg = load_config(
        "tiny-cpu",
        [
            "output_dir=~/run",
            "model.name_or_path=$HOME/model",
            "task.name=~/data.jsonl",
            "task.eval_name=${RLKIT_TEST_RUNS}/../data.jsonl",
        ],
    )
    assert cfg.output_dir == str(tmp_path / "run")
    assert cfg.model.name_or_path == str(tmp_path / "model")
    assert cfg.task.name == str(tmp_path / "data.jsonl")
    assert cfg.task.eval_name == str(tmp_path / "runs" / ".." / "data.jsonl")
    assert load_config("tiny-cpu", ["output_dir=$RLKIT_TEST_RUNS/a"]).output_dir == str(
        tmp_path / "runs" / "a"
    )
    with pytest.raises(
        ValueError,
        match=r"output_dir='\$RLKIT_NO_SUCH_VARIABLE/x' names an environment variable that is "
        "not set",
    ):
        load_config("tiny-cpu", ["output_dir=$RLKIT_NO_SUCH_VARIABLE/x"])
