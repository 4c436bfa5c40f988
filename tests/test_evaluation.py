"""Maj@k judges the majority answer with the run's own reward, as Pass@1 does."""

from __future__ import annotations

import torch

from rlkit.evaluation import majority_correct
from rlkit.rewards import exact_match_reward


def scored(groups: list[tuple[list[str], str]]) -> tuple[list[str], torch.Tensor]:
    texts = [t for samples, _ in groups for t in samples]
    rewards = torch.tensor(
        [[exact_match_reward(t, answer) for t in samples] for samples, answer in groups]
    )
    return texts, rewards


def test_a_majority_equal_in_value_to_the_reference_is_correct():
    texts, rewards = scored(
        [
            (["The answer is 6/8", "The answer is 6/8", "The answer is 5"], "3/4"),
            (["The answer is 12.0", "The answer is 12.0", "The answer is 12"], "12"),
            (["The answer is 7", "The answer is 9", "The answer is 9"], "7"),
        ]
    )
    assert majority_correct(texts, rewards).tolist() == [1.0, 1.0, 0.0]


def test_ties_go_to_the_first_answer_seen():
    texts, rewards = scored([(["The answer is 4", "The answer is 5"], "5")])
    assert majority_correct(texts, rewards).tolist() == [0.0]
    texts, rewards = scored([(["The answer is 5", "The answer is 4"], "5")])
    assert majority_correct(texts, rewards).tolist() == [1.0]


def test_gathered_shards_keep_every_greedy_text_beside_its_scores():
    """A sharded evaluation's shards, concatenated in rank order: the texts stay aligned."""
    from rlkit.evaluation import EvalScores

    def shard(rewards, texts):
        greedy = torch.tensor(rewards).reshape(-1, 1)
        return EvalScores(greedy, greedy.repeat(1, 2), greedy[:, 0], texts)

    whole = EvalScores.cat([shard([1.0, 0.0], ["a", "b"]), shard([1.0], ["c"])])
    assert whole.greedy[:, 0].tolist() == [1.0, 0.0, 1.0]
    assert whole.greedy_texts == ["a", "b", "c"]
