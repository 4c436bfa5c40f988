"""Reading a config: YAML presets (shipped in ``rlkit/configs``) and files, dotted ``key=value``
overrides (``algo.estimator=ebpo rollout.group_size=4``), and their values coerced into the
schema's dataclasses (:mod:`rlkit.config.schema`), then checked across sections and against the
filesystem (:mod:`rlkit.config.checks`) before any work starts: an unknown key or a bad value
raises ``ValueError`` naming the key.
"""

from __future__ import annotations

import dataclasses
import math
import re
import types
import typing
from pathlib import Path
from typing import Any

import yaml

from rlkit.config.aliases import method_settings, resolve_method
from rlkit.config.checks import check_combination, check_paths
from rlkit.config.schema import TrainConfig, expand_path
from rlkit.paths import check_link

PRESET_DIR = Path(__file__).parent.parent / "configs"
# A config or sweep spec is a few kilobytes; a larger file is a mistake (and would take PyYAML
# minutes to parse), so it is refused before parsing.
MAX_CONFIG_BYTES = 1 << 20


def _coerce(key: str, value: Any, annotation: Any) -> Any:
    """Check ``value`` against a field annotation; build nested dataclasses from dicts."""
    if isinstance(annotation, str):
        raise TypeError(f"unresolved annotation for {key}")
    if dataclasses.is_dataclass(annotation):
        if not isinstance(value, dict):
            raise ValueError(f"{key} must be a mapping, got {value!r}")
        return from_dict(annotation, value, prefix=f"{key}.")
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in (a for a in args if a is not type(None)):
            try:
                return _coerce(key, value, arg)
            except ValueError as err:
                errors.append(str(err))
        raise ValueError(f"{key}: {value!r} does not fit {annotation} ({'; '.join(errors)})")
    if annotation is bool:
        if not isinstance(value, bool):
            raise ValueError(f"{key} must be true or false, got {value!r}")
        return value
    if annotation is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{key} must be an integer, got {value!r}")
        return value
    if annotation is float:
        if isinstance(value, str):  # YAML 1.1 reads "1e-5" (no dot) as a string
            try:
                value = float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{key} must be a number, got {value!r}")
        if not math.isfinite(value):
            raise ValueError(f"{key} must be a finite number, got {value!r}")
        return float(value)
    if annotation is str:
        if not isinstance(value, str):
            raise ValueError(f"{key} must be a string, got {value!r}")
        return value
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ValueError(f"{key} must be a list, got {value!r}")
        return origin(value)
    if origin is dict or annotation is dict:
        if not isinstance(value, dict):
            raise ValueError(f"{key} must be a mapping, got {value!r}")
        return dict(value)
    return value


def from_dict(cls: type, data: dict, prefix: str = "") -> Any:
    """Build dataclass ``cls`` from a (nested) dict; unknown keys raise naming the key."""
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ValueError(f"unknown config key {prefix}{unknown[0]!s}; known keys: {sorted(names)}")
    kwargs = {name: _coerce(prefix + name, value, hints[name]) for name, value in data.items()}
    return cls(**kwargs)


def parse_override(text: str) -> tuple[list[str], Any]:
    """``a.b=value`` → (["a", "b"], YAML-parsed value)."""
    if "=" not in text:
        raise ValueError(f"override {text!r} must look like key=value (e.g. algo.estimator=ebpo)")
    key, raw = text.split("=", 1)
    if not key:
        raise ValueError(f"override {text!r} has an empty key")
    return key.split("."), _load_yaml(raw, f"override {text!r}") if raw else ""


def _assign(root: dict, path: list[str], value, text: str) -> None:
    """``root[path[0]]…[path[-1]] = value``, making the sections on the way; override ``text``
    names the one that is not a section."""
    node = root
    for part in path[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ValueError(f"override {text!r}: {part} is not a section")
    node[path[-1]] = value


def merge_overrides(data: dict, overrides: typing.Iterable[str]) -> dict:
    """``data`` with the ``key=value`` overrides applied. The method is chosen layer by layer: the
    data's choice (its older keys read as ``algo.method``, :func:`resolve_method`) yields to one
    the overrides make, by ``algo.method`` or an older key (``rlkit eval --checkpoint RUN
    algo.estimator=ppo`` on a saved config that says ``algo.method: grpo``)."""
    data, layer = resolve_method(data), {}  # layer: what the overrides alone set
    for text in overrides:
        path, value = parse_override(text)
        for root in (data, layer):
            _assign(root, path, value, text)
    if method_settings(layer) and "method" not in (layer.get("algo") or {}):
        if isinstance(data.get("algo"), dict):
            data["algo"].pop("method", None)  # chosen by an older key in the overrides
    return data


def preset_names() -> list[str]:
    return sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))


