"""Property-based fuzzing of configs. Invalid configs are generated from the config
dataclasses themselves (unknown keys at every depth, values of the wrong type, numbers out of
their declared range, unknown registry names and options) and each must fail in `validate`
with a `ConfigError` that names the key, and `sparring train` must say so in one line
before any run folder exists."""

import contextlib
import dataclasses
import io
import os
import tempfile
import types
import typing
from pathlib import Path
from typing import Any, Literal

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sparring.cli import main
from sparring.config import Config, ConfigError, from_dict

BASE = {"envs": [{"name": "tictactoe", "group_size": 2, "opponents": ["self", "random"]}],
        "rollout": {"episodes_per_step": 4}}
UNSET = object()


def _leaves(cls: type = Config, prefix: str = "") -> list[tuple[str, Any, dict]]:
    """(dotted key, type, metadata) of every field; ``envs`` as its first item ``envs.0``."""
    out = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        key, tp = prefix + f.name, hints[f.name]
        if dataclasses.is_dataclass(tp):
            out += _leaves(tp, key + ".")
            continue
        inner = typing.get_args(tp)
        if typing.get_origin(tp) is list and inner and dataclasses.is_dataclass(inner[0]):
            out += _leaves(inner[0], key + ".0.")
            continue
        out.append((key, tp, dict(f.metadata)))
    return out


LEAVES = [leaf for leaf in _leaves() if leaf[0] != "plugins"]  # plugins: a module to import
SECTIONS = sorted({k.rsplit(".", 1)[0] for k, _, _ in LEAVES if "." in k}) + [""]


def _set(data: dict, key: str, value: Any) -> dict:
    """A deep copy of ``data`` with dotted ``key`` set (``envs.0.x`` into the first env)."""
    data = yaml.safe_load(yaml.safe_dump(data))
    node: Any = data
    parts = key.split(".")
    for part in parts[:-1]:
        node = node[int(part)] if isinstance(node, list) else node.setdefault(part, {})
    node[parts[-1]] = value
    return data


