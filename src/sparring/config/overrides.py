"""Typed parsing of config mappings and ``key.sub=value`` overrides into dataclasses.

`build` instantiates a dataclass from a mapping (unknown keys are errors with a "did you
mean" hint); `apply_override` sets one dotted key, parsing the text with the field's
type; numeric bounds come from field metadata (``ge``, ``gt``, ``le``, ``lt``).
"""

from __future__ import annotations

import difflib
import math
import types
import typing
from dataclasses import fields, is_dataclass
from typing import Any, Literal

import yaml


class ConfigError(ValueError):
    """A bad configuration: the message names the key and what is allowed."""


class _UniqueKeyLoader(yaml.SafeLoader):
    """`yaml.SafeLoader` where a key given twice in one mapping is an error (the plain
    loader keeps the last silently)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if not isinstance(key_node, yaml.ScalarNode) \
                    or key_node.tag == "tag:yaml.org,2002:merge":
                continue  # keys a merge (<<) brings may be overridden
            key, line = self.construct_object(key_node), key_node.start_mark.line + 1
            if key in seen:
                where = f"lines {seen[key]} and {line}" if seen[key] != line \
                    else f"both on line {line}"
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} is given twice ({where})", key_node.start_mark)
            seen[key] = line
        return super().construct_mapping(node, deep=deep)


def load_yaml_text(text: str) -> Any:
    """``yaml.safe_load(text)``, with a key given twice in one mapping an error
    (`_UniqueKeyLoader`): for config files and override values alike."""
    return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 (a SafeLoader)


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def did_you_mean(word: str, choices: list[str]) -> str:
    close = difflib.get_close_matches(word, choices, n=1, cutoff=0.5)
    return f"; did you mean {close[0]!r}?" if close else ""


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Check/convert ``value`` to type ``tp``; errors name ``key``."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _coerce(value, inner[0], key)
    if origin is Literal:
        if isinstance(value, bool) and ("on" if value else "off") in args:
            value = "on" if value else "off"  # YAML 1.1 reads a bare on/off as a boolean
        if value not in args:
            hint = did_you_mean(str(value), [str(a) for a in args])
            raise ConfigError(f"{key}: {value!r} is not allowed{hint} "
                              f"(allowed: {', '.join(map(str, args))})")
        return value
    if is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping of {tp.__name__} fields, got {value!r}")
        return build(tp, value, key)
    if origin is list:
        if isinstance(value, str) and value.lstrip().startswith("["):  # CLI: [a, b, c]
            try:
                value = load_yaml_text(value)
            except yaml.YAMLError as e:
                raise ConfigError(f"{key}: cannot parse the list {value!r} ({e})") from None
        elif isinstance(value, str):  # CLI: a,b,c
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key}: expected a list, got {value!r}")
        return [_coerce(v, args[0], f"{key}.{i}") for i, v in enumerate(value)]
    if origin is dict:
        if isinstance(value, str) and value.lstrip().startswith("{"):  # CLI: {a: 1, b: 2}
            try:
                value = load_yaml_text(value)
            except yaml.YAMLError as e:
                raise ConfigError(f"{key}: cannot parse the mapping {value!r} ({e})") from None
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping, got {value!r}")
        if len(args) == 2 and is_dataclass(args[1]):  # named sections, e.g. policies
            return {str(k): _coerce({} if v is None else v, args[1], f"{key}.{k}")
                    for k, v in value.items()}
        return dict(value)
    if tp is Any:
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{key}: expected true or false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{key}: expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, str):
            try:
                value = float(value)
            except ValueError:
                raise ConfigError(f"{key}: expected a number, got {value!r}") from None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{key}: expected a number, got {value!r}")
        try:
            number = float(value)
        except OverflowError:
            number = math.inf
        if not math.isfinite(number):
            raise ConfigError(f"{key}: expected a finite number, got {value!r}")
        return number
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{key}: expected a string, got {value!r}")
        return value
    raise ConfigError(f"{key}: unsupported field type {tp}")  # pragma: no cover


_BOUNDS = {"ge": (">=", lambda v, b: v >= b), "gt": (">", lambda v, b: v > b),
           "le": ("<=", lambda v, b: v <= b), "lt": ("<", lambda v, b: v < b)}


def _check_bounds(value: Any, meta: Any, key: str) -> None:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return
    for op, (sym, ok) in _BOUNDS.items():
        if op in meta and not ok(value, meta[op]):
            raise ConfigError(f"{key}: {value!r} is out of range (must be {sym} {meta[op]})")


def build(cls: type, data: dict[str, Any], prefix: str = "") -> Any:
    """Instantiate dataclass ``cls`` from a mapping, rejecting unknown keys."""
    hints = _hints(cls)
    names = [f.name for f in fields(cls)]
    kwargs = {}
    for k, v in data.items():
        key = f"{prefix}.{k}" if prefix else str(k)
        if k not in hints:
            raise ConfigError(f"unknown key {key!r}{did_you_mean(str(k), names)} "
                              f"(known in {prefix or 'the config'}: {', '.join(names)})")
        kwargs[k] = _coerce(v, hints[k], key)
    obj = cls(**kwargs)
    for f in fields(cls):
        key = f"{prefix}.{f.name}" if prefix else f.name
        _check_bounds(getattr(obj, f.name), f.metadata, key)
    return obj


def _parse_scalar(raw: str, tp: Any) -> Any:
    """A CLI value: strings stay raw for str fields, everything else goes through YAML."""
    base = [a for a in typing.get_args(tp) if a is not type(None)] or [tp]
    if raw.lower() in ("null", "none", "~") and type(None) in typing.get_args(tp):
        return None
    if base[0] is str:
        return raw
    if typing.get_origin(base[0]) is Literal and raw in typing.get_args(base[0]):
        return raw  # a choice is its own text (``off`` is not YAML's false here)
    try:
        return load_yaml_text(raw)
    except yaml.YAMLError:
        return raw


def apply_override(cfg: Any, item: str) -> None:
    """Apply one ``key.sub=value`` override in place."""
    if "=" not in item or not item.split("=", 1)[0].strip():
        raise ConfigError(f"bad override {item!r}: expected key.sub=value "
                          f"(e.g. algorithm.kl.coef=0.05)")
    path, raw = item.split("=", 1)
    parts = path.strip().split(".")
    if any(not p for p in parts):
        raise ConfigError(f"bad override {item!r}: empty key component in {path!r}")
    obj, done = cfg, []
    value_type: Any = None  # a dict field's value type (dict[str, Section]: a new key is a Section)
    for i, part in enumerate(parts):
        key = ".".join(done + [part])
        last = i == len(parts) - 1
        if is_dataclass(obj):
            hints, names = _hints(type(obj)), [f.name for f in fields(obj)]
            if part not in hints:
                raise ConfigError(f"unknown key {key!r}{did_you_mean(part, names)} "
                                  f"(known in {'.'.join(done) or 'the config'}: {', '.join(names)})")
            if last:
                tp = hints[part]
                value = _coerce(_parse_scalar(raw, tp), tp, key)
                meta = next(f.metadata for f in fields(obj) if f.name == part)
                _check_bounds(value, meta, key)
                setattr(obj, part, value)
                return
            args = typing.get_args(hints[part])
            value_type = args[1] if typing.get_origin(hints[part]) is dict else None
            obj = getattr(obj, part)
        elif isinstance(obj, list):
            if not part.isdigit() or int(part) >= len(obj):
                raise ConfigError(f"{key}: no list item {part!r} (the list has {len(obj)} items)")
            if last:
                raise ConfigError(f"{key}: replace a whole list item with its fields, e.g. {key}.name=...")
            obj = obj[int(part)]
        elif isinstance(obj, dict):
            if is_dataclass(value_type):
                if last:
                    obj[part] = _coerce(_parse_scalar(raw, Any) or {}, value_type, key)
                    return
                obj = obj.setdefault(part, value_type())
                value_type = None
            elif last:
                obj[part] = _parse_scalar(raw, Any)
                return
            else:
                obj = obj.setdefault(part, {})
        else:
            raise ConfigError(f"{key}: {'.'.join(done)} is a value, not a section")
        done.append(part)