def read_yaml(name_or_path: str) -> dict:
    """A preset name (``tiny-cpu``) or a path to a YAML file."""
    path = Path(expand_path("config", name_or_path))
    if not path.suffix and not path.exists():
        path = PRESET_DIR / f"{name_or_path}.yaml"
        if not path.exists():
            raise ValueError(f"unknown preset {name_or_path!r}; known: {preset_names()}")
    check_link("config", path)
    if not path.is_file():
        raise ValueError(f"config file not found: {name_or_path}")
    with open(path, "rb") as f:
        raw = f.read(MAX_CONFIG_BYTES + 1)
    if len(raw) > MAX_CONFIG_BYTES:
        raise ValueError(
            f"config {path} is larger than {MAX_CONFIG_BYTES // 1024} KiB; a config is a few "
            "kilobytes of YAML (is this the right file?)"
        )
    try:
        text = raw.decode()
    except UnicodeDecodeError as err:
        raise ValueError(f"config {path} is not UTF-8 text: {err}") from None
    data = _load_yaml(text, f"config {path}")
    if data is None:
        raise ValueError(f"config {path} is empty")
    if not isinstance(data, dict):
        raise ValueError(f"config {path} must hold a mapping at the top level")
    return data


class _StrictLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a key repeated in one mapping (plain YAML keeps the last)
    and any alias (``*name``): aliases let a few hundred bytes expand into billions of nodes (the
    "billion laughs"), and a config has no need for them."""

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.composer.ComposerError(
                None,
                None,
                f"alias *{event.anchor}: YAML aliases are not accepted in a config (write the "
                "value out)",
                event.start_mark,
            )
        return super().compose_node(parent, index)


# YAML 1.2's booleans: true and false alone. PyYAML follows YAML 1.1, where on/off/yes/no are
# booleans too, so `loss.tis_cap=off` would reach the config as False instead of "off".
_BOOL = "tag:yaml.org,2002:bool"
_StrictLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != _BOOL]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_StrictLoader.add_implicit_resolver(
    _BOOL, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode) -> dict:
    seen = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark
            )
        seen.add(key)
    return loader.construct_mapping(node)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def _load_yaml(text: str, source: str) -> Any:
    """Parse YAML safely; a syntax error, a duplicate key or an alias is a ValueError naming the
    line."""
    try:
        return yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except RecursionError:
        raise ValueError(f"{source}: invalid YAML: nested too deeply") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        problem = getattr(err, "problem", None) or str(err)
        raise ValueError(f"{source}: invalid YAML{where}: {problem}") from None


def _check_finite(data: Any, key: str = "") -> None:
    """Every number in a (nested) config mapping is finite; NaN/inf is an error naming the key."""
    if isinstance(data, dict):
        for name, value in data.items():
            _check_finite(value, f"{key}.{name}" if key else str(name))
    elif isinstance(data, (list, tuple)):
        for i, value in enumerate(data):
            _check_finite(value, f"{key}[{i}]")
    elif isinstance(data, float) and not math.isfinite(data):
        raise ValueError(f"{key} must be a finite number, got {data!r}")


def load_config(
    name_or_path: str | None = "tiny-cpu", overrides: typing.Iterable[str] = ()
) -> TrainConfig:
    """Read a preset or YAML file, apply ``key=value`` overrides, validate everything (values,
    combinations, paths) and return the config; any problem is a ValueError naming the key."""
    data = read_yaml(name_or_path) if name_or_path else {}
    data = merge_overrides(data, overrides)
    _check_finite(data)
    cfg = config_from_dict(data)
    check_paths(cfg)
    return cfg


def config_from_dict(data: dict) -> TrainConfig:
    """The :class:`TrainConfig` of a (nested) mapping, its method chosen by ``algo.method``
    alone (the older keys read as aliases, :func:`rlkit.config.aliases.resolve_method`), each
    section's values checked as it is built and the combinations across sections after
    (:func:`check_combination`); the filesystem is left to :func:`check_paths`."""
    cfg = from_dict(TrainConfig, resolve_method(data))
    check_combination(cfg)
    return cfg
