"""Character tokenizer and the cached, warm-started tiny policy (with a very small config)."""

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import rlkit.models.tiny as tiny
from rlkit.evaluation import generate_and_score, sampled_pass_rates
from rlkit.models.tiny import (
    BUILD_INFO,
    IGNORE_INDEX,
    TinyModelConfig,
    build_key,
    build_tiny_policy,
    sft_batch,
)
from rlkit.models.tokenizer import build_char_tokenizer
from rlkit.rewards import RewardScorer, exact_match_reward
from rlkit.tasks import ArithmeticTask

TASK = ArithmeticTask(train_size=400, eval_size=16)
SMALL = TinyModelConfig(
    hidden_size=16,
    num_layers=1,
    num_heads=2,
    intermediate_size=32,
    sft_steps=60,
    batch_size=16,
    lr=1e-2,
    warmup_steps=5,
)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    return build_tiny_policy(
        TASK, SMALL, cache_dir=tmp_path_factory.mktemp("cache"), progress=False
    )


def test_tokenizer_round_trip_padding_and_save(tmp_path):
    tokenizer = build_char_tokenizer(TASK.alphabet)
    assert len(tokenizer) == 4 + len(TASK.alphabet)
    encoded = tokenizer(["7+5*3=", "1-2="], padding=True)
    ids = encoded["input_ids"]
    assert ids[0][0] == tokenizer.bos_token_id and len(ids[0]) == 7
    assert ids[1][:2] == [tokenizer.pad_token_id] * 2  # left padding
    assert encoded["attention_mask"][1] == [0, 0, 1, 1, 1, 1, 1]
    assert tokenizer.decode(ids[0], skip_special_tokens=True) == "7+5*3="
    assert tokenizer.decode(ids[1], skip_special_tokens=True) == "1-2="
    assert tokenizer("12", add_special_tokens=False)[
        "input_ids"
    ] == tokenizer.convert_tokens_to_ids(["1", "2"])
    assert tokenizer("a", add_special_tokens=False)["input_ids"] == [tokenizer.unk_token_id]
    tokenizer.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    assert loaded.padding_side == "left"
    assert loaded(["7+5*3=", "1-2="], padding=True)["input_ids"] == ids
    assert loaded.eos_token_id == tokenizer.eos_token_id


def test_sft_batch_masks_prompt_and_padding():
    tokenizer = build_char_tokenizer(TASK.alphabet)
    batch = sft_batch([("7+5=", "12"), ("1*2*3=", "6")], tokenizer)
    ids, labels, mask = batch["input_ids"], batch["labels"], batch["attention_mask"]
    eos = tokenizer.eos_token_id
    # row 0: <bos> 7 + 5 = 1 2 <eos> <pad> <pad>
    assert tokenizer.decode(ids[0][mask[0] == 1]) == "<bos>7+5=12<eos>"
    assert labels[0, :5].eq(IGNORE_INDEX).all() and labels[0, 7] == eos
    assert labels[0, 5:8].tolist() == ids[0, 5:8].tolist()
    assert labels[0, 8:].eq(IGNORE_INDEX).all() and mask[0, 8:].eq(0).all()
    assert labels[1].ne(IGNORE_INDEX).sum() == 2  # "6" and EOS


def test_build_is_loadable_and_sft_reduces_the_loss(built):
    assert built.name == f"tiny-{build_key(TASK, SMALL)}"
    info = json.loads((built / BUILD_INFO).read_text())
    losses = info["sft_loss"]
    assert len(losses) == SMALL.sft_steps
    assert sum(losses[-10:]) / 10 < 0.8 * sum(losses[:5]) / 5
    model = AutoModelForCausalLM.from_pretrained(built)
    tokenizer = AutoTokenizer.from_pretrained(built)
    assert model.config.hidden_size == 16 and model.config.eos_token_id == tokenizer.eos_token_id
    assert info["num_parameters"] == sum(p.numel() for p in model.parameters())


def test_rebuild_is_bit_identical(built, tmp_path):
    other = build_tiny_policy(TASK, SMALL, cache_dir=tmp_path, progress=False)
    assert other != built and other.name == built.name
    first = AutoModelForCausalLM.from_pretrained(built).state_dict()
    second = AutoModelForCausalLM.from_pretrained(other).state_dict()
    assert first.keys() == second.keys()
    assert all(torch.equal(first[k], second[k]) for k in first)
    different_seed = TinyModelConfig(**{**SMALL.__dict__, "seed": 1})
    assert build_key(TASK, different_seed) != build_key(TASK, SMALL)


