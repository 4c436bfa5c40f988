"""Write the vLLM API facts rlkit's engine relies on, read from an unpacked vLLM wheel.

vLLM needs CUDA and replaces torch, so it is never installed in CI; tests/test_vllm_engine.py
checks the engine's calls against these facts instead (keyword names, Literal choices, field
order). Regenerate for another version::

    pip download vllm==X --no-deps -d /tmp/w && unzip -q /tmp/w/vllm-X-*.whl 'vllm/*' -d /tmp/w/x
    python tests/data/vllm_api/extract.py /tmp/w/x X > tests/data/vllm_api/X.json

From vLLM 0.28 bitsandbytes is the ``vllm-bnb-plugin`` package's; give its unpacked wheel too
(``pip download vllm-bnb-plugin==P --no-deps -d /tmp/w && unzip -q /tmp/w/vllm_bnb_plugin-P-*.whl
-d /tmp/w/p``, then ``extract.py /tmp/w/x X /tmp/w/p``) to record how it registers and which of
the names it imports from vLLM this vLLM lacks (none, if the pair works together).

Only the source is parsed (``ast``); nothing of vLLM is imported.
"""

from __future__ import annotations

import ast
import configparser
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


def _function(tree: ast.Module | ast.ClassDef, name: str) -> ast.FunctionDef:
    return next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name)


def _method_params(cls: ast.ClassDef, name: str) -> list[str]:
    args = _function(cls, name).args
    return [a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs] if a.arg != "self"]


def _literal(tree: ast.Module, name: str) -> list:
    node = next(
        n
        for n in tree.body
        if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", None) == name
    )
    return ast.literal_eval(node.value.slice)


def _statements(body: list[ast.stmt]):
    """A module's top-level statements, including those under ``if`` and ``try``."""
    for node in body:
        yield node
        if isinstance(node, ast.If | ast.Try):
            handlers = [h.body for h in getattr(node, "handlers", [])]
            for block in [node.body, node.orelse, getattr(node, "finalbody", []), *handlers]:
                yield from _statements(block)


def _defines(root: Path, module: str, name: str) -> bool:
    """Whether vLLM's ``module`` has a top-level ``name`` (defined, assigned or imported, also
    through ``import *``) or a submodule of that name."""
    base = root / Path(*module.split("."))
    if (base / f"{name}.py").is_file() or (base / name / "__init__.py").is_file():
        return True
    package = module if base.is_dir() else module.rpartition(".")[0]
    path = base / "__init__.py" if base.is_dir() else base.with_suffix(".py")
    if not path.is_file():
        return False
    for node in _statements(ast.parse(path.read_text()).body):
        if isinstance(node, ast.ImportFrom) and [a.name for a in node.names] == ["*"]:
            parent = package.rsplit(".", node.level - 1)[0] if node.level else ""
            source = ".".join(filter(None, [parent, node.module]))
            if _defines(root, source, name):
                return True
            continue
        if isinstance(node, ast.ImportFrom | ast.Import):
            names = [a.asname or a.name.split(".")[0] for a in node.names]
        elif isinstance(node, ast.FunctionDef | ast.ClassDef):
            names = [node.name]
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names = [t.id for t in targets if isinstance(t, ast.Name)]
        else:
            continue
        if name in names:
            return True
    return False


def plugin_facts(root: Path, plugin: Path) -> dict:
    """How the bitsandbytes plugin registers (its entry point, and the names its ``register``
    passes to vLLM's registries), and the ``from vllm... import`` names it needs that ``root``
    lacks."""
    (info,) = plugin.glob("vllm_bnb_plugin-*.dist-info")
    entry_points = configparser.ConfigParser(delimiters=["="])
    entry_points.optionxform = str  # entry point names keep their case
    entry_points.read(info / "entry_points.txt")
    register = _function(
        ast.parse((plugin / "vllm_bnb_plugin/__init__.py").read_text()), "register"
    )
    registers = {
        call.func.func.id: call.func.args[0].value
        for call in ast.walk(register)
        if isinstance(call, ast.Call) and isinstance(call.func, ast.Call)
    }
    missing = sorted(
        {
            f"{node.module}.{alias.name}"
            for path in sorted((plugin / "vllm_bnb_plugin").rglob("*.py"))
            for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "vllm"
            for alias in node.names
            if not _defines(root, node.module, alias.name)
        }
    )
    return {
        "version": info.name.removeprefix("vllm_bnb_plugin-").removesuffix(".dist-info"),
        "entry_points": {group: dict(entry_points[group]) for group in entry_points.sections()},
        "registers": registers,
        "missing_vllm_imports": missing,
    }


def facts(root: Path, version: str, plugin: Path | None = None) -> dict:
    llm = _class(_module(root, "entrypoints/llm.py"), "LLM")
    lora_config = _module(root, "config/lora.py")
    model_config = _module(root, "config/model.py")
    outputs = _module(root, "outputs.py")
    found = {
        "version": version,
        "LLM.__init__": _method_params(llm, "__init__"),
        # whether LLM(...) passes keywords it does not name on to EngineArgs
        "LLM.__init__ **kwargs": _function(llm, "__init__").args.kwarg is not None,
        "LLM.generate": _method_params(llm, "generate"),
        "LLM.sleep": _method_params(llm, "sleep"),
        "LLM.wake_up": _method_params(llm, "wake_up"),
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
        "QuantizationMethods": _literal(
            _module(root, "model_executor/layers/quantization/__init__.py"), "QuantizationMethods"
        ),
        "LoadFormats": _literal(
            _module(root, "model_executor/model_loader/__init__.py"), "LoadFormats"
        ),
    }
    if plugin is not None:
        found["vllm_bnb_plugin"] = plugin_facts(root, plugin)
    return found


if __name__ == "__main__":
    plugin = Path(sys.argv[3]) if len(sys.argv) > 3 else None
    print(json.dumps(facts(Path(sys.argv[1]), sys.argv[2], plugin), indent=1))
