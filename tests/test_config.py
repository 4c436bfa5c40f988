"""Config loading, overrides and validation: bad input fails before any work, naming the key."""

from __future__ import annotations

import pytest

from rlkit.config import TrainConfig, load_config, preset_names
from rlkit.methods import build_method
from rlkit.pass_plan import PassPlan
from rlkit.tasks.loader import check_sizes, load_problems


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


BUILT_IN_TASKS = ("arithmetic", "word_problems")  # generated here; the others need a dataset hub


@pytest.mark.parametrize(
    "name", [n for n in preset_names() if load_config(n).task.name in BUILT_IN_TASKS]
)
def test_a_built_in_task_preset_fits_its_splits(name):
    """A preset whose eval.num_problems outgrows its held-out split fails at the run's start
    (smollm2-cpu asked for 64 of 61, smollm2-gpu for 400 of 261)."""
    cfg = load_config(name)
    train, held_out = load_problems(cfg.task)
    check_sizes(cfg, held_out, train)


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
    assert cfg.rollout.group_size == 4 and cfg.optim.lr == 1e-5 and cfg.algo.method == "agpo"


@pytest.mark.parametrize(
    "overrides",
    [["seed.x=1"], ["algo.options=3", "algo.options.prior=batch"]],
)
def test_an_override_into_a_value_names_it(overrides):
    with pytest.raises(ValueError, match=rf"override {overrides[-1]!r}: \w+ is not a section"):
        load_config("tiny-cpu", overrides)