def test_build_trains_on_one_thread_whatever_the_callers_setting(tmp_path, monkeypatch):
    """One intra-op thread fixes the reduction order, so 1 and 2 threads give the same bits."""
    seen, real = [], tiny.supervised_warm_start

    def record(*args, **kwargs):
        seen.append(torch.get_num_threads())
        return real(*args, **kwargs)

    monkeypatch.setattr(tiny, "supervised_warm_start", record)
    threads = torch.get_num_threads()
    digests = []
    try:
        for n in (2, 1):
            torch.set_num_threads(n)
            path = build_tiny_policy(TASK, SMALL, cache_dir=tmp_path / str(n), progress=False)
            assert torch.get_num_threads() == n  # restored
            digests.append(tiny.weights_digest(path))
    finally:
        torch.set_num_threads(threads)
    assert seen == [1, 1]
    assert digests[0] == digests[1]


def test_weights_digest_of_a_directory_equals_that_of_the_loaded_model(built):
    info = json.loads((built / BUILD_INFO).read_text())
    model = AutoModelForCausalLM.from_pretrained(built)
    assert tiny.weights_digest(built) == tiny.weights_digest(model.state_dict())
    assert tiny.weights_digest(built) == info["weights_sha256"]
    with torch.no_grad():
        next(model.parameters())[0, 0] += 1e-6
    assert tiny.weights_digest(model.state_dict()) != info["weights_sha256"]


def test_build_into_an_explicit_directory(tmp_path):
    out = tmp_path / "ship" / "tiny"
    assert build_tiny_policy(TASK, SMALL, out_dir=out, progress=False) == out
    assert (out / BUILD_INFO).exists() and (out / "model.safetensors").exists()
    assert [p.name for p in out.parent.iterdir()] == ["tiny"]  # no staging left behind


def test_cache_hit_does_not_retrain(built, monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError("retrained")

    monkeypatch.setattr(tiny, "supervised_warm_start", fail)
    assert build_tiny_policy(TASK, SMALL, cache_dir=built.parent, progress=False) == built


def test_interrupted_build_leaves_nothing_that_looks_finished(tmp_path, monkeypatch):
    def crash(*args, **kwargs):
        raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        patch.setattr(tiny, "supervised_warm_start", crash)
        with pytest.raises(KeyboardInterrupt):
            build_tiny_policy(TASK, SMALL, cache_dir=tmp_path, progress=False)
    assert list(tmp_path.iterdir()) == []
    assert (
        build_tiny_policy(TASK, SMALL, cache_dir=tmp_path, progress=False) / BUILD_INFO
    ).exists()


def test_default_cache_dir_follows_env(monkeypatch, tmp_path):
    monkeypatch.setenv("RLKIT_CACHE", str(tmp_path))
    assert tiny.default_cache_dir() == tmp_path


def test_config_validation():
    with pytest.raises(ValueError, match="num_heads"):
        TinyModelConfig(hidden_size=30, num_heads=4)
    with pytest.raises(ValueError, match="sft_difficulty_weights"):
        build_tiny_policy(TASK, TinyModelConfig(sft_difficulty_weights=(1.0,)), progress=False)


def test_greedy_evaluation_matches_manual_greedy_decoding(built):
    problems = TASK.problems("eval")[:6]
    model = AutoModelForCausalLM.from_pretrained(built)
    tokenizer = AutoTokenizer.from_pretrained(built)
    scorer = RewardScorer(exact_match_reward)
    greedy, _ = generate_and_score(model, tokenizer, problems, scorer, max_new_tokens=6)
    expected = []
    for problem in problems:
        ids = tokenizer(problem.prompt, return_tensors="pt")["input_ids"]
        for _ in range(6):
            next_id = model(ids).logits[0, -1].argmax()
            if next_id == tokenizer.eos_token_id:
                break
            ids = torch.cat([ids, next_id.view(1, 1)], dim=1)
        completion = tokenizer.decode(ids[0], skip_special_tokens=True)[len(problem.prompt) :]
        expected.append(exact_match_reward(completion, problem.answer))
    assert greedy.flatten().tolist() == expected


def completion_length_parity(completion: str, answer: str) -> float:
    return float(len(completion) % 2)


def test_sampled_pass_rates_are_seeded_fractions(built):
    # score by completion length, so that even this weak model gets varied, non-zero rates
    model = AutoModelForCausalLM.from_pretrained(built)
    tokenizer = AutoTokenizer.from_pretrained(built)
    scorer = RewardScorer(completion_length_parity)
    problems = TASK.problems("eval")
    options = {"k": 4, "max_new_tokens": 6}
    rates = sampled_pass_rates(model, tokenizer, problems, scorer, batch_size=20, **options)
    assert rates.shape == (len(problems),)
    assert torch.equal(rates * 4, (rates * 4).round()) and 0 < rates.mean() < 1
    same = sampled_pass_rates(model, tokenizer, problems, scorer, batch_size=20, **options)
    other = sampled_pass_rates(model, tokenizer, problems, scorer, seed=1, **options)
    assert torch.equal(rates, same) and not torch.equal(rates, other)
