"""The step's stages (rlkit/batch.py, logprobs.py, update.py, methods.py, dist.py, phases.py):
their contracts, and the layout rules of issue 18 (one reader of the method's config, no method
branch in the trainer, no stage importing the trainer)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

from rlkit.batch import PolicyPass, TrainBatch
from rlkit.clip_rules import FixedClip
from rlkit.config import load_config
from rlkit.dist import Local
from rlkit.methods import AGPO, Method, build_method
from rlkit.pass_plan import PassPlan
from rlkit.phases import Phases
from rlkit.rollout_batch import RolloutBatch
from rlkit.update import StepMeans

RLKIT = Path(__file__).resolve().parents[1] / "rlkit"
STAGES = ("batch", "collect", "dist", "logprobs", "methods", "phases", "step_metrics", "update")


def rollouts(rows: int, width: int = 3) -> RolloutBatch:
    ids = torch.arange(rows * (2 + width)).view(rows, 2 + width)
    return RolloutBatch(
        input_ids=ids,
        attention_mask=torch.ones_like(ids, dtype=torch.bool),
        completion_mask=torch.ones(rows, width, dtype=torch.bool),
        prompt_length=2,
        temperatures=torch.linspace(0.5, 1.5, rows),
        lengths=torch.full((rows,), width),
        truncated=torch.zeros(rows, dtype=torch.bool),
        completion_texts=[str(i) for i in range(rows)],
    )


def test_train_batch_select_indexes_every_row_field_alike():
    rows = 6
    batch = TrainBatch(
        rollouts(rows),
        advantages=torch.arange(rows, dtype=torch.float32),
        ratio_temps=torch.arange(rows, dtype=torch.float32) + 10,
        group_size=3,
        old=PolicyPass(torch.arange(rows * 3.0).view(rows, 3), torch.ones(rows, 3)),
        ref_logp=-torch.arange(rows * 3.0).view(rows, 3),
    )
    idx = torch.tensor([4, 1])
    sub = batch.select(idx)
    assert sub.rollouts.completion_texts == ["4", "1"]
    assert torch.equal(sub.advantages, torch.tensor([4.0, 1.0]))
    assert torch.equal(sub.ratio_temps, torch.tensor([14.0, 11.0]))
    assert torch.equal(sub.old.logp, batch.old.logp[idx])
    assert torch.equal(sub.ref_logp, batch.ref_logp[idx])
    assert batch.num_prompts == 2
    on_policy = TrainBatch(batch.rollouts, batch.advantages, batch.ratio_temps, 3)
    assert on_policy.select(idx).old is None and on_policy.select(idx).ref_logp is None


def test_step_means_keep_their_key_order_and_average_over_optimizer_steps():
    means = StepMeans(["loss", "grad_norm"])
    assert means.result() == {"loss": 0.0, "grad_norm": 0.0, "update/optimizer_steps": 0}
    for loss in (1.0, 3.0):
        means.add("grad_norm", 2.0)
        means.add("loss", loss)
        means.steps += 1
    assert list(means.result().items()) == [
        ("loss", 2.0),
        ("grad_norm", 2.0),
        ("update/optimizer_steps", 2),
    ]


def test_local_collective_is_the_identity():
    x = torch.arange(4)
    local = Local()
    assert (local.rank, local.world) == (0, 1)
    for op in (local.all_gather, local.all_reduce_sum, local.my_rows):
        assert op(x) is x
    assert local.all_gather_object("a") == ["a"]


def test_phase_hooks_wrap_nested_phases_and_time_them():
    phases, seen = Phases(), []

    class Hook:
        def __init__(self, name):
            self.name = name

        def __enter__(self):
            seen.append(("enter", self.name))

        def __exit__(self, *exc):
            seen.append(("exit", self.name))

    phases.add_hook(Hook)
    with phases("update"), phases("train"):
        pass
    assert seen == [("enter", "update"), ("enter", "train"), ("exit", "train"), ("exit", "update")]
    assert set(phases.take()) == {"update", "train"} and phases.take() == {}


@pytest.mark.parametrize(
    "overrides, method, on_policy",
    [
        ([], Method, True),
        (["optim.update_epochs=2"], Method, False),
        (["algo.estimator=ebpo", "optim.mini_batch_size=64"], Method, False),
        (["agpo.enabled=true", "optim.micro_batch_size=64"], AGPO, False),  # ε needs every row
        (
            ["agpo.enabled=true", "agpo.adaptive_clip=false", "optim.micro_batch_size=64"],
            AGPO,
            True,
        ),
        (["optim.skip_redundant_passes=false"], Method, False),
    ],
)
def test_pass_plan_is_decided_from_the_config_and_the_method(overrides, method, on_policy):
    # 32 prompts × 8 = 256 rows; a Linear stands in for the policy, which cannot share prompts
    cfg = load_config("tiny-cpu", [*overrides, "optim.share_prompt_forward=false"])
    built = build_method(cfg)
    assert type(built) is method
    plan = PassPlan.from_config(cfg, built).for_model(torch.nn.Linear(2, 2))
    assert plan.on_policy(256) == on_policy
    assert plan.entropy  # logged by default; AGPO needs it regardless
    assert plan.step_kl == (method is AGPO)
    assert plan.reference == ("optim.skip_redundant_passes=false" in overrides)


def test_fixed_clip_gives_the_loss_radii_per_prompt():
    low, high = FixedClip(0.2, 0.28, 3)(None)
    assert torch.equal(low, torch.full((3,), 0.2)) and torch.equal(high, torch.full((3,), 0.28))


def sources(module: str) -> list[Path]:
    """``rlkit/<module>.py``, or every file of the package ``rlkit/<module>/``."""
    path = RLKIT / module
    return sorted(path.glob("*.py")) if path.is_dir() else [path.with_suffix(".py")]


def parse(module: str) -> ast.Module:
    return ast.Module(
        [node for path in sources(module) for node in ast.parse(path.read_text()).body], []
    )


def reads(module: str, section: str) -> bool:
    """Whether ``rlkit/<module>.py`` reads ``<anything>.<section>.<field>`` of a config."""
    tree = parse(module)
    return any(
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Attribute)
        and node.value.attr == section
        for node in ast.walk(tree)
    )


def test_the_methods_package_is_the_only_reader_of_the_methods_config():
    modules = [
        str(p.relative_to(RLKIT).with_suffix(""))
        for p in RLKIT.rglob("*.py")
        if p.parts[len(RLKIT.parts)] not in ("config", "methods")
    ]
    assert not [m for m in modules if reads(m, "algo") or reads(m, "agpo")]


def test_no_stage_imports_the_trainer():
    for stage in STAGES:
        tree = parse(stage)
        modules = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        modules |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        assert "rlkit.trainer" not in modules, stage
