"""Evaluation: greedy accuracy, Pass@1 averaged over k samples, and Maj@k.

Sampling here runs under its own seed (``generate_rollouts(generator_seed=…)``), so evaluating
never disturbs the training RNG stream and every method is scored on the same random draws.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from rlkit.answers import extract_answer
from rlkit.rollout import generate_rollouts
from rlkit.seeding import seeded
from rlkit.tasks.base import Problem

EVAL_SEED = 1234


def generate_and_score(
    model,
    tokenizer,
    problems: Sequence[Problem],
    scorer,
    k: int = 1,
    temperature: float = 0.0,
    max_new_tokens: int = 8,
    batch_size: int = 512,
    seed: int = EVAL_SEED,
    engine="hf",
    keyed: bool = False,
) -> tuple[torch.Tensor, list[str]]:
    """Rewards [P, k] and the P·k completion texts of k samples per problem at ``temperature``
    (0 = greedy), scored by ``scorer`` (a :class:`rlkit.rewards.RewardScorer`); ``engine``:
    ``hf`` or ``hf_static`` (`rlkit.rollout.generate_rollouts`), or an engine object with
    ``generate(prompts, temperatures, max_new_tokens)`` (`rlkit.vllm_engine.VLLMEngine`),
    whose per-row seeds then come from the same seed. The calls take ``batch_size // k``
    problems each, the call starting at problem ``i`` seeded ``seed + i``; ``keyed``: one
    problem per call, so problem ``i``'s samples are drawn from ``seed + i`` alone, whatever
    the batch size and the problems around it (``rollout.sampling_stream=prompt``)."""
    problems = list(problems)
    rewards, texts = [], []
    per_batch = 1 if keyed else max(1, batch_size // k)
    for start in range(0, len(problems), per_batch):
        chunk = problems[start : start + per_batch]
        prompts = [p.prompt for p in chunk for _ in range(k)]
        temperatures = torch.full((len(prompts),), float(temperature))
        if isinstance(engine, str):
            rollouts = generate_rollouts(
                model,
                tokenizer,
                prompts,
                temperatures,
                max_new_tokens,
                generator_seed=seed + start,
                engine=engine,
            )
        else:
            with seeded(seed + start, torch.device("cpu")):
                rollouts = engine.generate(prompts, temperatures, max_new_tokens)
        scored = scorer.score(
            rollouts.completion_texts, [p.answer for p in chunk for _ in range(k)]
        )
        rewards.append(scored.rewards.view(len(chunk), k))
        texts += rollouts.completion_texts
    return (torch.cat(rewards) if rewards else torch.zeros(0, k)), texts


def sampled_pass_rates(
    model, tokenizer, problems, scorer, k=8, temperature=1.0, **kwargs
) -> torch.Tensor:
    """Per-problem fraction of k samples at ``temperature`` that score a reward > 0.5, [P]."""
    rewards, _ = generate_and_score(model, tokenizer, problems, scorer, k, temperature, **kwargs)
    return (rewards > 0.5).float().mean(dim=1)


def majority_correct(texts: Sequence[str], rewards: torch.Tensor) -> torch.Tensor:
    """Maj@k: 1 where the most frequent extracted answer of a problem's k samples (texts in
    problem-major order, rewards [P, k]) is correct (ties broken by first occurrence). The
    winner is judged by the run's own reward on its first sample, so Maj@k agrees with Pass@1's
    scoring (fractions, decimals, math-verify), not with a textual comparison."""
    num_problems, k = rewards.shape
    out = []
    for i in range(num_problems):
        answers = [extract_answer(t) for t in texts[i * k : (i + 1) * k]]
        winner = Counter(answers).most_common(1)[0][0]
        out.append(float(rewards[i, answers.index(winner)] > 0.5))
    return torch.tensor(out)


@dataclass
class EvalScores:
    """Per-problem results: greedy rewards [P, 1], k sampled rewards [P, k], Maj@k [P] and the
    P greedy completions (what a reader inspects: notebook 11's kinds of wrong answer)."""

    greedy: torch.Tensor
    sampled: torch.Tensor
    majority: torch.Tensor
    greedy_texts: list[str]

    @staticmethod
    def cat(parts: Sequence[EvalScores]) -> EvalScores:
        """Shards of the problems, in order (a sharded evaluation, gathered)."""
        if len(parts) == 1:
            return parts[0]
        tensors = (torch.cat([getattr(p, f) for p in parts]) for f in EVAL_FIELDS)
        return EvalScores(*tensors, [text for p in parts for text in p.greedy_texts])

    def summary(self) -> dict:
        """``eval/greedy_accuracy``, ``eval/pass@1`` (mean over k samples) and ``eval/maj@k``."""
        k = self.sampled.shape[1]
        return {
            "eval/greedy_accuracy": float((self.greedy > 0.5).float().mean()),
            "eval/pass@1": float((self.sampled > 0.5).float().mean()),
            f"eval/maj@{k}": float(self.majority.mean()),
        }


EVAL_FIELDS = ("greedy", "sampled", "majority")  # the tensors; greedy_texts is a list


def score_problems(
    model,
    tokenizer,
    problems,
    scorer,
    k: int,
    temperature: float,
    max_new_tokens: int,
    batch_size: int = 512,
    engine="hf",
    seed: int = EVAL_SEED,
    keyed: bool = False,
) -> EvalScores:
    """Greedy and k sampled completions of every problem at ``temperature``, scored, generating
    ``batch_size`` rows per call with ``engine`` (``keyed``: one problem per call, see
    :func:`generate_and_score`). A shard of a larger evaluation that starts at problem ``i``
    (a multiple of ``batch_size // k``, or any with ``keyed``) passes ``seed=EVAL_SEED + i``:
    its samples are then those of the whole evaluation's."""
    problems = list(problems)
    greedy, greedy_texts = generate_and_score(
        model,
        tokenizer,
        problems,
        scorer,
        1,
        0.0,
        max_new_tokens,
        batch_size,
        engine=engine,
        keyed=keyed,
    )
    sampled, texts = generate_and_score(
        model,
        tokenizer,
        problems,
        scorer,
        k,
        temperature,
        max_new_tokens,
        batch_size,
        seed,
        engine,
        keyed,
    )
    return EvalScores(greedy, sampled, majority_correct(texts, sampled), greedy_texts)
