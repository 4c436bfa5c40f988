"""Prompt orders (docs/algorithms.md §2, clustered sampling) and their resumable state."""

from __future__ import annotations

import pytest
import torch

from rlkit.sampling import PromptSampler
from rlkit.tasks.base import Problem

PROBLEMS = [
    Problem(id=str(i), prompt=f"{i}=", answer=str(i), topic="abc"[i % 3], difficulty=i % 4)
    for i in range(30)
]


def ids(batch):
    return [int(p.id) for p in batch]


def test_shuffle_covers_every_problem_once_per_epoch_and_reshuffles():
    sampler = PromptSampler(PROBLEMS, "shuffle", seed=0)
    first = ids(sampler.next_batch(30))
    second = ids(sampler.next_batch(30))
    assert sorted(first) == sorted(second) == list(range(30))
    assert first != second


def test_topic_batches_are_cluster_coherent():
    sampler = PromptSampler(PROBLEMS, "topic", seed=3)
    order = [p.topic for p in sampler.next_batch(30)]
    changes = sum(a != b for a, b in zip(order, order[1:]))
    assert changes == 2  # three contiguous topic blocks
    batches = [{p.topic for p in sampler.next_batch(5)} for _ in range(6)]
    assert all(len(b) == 1 for b in batches)  # 10 per topic, batch 5: never straddles a block


def test_difficulty_curriculum_goes_easy_to_hard_without_shuffling():
    rates = torch.linspace(0, 1, 30)  # problem 29 is the easiest
    sampler = PromptSampler(PROBLEMS, "difficulty", seed=0, pass_rates=rates)
    assert ids(sampler.next_batch(30)) == list(range(29, -1, -1))
    assert ids(sampler.next_batch(3)) == [29, 28, 27]  # the next pass repeats the curriculum


def test_state_round_trip_continues_the_same_stream():
    a = PromptSampler(PROBLEMS, "shuffle", seed=1)
    a.next_batch(17)
    b = PromptSampler(PROBLEMS, "shuffle", seed=1)
    b.load_state_dict(a.state_dict())
    assert ids(a.next_batch(40)) == ids(b.next_batch(40))


def test_bad_input():
    with pytest.raises(ValueError, match="unknown prompt order 'random'"):
        PromptSampler(PROBLEMS, "random")
    with pytest.raises(ValueError, match="one pass rate per problem"):
        PromptSampler(PROBLEMS, "difficulty", pass_rates=torch.ones(3))
    with pytest.raises(ValueError, match="at least one problem"):
        PromptSampler([], "shuffle")
