"""Rollout engines as registered plug-ins (``rollout.engine``; docs/algorithms.md §3 step 3;
adding one: docs/contributing.md).

Every module of this package is imported with it, so a new file here that decorates its entry
with :func:`register_engine` is a new ``rollout.engine``. The built-in entries, in this order:
``hf`` (HF ``generate`` on the training model, :mod:`rlkit.engines.hf`), ``hf_static`` (rlkit's
static-cache decode loop, :mod:`rlkit.engines.hf_static`) and ``vllm`` (vLLM in its own share of
the GPU, an optional extra, :mod:`rlkit.engines.vllm`); the registry and what an entry declares:
:mod:`rlkit.engines.base`. No entry loads a model stack when imported: choosing an engine (the
config's checks) must not.
"""

from __future__ import annotations

from rlkit.engines.base import (
    ENGINES,
    Engine,
    EngineEntry,
    RolloutEngine,
    engine_names,
    get_engine,
    in_process_engines,
    register_engine,
)
from rlkit.engines.hf import HFEngine
from rlkit.engines.hf_static import StaticEngine
from rlkit.engines.vllm import VLLMEngineEntry
from rlkit.registry import import_all

import_all(__name__, __path__)

__all__ = [
    "ENGINES",
    "Engine",
    "EngineEntry",
    "HFEngine",
    "RolloutEngine",
    "StaticEngine",
    "VLLMEngineEntry",
    "engine_names",
    "get_engine",
    "in_process_engines",
    "register_engine",
]
