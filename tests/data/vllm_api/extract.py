"""Write the vLLM API facts rlkit's engine relies on, read from an unpacked vLLM wheel.

vLLM needs CUDA and replaces torch, so it is never installed in CI; tests/test_vllm_engine.py
checks the engine's calls against these facts instead (keyword names, Literal choices, field
order). Regenerate for another version::

    pip download vllm==X --no-deps -d /tmp/w && unzip -q /tmp/w/vllm-X-*.whl 'vllm/*' -d /tmp/w/x
    python tests/data/vllm_api/extract.py /tmp/w/x X > tests/data/vllm_api/X.json

Only the source is parsed (``ast``); nothing of vLLM is imported.
"""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path


def _module(root: Path, name: str) -> ast.Module:
    return ast.parse((root / "vllm" / name).read_text())


def _class(tree: ast.Module, name: str) -> ast.ClassDef:
    return next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name)


def _fields(cls: ast.ClassDef) -> list[str]:
    """Annotated class-level fields in order (a dataclass's or msgspec Struct's constructor)."""
    return [
        n.target.id
        for n in cls.body
        if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
    ]


def _method_params(cls: ast.ClassDef, name: str) -> list[str]:
    fn = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == name)
    args = fn.args
    return [a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs] if a.arg != "self"]


def _literal(tree: ast.Module, name: str) -> list:
    node = next(
        n
        for n in tree.body
        if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", None) == name
    )
    return ast.literal_eval(node.value.slice)


def facts(root: Path, version: str) -> dict:
    llm = _class(_module(root, "entrypoints/llm.py"), "LLM")
    lora_config = _module(root, "config/lora.py")
    model_config = _module(root, "config/model.py")
    outputs = _module(root, "outputs.py")
    return {
        "version": version,
        "LLM.__init__": _method_params(llm, "__init__"),
        "LLM.generate": _method_params(llm, "generate"),
        "LLM.methods": sorted(n.name for n in llm.body if isinstance(n, ast.FunctionDef)),
        "EngineArgs": _fields(_class(_module(root, "engine/arg_utils.py"), "EngineArgs")),
        "MaxLoRARanks": _literal(lora_config, "MaxLoRARanks"),
        "LogprobsMode": _literal(model_config, "LogprobsMode"),
        "ModelDType": _literal(model_config, "ModelDType"),
        "SamplingParams": _fields(_class(_module(root, "sampling_params.py"), "SamplingParams")),
        "LoRARequest": _fields(_class(_module(root, "lora/request.py"), "LoRARequest")),
        "TokensPrompt": _fields(_class(_module(root, "inputs/llm.py"), "TokensPrompt")),
        "CompletionOutput": _fields(_class(outputs, "CompletionOutput")),
        "Logprob": _fields(_class(_module(root, "logprobs.py"), "Logprob")),
    }


if __name__ == "__main__":
    print(json.dumps(facts(Path(sys.argv[1]), sys.argv[2]), indent=1))
