"""Configuration: dataclasses, YAML presets and ``key=value`` overrides (TRL-style configs).

A run is described by one :class:`TrainConfig`. ``load_config(name_or_path, overrides)`` reads a
YAML preset (shipped in ``rlkit/configs``) or file, applies dotted overrides such as
``algo.estimator=ebpo rollout.group_size=4``, and validates everything before any work starts:
an unknown key or a bad value raises ``ValueError`` naming the key. One module per job: the
schema (:mod:`rlkit.config.schema`), reading YAML and overrides (:mod:`rlkit.config.loading`)
the checks across sections and against the filesystem (:mod:`rlkit.config.checks`), and who
reads each setting (:mod:`rlkit.config.readers`).
"""

from rlkit.config.checks import (
    _check_kwargs,
    check_combination,
    check_paths,
    run_tis_cap,
    run_tis_tripwire,
)
from rlkit.config.loading import (
    MAX_CONFIG_BYTES,
    PRESET_DIR,
    config_from_dict,
    from_dict,
    load_config,
    merge_overrides,
    parse_override,
    preset_names,
    read_yaml,
)
from rlkit.config.readers import ignored_settings, unread
from rlkit.config.schema import (
    BUILTIN_MODEL,
    SAMPLING_STREAMS,
    AGPOConfig,
    AlgoConfig,
    DPOConfig,
    EvalConfig,
    LossConfig,
    ModelConfig,
    OptimConfig,
    ParallelConfig,
    PPOConfig,
    RolloutConfig,
    TaskConfig,
    TrainConfig,
    estimator_options,
    expand_path,
)

__all__ = [
    "BUILTIN_MODEL",
    "MAX_CONFIG_BYTES",
    "PRESET_DIR",
    "SAMPLING_STREAMS",
    "AGPOConfig",
    "AlgoConfig",
    "DPOConfig",
    "EvalConfig",
    "LossConfig",
    "ModelConfig",
    "OptimConfig",
    "PPOConfig",
    "ParallelConfig",
    "RolloutConfig",
    "TaskConfig",
    "TrainConfig",
    "_check_kwargs",
    "check_combination",
    "check_paths",
    "config_from_dict",
    "estimator_options",
    "expand_path",
    "from_dict",
    "ignored_settings",
    "load_config",
    "merge_overrides",
    "parse_override",
    "preset_names",
    "read_yaml",
    "unread",
    "run_tis_cap",
    "run_tis_tripwire",
]
