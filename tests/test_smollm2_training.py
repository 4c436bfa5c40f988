"""RL steps on the real pretrained model (``builtin:smollm2-135m-instruct``, preset smollm2-cpu)
at the smallest scale that exercises them: 2 prompts × G = 4, 8 new tokens, LoRA r4.

Eight tokens are too few for the model to answer, so the reward is replaced by a deterministic
function of the completion text with five levels (its length modulo 5): a group's rewards are
almost never all equal, whatever the thread count does to the samples, so the advantages are
non-zero and every step moves the adapters."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from rlkit import rewards
from rlkit.config import load_config
from rlkit.metrics import read_metrics
from rlkit.models.gguf import SMOLLM2
from rlkit.models.loading import ADAPTER_WEIGHTS
from rlkit.trainer import Trainer


def length_mod_5(completion: str, answer: str) -> float:
    return (len(completion) % 5) / 4


@pytest.fixture
def smollm2_run(smollm2_cache, monkeypatch):
    """Builds a tiny smollm2-cpu config in the session's cache (where the model is converted)."""
    monkeypatch.setenv("RLKIT_CACHE", str(smollm2_cache))
    monkeypatch.setitem(rewards.REWARD_FUNCTIONS, "math_verify", length_mod_5)

    def make(run_dir, *overrides):
        return load_config(
            "smollm2-cpu",
            [
                f"output_dir={run_dir}",
                "steps=2",
                "model.lora_r=4",
                "model.lora_alpha=8",
                "optim.lr=1e-3",
                "rollout.num_prompts=2",
                "rollout.group_size=4",
                "rollout.max_new_tokens=8",
                "task.num_train=16",
                "task.num_eval=1",
                "eval.num_problems=1",
                "eval.k=1",
                "eval.every=0",
                "eval.at_start=false",
                "checkpoint_every=0",
                "tensorboard=false",
                "progress=false",
                *overrides,
            ],
        )

    return make


def lora_b(trainer) -> dict[str, torch.Tensor]:
    return {
        n: p.detach().clone() for n, p in trainer.policy.model.named_parameters() if "lora_B" in n
    }


def test_the_preset_trains_the_builtin_model_on_word_problems(tmp_path):
    cfg = load_config("smollm2-cpu", [f"output_dir={tmp_path}"])
    assert cfg.model.name_or_path == SMOLLM2 and cfg.model.mode == "lora"
    assert cfg.task.name == "word_problems" and cfg.task.chat_template
    assert cfg.task.reward == "math_verify"


@pytest.mark.slow
def test_one_qlora_step_moves_every_adapter_and_no_base_weight(smollm2_run, tmp_path):
    trainer = Trainer(smollm2_run(tmp_path, "model.mode=qlora", "steps=1"))
    try:
        model = trainer.policy.model
        base = {k: v.clone() for k, v in model.state_dict().items() if "lora_" not in k}
        trainer.step()
        after = {k: v for k, v in model.state_dict().items() if "lora_" not in k}
    finally:
        trainer.close()
    assert [n for n, b in lora_b(trainer).items() if not b.any()] == []
    assert [k for k in base if not torch.equal(base[k], after[k])] == []


class CrashAfterOneStep(Trainer):
    def step(self):
        if self.step_count == 1:
            raise KeyboardInterrupt
        return super().step()


def adapter(run_dir, step: int) -> dict[str, torch.Tensor]:
    return load_file(run_dir / "checkpoints" / f"step_{step:06d}" / "policy" / ADAPTER_WEIGHTS)


@pytest.mark.slow
def test_two_lora_steps_move_every_adapter_and_resume_exactly(smollm2_run, tmp_path):
    """EBPO with per-template priors: each of the two steps changes every LoRA-B matrix (they
    start at 0), and a run interrupted after step 1 and resumed ends bit for bit where the
    uninterrupted run ends, metrics and adapter alike."""
    common = ("checkpoint_every=1", "algo.estimator=ebpo", "algo.cluster_key=topic")
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    Trainer(smollm2_run(straight, *common)).train()
    first, second = adapter(straight, 1), adapter(straight, 2)
    b_names = [n for n in first if "lora_B" in n]
    assert len(b_names) == 30 * 7
    assert [n for n in b_names if not first[n].any()] == []
    assert [n for n in b_names if torch.equal(first[n], second[n])] == []

    interrupted = smollm2_run(resumed, *common)
    with pytest.raises(KeyboardInterrupt):
        CrashAfterOneStep(interrupted).train()
    Trainer(interrupted, resume=True).train()

    def metrics(run):
        return [
            {k: v for k, v in r.items() if not k.startswith("time/")} for r in read_metrics(run)
        ]

    assert [r["step"] for r in metrics(straight)] == [1, 2]
    assert metrics(resumed) == metrics(straight)
    final = adapter(resumed, 2)
    assert [n for n in second if not torch.equal(second[n], final[n])] == []