@pytest.mark.parametrize(
    "override, message",
    [
        ("rollout.grup_size=4", "unknown config key rollout.grup_size"),
        ("seed=-1", r"seed must be in \[0, 2\*\*32\), got -1"),
        ("seed=4294967296", r"seed must be in \[0, 2\*\*32\), got 4294967296"),
        ("nonsense=1", "unknown config key nonsense"),
        ("algo.estimator=a2c", "algo.estimator must be one of"),
        ("rollout.group_size=0", "rollout.group_size must be > 0"),
        ("rollout.group_size=two", "rollout.group_size must be an integer"),
        ("loss.loss_agg=sum", "loss.loss_agg must be one of"),
        ("loss.kl_estimator=k2", "loss.kl_estimator must be one of"),
        (
            "loss.ratio_temperature=hot",
            "loss.ratio_temperature must be 'sampling' or a positive number",
        ),
        ("agpo.probe=half", "agpo.probe must be one of"),
        ("agpo.mad_median=upper", r"agpo\.mad_median must be one of \['midpoint', 'lower'\]"),
        (
            "agpo.ema_update=per_step",
            r"agpo\.ema_update must be one of \['per_prompt', 'per_minibatch'\]",
        ),
        ("rollout.top_p=1.5", "rollout.top_p must be in"),
        ("token_budget=-1", "token_budget must be >= 0, got -1"),
        ("token_budget=1e6", "token_budget must be an integer"),
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


def test_agpo_mad_median_and_an_explicit_estimator_mad_median_must_agree():
    mad = ["algo.estimator=agpo", "agpo.dispersion=mad"]
    conflict = [*mad, "agpo.mad_median=lower", "algo.options={mad_median: midpoint}"]
    with pytest.raises(ValueError, match=r"agpo\.mad_median.*algo\.options\.mad_median"):
        load_config("tiny-cpu", conflict)
    with pytest.raises(ValueError, match=r"agpo\.mad_median.*algo\.options\.mad_median"):
        load_config("tiny-cpu", [*mad, "algo.options={mad_median: lower}"])


@pytest.mark.parametrize("estimator", ["agpo", "grpo"])
def test_agpo_mad_median_reaches_the_probe_and_the_agpo_advantage(estimator):
    overrides = [f"algo.estimator={estimator}", "agpo.enabled=true", "agpo.dispersion=mad"]
    cfg = load_config("tiny-cpu", [*overrides, "agpo.mad_median=lower"])
    method = build_method(cfg)
    default = build_method(load_config("tiny-cpu", overrides))
    assert (method.mad_median, default.mad_median) == ("lower", "midpoint")  # the probe's σ̂
    if estimator == "agpo":  # and the advantage's dispersion
        assert (method.estimator.mad_median, default.estimator.mad_median) == ("lower", "midpoint")
    else:
        assert not hasattr(method.estimator, "mad_median")


def test_a_token_budget_refuses_stale_rollouts():
    """Batches drawn ahead (rollout.lag) would be generated past the stop and never counted."""
    with pytest.raises(ValueError, match=r"^token_budget=100 with rollout\.lag=1: the batches"):
        load_config("tiny-cpu", ["token_budget=100", "rollout.lag=1"])
    assert load_config("tiny-cpu", ["token_budget=100"]).token_budget == 100


def test_agpo_ema_update_reaches_both_controllers_and_only_from_its_key():
    """docs/algorithms.md §3, "Running averages": one rule for Ū and H̄_ref, set by
    agpo.ema_update alone (the controllers' own kwargs refuse it)."""
    from rlkit import controllers

    on = ["agpo.enabled=true"]
    default = build_method(load_config("tiny-cpu", on))
    snapshot = build_method(load_config("tiny-cpu", [*on, "agpo.ema_update=per_minibatch"]))
    assert default.temperature_ctl.centre is controllers.centre_per_prompt
    assert default.clip_ctl.relative_entropy is controllers.relative_entropy_batch_mean
    assert snapshot.temperature_ctl.centre is controllers.centre_per_minibatch
    assert snapshot.clip_ctl.relative_entropy is controllers.relative_entropy_snapshot
    for key in ("temperature", "clip"):
        with pytest.raises(
            ValueError,
            match=rf"^agpo\.{key}\.ema_update is set by the trainer; use agpo\.ema_update",
        ):
            load_config("tiny-cpu", [*on, f"agpo.{key}={{ema_update: per_minibatch}}"])


def test_task_shift_refuses_the_difficulty_curriculum_and_other_tasks():
    shift = "task.shift={step: 5, arithmetic: {topics: [mul]}}"
    with pytest.raises(ValueError, match="rollout.order=difficulty"):
        load_config("tiny-cpu", [shift, "rollout.order=difficulty"])
    with pytest.raises(ValueError, match="task.shift only applies to task.name=arithmetic"):
        load_config("tiny-cpu", [shift, "task.name=gsm8k"])


def test_share_prompt_forward_is_auto_by_default_and_takes_true_false_or_auto():
    assert load_config("tiny-cpu").optim.share_prompt_forward == "auto"
    for value in (True, False, "auto"):
        cfg = load_config("tiny-cpu", [f"optim.share_prompt_forward={str(value).lower()}"])
        assert cfg.optim.share_prompt_forward == value
    for bad in ("always", "1"):
        with pytest.raises(ValueError, match=f"optim.share_prompt_forward.*{bad}"):
            load_config("tiny-cpu", [f"optim.share_prompt_forward={bad}"])


def test_shared_prompt_forward_combines_with_gradient_checkpointing():
    """The read-only prompt cache (rlkit.logprobs._PromptCache) lets the 8B presets use both."""
    both = ["optim.share_prompt_forward=true", "model.gradient_checkpointing=true"]
    for cfg in (
        load_config("tiny-cpu", both),
        load_config("qwen3-8b-qlora"),
        load_config("llama3-8b-qlora"),
    ):
        assert cfg.optim.share_prompt_forward and cfg.model.gradient_checkpointing


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
        (["loss.loss_mode=kl_cov"], ["loss.loss_mode=kl_cov"]),  # its penalty is 0 at ρ = 1
        (["loss.loss_mode=kl_cov", "optim.mini_batch_size=64"], []),
        (["loss.loss_mode=clip_cov"], []),  # zeroing PG terms acts at ρ = 1 too
    ],
)
def test_clips_that_cannot_act_are_named(overrides, expected):
    """tiny-cpu: 32 prompts × 8 = 256 rows, one epoch over one mini-batch (docs/algorithms.md §4)."""
    cfg = load_config("tiny-cpu", overrides)
    assert list(PassPlan.from_config(cfg, build_method(cfg)).inactive_clips) == expected


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
    (tmp_path / "my.yaml").write_text("steps: 3\n")
    assert load_config("~/my.yaml").steps == 3  # a config path too
    assert load_config("tiny-cpu", ["output_dir=$RLKIT_TEST_RUNS/a"]).output_dir == str(
        tmp_path / "runs" / "a"
    )
    with pytest.raises(
        ValueError,
        match=r"output_dir='\$RLKIT_NO_SUCH_VARIABLE/x' names an environment variable that is "
        "not set",
    ):
        load_config("tiny-cpu", ["output_dir=$RLKIT_NO_SUCH_VARIABLE/x"])