def _wrong_values(tp: Any) -> list[Any]:
    """Values that are not of type ``tp`` (nor coercible to it)."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        return [v for v in _wrong_values(next(a for a in args if a is not type(None)))
                if v is not None]
    if origin is Literal:
        return ["bogus_choice", 5, [args[0]]]
    if origin is list:
        return [5, {"a": 1}, [[1, 2]]]
    if origin is dict:
        return [[1, 2], 5, "text"]
    return {int: ["abc", 1.5, [1], {"a": 1}, True],
            float: ["abc", [1.0], True, {"a": 1}, float("nan"), float("inf")],
            bool: ["maybe", 3, [True], {"a": 1}],
            str: [5, [1], {"a": 1}, True, 1.5]}[tp]


def _out_of_range(tp: Any, meta: dict) -> list[Any]:
    base = next((a for a in typing.get_args(tp) if a is not type(None)), tp)
    out = []
    for op, bound in meta.items():
        if op in ("ge", "gt", "le", "lt"):
            step = 1 if base is int else 0.5
            bad = {"ge": bound - step, "gt": bound, "le": bound + step, "lt": bound}[op]
            out.append(int(bad) if base is int else float(bad))
    return out


RANGED = [(k, tp, m) for k, tp, m in LEAVES if _out_of_range(tp, m)]
REGISTRY_KEYS = ["algorithm.estimator", "algorithm.objective", "algorithm.aggregation",
                 "envs.0.name", "algorithm.shaping.0.name", "envs.0.opponents.1",
                 "league.bots.0", "eval.opponents.0"]
OPTION_KEYS = ["model.options", "envs.0.options", "algorithm.estimator_options",
               "algorithm.objective_options", "envs.0.estimator_options"]
names = st.text(alphabet="abcdefghijklmnopqrstuvwxyz_", min_size=3, max_size=12).map(
    lambda s: "zz" + s)  # nothing registered starts with zz


@st.composite
def invalid_configs(draw) -> tuple[dict, str]:
    """(an invalid config mapping, the key its error must name)."""
    kind = draw(st.sampled_from(["unknown_key", "wrong_type", "out_of_range", "registry",
                                 "option"]))
    if kind == "unknown_key":
        section, name = draw(st.sampled_from(SECTIONS)), draw(names)
        key = f"{section}.{name}" if section else name
        return _set(BASE, key, draw(st.integers())), f"unknown key '{key}'"
    if kind == "wrong_type":
        key, tp, _ = draw(st.sampled_from(LEAVES))
        return _set(BASE, key, draw(st.sampled_from(_wrong_values(tp)))), key
    if kind == "out_of_range":
        key, tp, meta = draw(st.sampled_from(RANGED))
        return _set(BASE, key, draw(st.sampled_from(_out_of_range(tp, meta)))), key
    if kind == "registry":
        key, name = draw(st.sampled_from(REGISTRY_KEYS)), draw(names)
        if key == "algorithm.shaping.0.name":
            return _set(BASE, "algorithm.shaping", [{"name": name}]), key
        if key.endswith(".0") or key.endswith(".1"):
            listed, i = key.rsplit(".", 1)
            base_list = {"envs.0.opponents": ["self", "random"]}.get(listed, ["random"])
            base_list = [*base_list[:int(i)], name]
            return _set(BASE, listed, base_list), key
        return _set(BASE, key, name), key
    key, name = draw(st.sampled_from(OPTION_KEYS)), draw(names)
    return _set(BASE, f"{key}.{name}", 1), key


def test_the_base_config_is_valid():
    from_dict(BASE)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(invalid_configs())
def test_every_invalid_config_fails_in_validate_naming_the_key(case):
    data, key = case
    try:
        from_dict(data)
    except ConfigError as e:
        assert key in str(e), f"{key!r} not named in: {e}"
    else:
        raise AssertionError(f"accepted an invalid config (expected an error naming {key!r}): "
                             f"{data}")
    cwd = os.getcwd()
    with tempfile.TemporaryDirectory() as tmp:
        os.chdir(tmp)
        try:
            Path("cfg.yaml").write_text(yaml.safe_dump(data))
            err = io.StringIO()
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                rc = main(["train", "cfg.yaml"])
            assert rc == 2
            lines = [x for x in err.getvalue().splitlines() if x.strip()]
            assert len(lines) == 1 and lines[0].startswith("config error: ") \
                and key in lines[0], err.getvalue()
            assert os.listdir(".") == ["cfg.yaml"]  # no run folder, nothing else written
        finally:
            os.chdir(cwd)


def _rejected_on_the_command_line(tp: Any, text: str) -> bool:
    """Whether ``text`` is invalid for ``tp`` on the command line too: a str field keeps
    any text, and ``a,b`` is a list there."""
    base = next((a for a in typing.get_args(tp) if a is not type(None)), tp) \
        if typing.get_origin(tp) is not Literal else tp
    if base is str or text in ("null", "~"):
        return False
    # 'a,b' / '5' is a list of strings on the command line
    return typing.get_origin(base) is not list or text.lstrip().startswith(("[", "{"))


def _bad_spellings(tp: Any, meta: Any) -> list[str]:
    """Wrong or out-of-range values of a leaf as a command line spells them, keeping those
    that are wrong there too (see `_rejected_on_the_command_line`)."""
    spelled = [yaml.safe_dump(v, default_flow_style=True).strip().removesuffix("\n...")
               for v in _wrong_values(tp) + _out_of_range(tp, meta)]
    return [s for s in spelled if _rejected_on_the_command_line(tp, s)]


# leaves a command line can get wrong (a str field keeps any text): the test draws only these,
# so no example passes without checking anything
SPELLABLE = [(k, tp, m) for k, tp, m in LEAVES if _bad_spellings(tp, m)]


def test_most_leaves_can_be_spelled_wrong_on_the_command_line():
    assert len(SPELLABLE) >= len(LEAVES) // 2


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(SPELLABLE), st.data())
def test_bad_command_line_overrides_name_the_key(leaf, data):
    """The same through ``key=value`` overrides (values a command line can spell)."""
    key, tp, meta = leaf
    value = data.draw(st.sampled_from(_bad_spellings(tp, meta)))
    try:
        from_dict(BASE, [f"{key}={value}"])
    except ConfigError as e:
        assert key in str(e), f"{key!r} not named in: {e}"
    else:
        raise AssertionError(f"accepted {key}={value}")
