"""The rollout-engine registry (`rlkit.engines`): one entry per ``rollout.engine`` value, each
declaring its capabilities, which the rest of rlkit reads instead of the engine's name."""

from __future__ import annotations

import pytest

from rlkit.config import load_config
from rlkit.engines import ENGINES, engine_names, get_engine, in_process_engines, register_engine


def test_the_builtin_engines_are_registered_in_order():
    assert engine_names() == ("hf", "hf_static", "vllm")
    assert in_process_engines() == ("hf", "hf_static")
    assert all(get_engine(name).name == name for name in engine_names())


def test_a_name_registered_twice_is_refused_naming_both_classes():
    class Other:
        pass

    with pytest.raises(ValueError, match=r"'hf' is already registered \(by HFEngine\); .*Other"):
        register_engine("hf")(Other)
    assert ENGINES["hf"].__name__ == "HFEngine"


def test_an_unknown_name_lists_the_known_ones():
    with pytest.raises(ValueError, match=r"unknown rollout engine 'fast'; known: \['hf', "):
        get_engine("fast")


def test_declared_capabilities():
    hf, static, vllm = (get_engine(n) for n in ("hf", "hf_static", "vllm"))
    assert hf.same_forward and not static.same_forward and not vllm.same_forward
    assert not hf.records_sampler_logp and static.records_sampler_logp
    assert static.fuses_lora and static.compiles_step and not hf.fuses_lora
    assert vllm.batches_rows_itself and vllm.own_weights
    assert vllm.gpu_share == "vllm_memory" and hf.gpu_share is None
    assert vllm.decode is None and vllm.build is not None
    assert hf.build is None and static.build is None


def test_the_config_choice_is_the_registry():
    with pytest.raises(
        ValueError, match=r"rollout\.engine must be one of \['hf', 'hf_static', 'vllm'\]"
    ):
        load_config("tiny-cpu", ["rollout.engine=fast"])