AGPO_ON_QWEN = ["algo.estimator=agpo", "algo.options={}", "agpo.enabled=true"]


@pytest.mark.parametrize(
    ("preset", "overrides", "message"),
    [
        (  # the case: AGPO's adaptive ε would drop the preset's clip-higher
            "qwen3-8b-qlora",
            AGPO_ON_QWEN,
            r"^loss\.eps_high=0\.28 has no effect with algo\.method=agpo and "
            r"agpo\.adaptive_clip=true: AGPO's clip radius replaces it",
        ),
        (
            "tiny-cpu",
            ["agpo.clip={alpha: 0.0}"],
            r"^agpo\.clip=\{'alpha': 0\.0\} is read only by the method agpo \(algo\.method=agpo\)",
        ),
        (
            "tiny-cpu",
            ["agpo.probe=reuse"],
            r"^agpo\.probe='reuse' is read only by the method agpo \(algo\.method=agpo\)",
        ),
        (
            "tiny-cpu",
            ["agpo.dispersion=mad"],
            r"^agpo\.dispersion='mad' is read only by the estimator agpo .*"
            r"this config's estimator is grpo and its method is grpo",
        ),
        (
            "tiny-cpu",
            ["agpo.enabled=true", "agpo.mad_median=lower"],
            r"^agpo\.mad_median='lower' is read only with agpo\.dispersion=mad .*"
            r"this config has agpo\.dispersion=std",
        ),
        (
            "tiny-cpu",
            ["agpo.mad_median=lower"],
            r"^agpo\.mad_median='lower' is read only by the estimator agpo .*"
            r"this config's estimator is grpo and its method is grpo",
        ),
        (
            "tiny-cpu",
            ["agpo.enabled=true", "agpo.adaptive_clip=false", "agpo.clip={gamma: 0.0}"],
            r"^agpo\.clip=.* agpo\.adaptive_clip=false",
        ),
        (
            "tiny-cpu",
            ["agpo.enabled=true", "agpo.adaptive_temperature=false", "agpo.temperature={lam: 0.3}"],
            r"^agpo\.temperature=.* agpo\.adaptive_temperature=false",
        ),
        (
            "tiny-cpu",
            ["agpo.ema_update=per_minibatch"],
            r"^agpo\.ema_update=.*agpo \(algo\.method=agpo\).*this config's method is grpo",
        ),
        (
            "tiny-cpu",
            [
                "agpo.enabled=true",
                "agpo.adaptive_temperature=false",
                "agpo.adaptive_clip=false",
                "agpo.ema_update=per_minibatch",
            ],
            r"^agpo\.ema_update=.*this config has agpo\.adaptive_temperature=false and "
            r"agpo\.adaptive_clip=false",
        ),
        (
            "tiny-cpu",
            ["algo.cluster_key=topic"],
            r"^algo\.cluster_key='topic' .*ebpo .*this config's estimator is grpo",
        ),
        ("tiny-cpu", ["rollout.max_gen_batches=5"], r"rollout\.dynamic_sampling=false"),
        ("tiny-cpu", ["rollout.overlong_penalty=0.5"], r"rollout\.overlong_buffer=0"),
        (
            "tiny-cpu",
            ["rollout.vllm_memory=0.5"],
            r"^rollout\.vllm_memory=0\.5 is read only by the engine vllm .*this config's engine is hf",
        ),
        (
            "qwen3-8b-qlora",
            ["rollout.engine=vllm"],
            r"^rollout\.generation_batch_size='auto' is read only by the engines hf .*"
            r"this config's engine is vllm",
        ),
        ("tiny-cpu", ["loss.kl_estimator=k1"], r"^loss\.kl_estimator='k1' .*loss\.kl_coef=0"),
        (
            "tiny-cpu",
            ["model.lora_r=4"],
            r"^model\.lora_r=4 is read only with model\.mode=lora or qlora; .*model\.mode=full",
        ),
        (
            "qwen3-8b-qlora",
            ["model.mode=lora", "model.quant_type=fp4"],
            r"^model\.quant_type='fp4' .*model\.mode=lora",
        ),
        ("tiny-cpu", ["task.template=boxed"], r"^task\.template='boxed' .*task\.name=arithmetic"),
        ("tiny-cpu", ["task.reward_timeout_s=2"], r"task\.reward_workers=0"),
        (
            "tiny-cpu",
            ["algo.estimator=ebpo", "algo.options={prior: batch, prior_decay: 0.9}"],
            r"^algo\.options\.prior_decay=0\.9 is read only with algo\.options\.prior other than "
            r"batch .*this config has algo\.options\.prior=batch",
        ),
        (
            "tiny-cpu",
            ["algo.estimator=ebpo", "algo.options={min_cluster_count: 2}"],
            r"^algo\.options\.min_cluster_count=2 is read only with algo\.cluster_key set .*"
            r"algo\.cluster_key=None",
        ),
    ],
)
def test_a_setting_another_one_switches_off_is_refused_naming_both(preset, overrides, message):
    with pytest.raises(ValueError, match=message):
        load_config(preset, overrides)


