"""One process of the data-parallel tests (tests/test_data_parallel.py).

    python tests/dp_worker.py OUT MODE [key=value ...]            # one process
    torchrun --nproc_per_node 2 tests/dp_worker.py OUT MODE ...   # two, over gloo

MODE ``record`` trains as usual and writes every generation call's rollouts to OUT/rollouts.pt;
``replay:PATH`` trains on those of PATH instead of generating: each rank takes its contiguous share of each
recorded call (and checks that it asked for exactly those prompts at those temperatures), so a
two-process run sees the same global batches as the one-process run that recorded them; ``run``
trains as usual; ``cases:JSON`` trains, one after the other in the same processes, every run
the file names (``{"name": {"overrides": [...], "resume": false}}``) into OUT/name, with the
common ``key=value`` overrides first (one launch for many runs). Every rank writes
OUT/rank{r}.pt: per step the global advantages, the method's state, the kept problems and
every rank's completions, then the final trainable weights, the evaluations and the last one's scores problem by problem.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as tdist
from transformers.models.llama.modeling_llama import LlamaRMSNorm

import rlkit.collect
from rlkit.config import load_config
from rlkit.dist import launched_world
from rlkit.trainer import Trainer

BASE = [
    "steps=3",
    "rollout.num_prompts=4",
    "rollout.group_size=4",
    "rollout.max_new_tokens=4",
    "task.num_train=64",
    "task.num_eval=12",
    "eval.num_problems=12",
    "eval.k=2",
    "eval.batch_size=8",
    "eval.at_start=false",
    "checkpoint_every=0",
    "tensorboard=false",
    "progress=false",
]


def float64_rms_norm() -> None:
    """Llama's RMSNorm in the input's dtype: transformers rounds it to float32 even in a float64
    model, and Adam turns that rounding into weight differences of 1e-7 on near-zero gradients
    (a LoRA A matrix while B is still near 0), which would blur what these tests compare."""

    def forward(self, hidden_states):
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        return self.weight * (hidden_states * torch.rsqrt(variance + self.variance_epsilon))

    LlamaRMSNorm.forward = forward


def record_generation(path: Path) -> None:
    calls, generate = [], rlkit.collect.Collector.generate

    def recorded(collector, prompts, temps):
        out = generate(collector, prompts, temps)
        calls.append({"prompts": list(prompts), "rollouts": out.to("cpu")})
        torch.save(calls, path)
        return out

    rlkit.collect.Collector.generate = recorded


def replay_generation(path: Path, rank: int) -> None:
    calls = iter(torch.load(path, weights_only=False))

    def replayed(collector, prompts, temps):
        call, n = next(calls), len(prompts)
        rows = torch.arange(rank * n, (rank + 1) * n)
        if call["prompts"][rank * n : (rank + 1) * n] != list(prompts):
            raise AssertionError(f"rank {rank} asked for other prompts than the recorded run")
        rollouts = call["rollouts"].select(rows)
        if not torch.equal(rollouts.temperatures.float(), temps.float().cpu()):
            raise AssertionError(f"rank {rank} sampled at other temperatures: {temps}")
        return rollouts

    rlkit.collect.Collector.generate = replayed


def main(out: str, mode: str, *overrides: str) -> None:
    torch.set_num_threads(1)
    float64_rms_norm()
    out = Path(out)
    if launched_world() > 1:  # the process group outlives the trainer (FSDP2's full weights)
        tdist.init_process_group("gloo")
    rank = tdist.get_rank() if tdist.is_initialized() else 0
    if mode.startswith("cases:"):
        cases = json.loads(Path(mode.removeprefix("cases:")).read_text())
        for name, case in cases.items():
            (out / name).mkdir(parents=True, exist_ok=True)
            train(out / name, rank, [*overrides, *case["overrides"]], case.get("resume", False))
    else:
        if mode == "record":
            record_generation(out / "rollouts.pt")
        elif mode.startswith("replay:"):
            replay_generation(Path(mode.removeprefix("replay:")), rank)
        train(out, rank, list(overrides))
    if tdist.is_initialized():
        tdist.destroy_process_group()


def train(out: Path, rank: int, overrides: list[str], resume: bool = False) -> None:
    """One run in OUT/run (``resume``: continued from its latest checkpoint), its record in
    OUT/rank{rank}.pt."""
    cfg = load_config("tiny-cpu", [*BASE, f"output_dir={out / 'run'}", *overrides])
    trainer = Trainer(cfg, resume=resume, overwrite=not resume)
    steps, method, dist = [], trainer.method, trainer.dist
    advantages, draw = method.advantages, trainer.collector.draw

    def seen_advantages(rewards, problems):
        result = advantages(rewards, problems)
        steps[-1]["advantages"] = result.advantages.clone()
        return result

    def seen_draw(*args):
        groups, stats = draw(*args)
        gather = dist.all_gather_object
        steps.append(
            {
                "kept": [p.id for part in gather(groups.problems) for p in part],
                "texts": [t for part in gather(groups.rollouts.completion_texts) for t in part],
            }
        )
        return groups, stats

    method.advantages, trainer.collector.draw = seen_advantages, seen_draw
    step = trainer.step

    def seen_step():
        metrics = step()
        steps[-1]["state"] = method.state_dict()
        steps[-1]["metrics"] = {k: v for k, v in metrics.items() if not k.startswith("time/")}
        return metrics

    trainer.step = seen_step
    weights, close = {}, trainer.close

    def close_after_weights():  # the trainer drops its FSDP2 wrapper as it closes
        with trainer.full_weights():  # FSDP2: the whole weights are the parameters only here
            named = list(trainer.policy.model.named_parameters())
            if trainer.policy.value_head is not None:  # PPO's
                head = trainer.policy.value_head.named_parameters()
                named += [(f"value_head.{n}", p) for n, p in head]
            weights.update({n: p.detach().clone() for n, p in named if p.requires_grad})
        close()

    trainer.close = close_after_weights
    evals = trainer.train()
    record = {"steps": steps, "weights": weights, "evals": evals}
    record["eval_scores"] = trainer.eval_scores  # the last evaluation's, problem by problem
    torch.save(record, out / f"rank{rank}.pt")


if __name__ == "__main__":
    main(*sys.argv[1:])
