"""The collective seam's arithmetic, in one process (the real two-process runs are in
tests/test_data_parallel.py)."""

from __future__ import annotations

import pytest

from rlkit.config import load_config
from rlkit.dist import Local, check_world, rank_seed, share_bounds


@pytest.mark.parametrize("n,world", [(8, 2), (12, 3), (16, 4)])
def test_even_shares_tile_the_batch_in_order(n, world):
    bounds = [share_bounds(n, r, world) for r in range(world)]
    assert [i for start, end in bounds for i in range(start, end)] == list(range(n))
    assert len({end - start for start, end in bounds}) == 1


def test_uneven_rows_are_refused_for_training():
    with pytest.raises(ValueError, match="7 rows cannot be split evenly over 2 processes"):
        share_bounds(7, 0, 2)


@pytest.mark.parametrize("n,world,block", [(812, 2, 128), (12, 2, 4), (5, 3, 4), (3, 4, 1)])
def test_evaluation_shares_are_whole_blocks_in_order(n, world, block):
    bounds = [share_bounds(n, r, world, even=False, block=block) for r in range(world)]
    assert [i for start, end in bounds for i in range(start, end)] == list(range(n))
    assert all(start % block == 0 for start, end in bounds if end > start)  # whole batches


def test_one_process_is_the_identity():
    local = Local()
    assert local.shard([1, 2, 3]) == [1, 2, 3] and local.share(5) == range(5)
    assert rank_seed(7, 0) == 7 and rank_seed(7, 1) not in (7, 8)


@pytest.mark.parametrize("key,value", [("rollout.num_prompts", 5), ("optim.mini_batch_size", 10)])
def test_sizes_that_do_not_divide_by_the_world_are_named(key, value):
    cfg = load_config("tiny-cpu", [f"{key}={value}"])
    with pytest.raises(ValueError, match=f"{key}={value} does not divide by the 4 processes"):
        check_world(cfg, 4)
    check_world(cfg, 1)


def test_bad_strategy_and_fsdp2_with_qlora_are_refused():
    with pytest.raises(ValueError, match="parallel.strategy"):
        load_config("tiny-cpu", ["parallel.strategy=zero3"])
    with pytest.raises(ValueError, match="parallel.strategy=fsdp2 with model.mode=qlora"):
        load_config("tiny-cpu", ["parallel.strategy=fsdp2", "model.mode=qlora"])


def test_the_plan_is_one_process_share():
    from rlkit.plan import build_plan

    cfg = load_config("qwen3-8b-qlora", ["rollout.generation_batch_size=0"])
    one, two = build_plan(cfg), build_plan(cfg, world=2)
    assert two.rows * 2 == one.rows and two.trainable() == one.trainable()  # DDP replicates
    sharded = build_plan(
        load_config("qwen3-8b-qlora", ["parallel.strategy=fsdp2", "model.mode=lora"]), world=2
    )
    assert (
        sharded.trainable() * 2
        == build_plan(load_config("qwen3-8b-qlora", ["model.mode=lora"])).trainable()
    )