@pytest.mark.parametrize(
    "overrides",
    [
        [*AGPO_ON_QWEN, "loss.eps_high=0.2"],  # one source: AGPO's ε
        [*AGPO_ON_QWEN, "agpo.adaptive_clip=false"],  # one source: the loss's clip-higher
        [*AGPO_ON_QWEN, "loss.eps_high=0.2", "agpo.clip={eps_base: 0.28}"],
        ["rollout.engine=vllm", "rollout.generation_batch_size=0", "rollout.vllm_memory=0.5"],
        ["loss.kl_estimator=k1", "optim.skip_redundant_passes=false"],  # logs the kl metric
        ["task.reward_workers=2", "task.reward_timeout_s=2"],
    ],
)
def test_each_parameter_from_one_source_loads(overrides):
    load_config("qwen3-8b-qlora", overrides)


def test_off_is_a_word_and_only_true_or_false_a_boolean():
    """YAML 1.2's booleans: ``loss.tis_cap=off`` is the setting's word "off" (YAML 1.1, PyYAML's
    default, would make it False and refuse it), and ``off`` for a true/false setting is refused
    naming the key."""
    cfg = load_config("tiny-cpu", ["loss.tis_cap=off", "tensorboard=False"])
    assert (cfg.loss.tis_cap, cfg.tensorboard) == ("off", False)
    with pytest.raises(ValueError, match="tensorboard must be true or false, got 'off'"):
        load_config("tiny-cpu", ["tensorboard=off"])


def test_qlora_under_fsdp2_is_refused_with_what_works():
    with pytest.raises(ValueError) as err:
        load_config("tiny-cpu", ["model.mode=qlora", "parallel.strategy=fsdp2"])
    message = str(err.value)
    assert "parallel.strategy=ddp with model.mode=qlora" in message
    assert "parallel.strategy=fsdp2 with model.mode=lora on the unquantized model" in message
    assert "bnb_4bit_quant_storage" in message and "not wired in" in message
