"""Old config keys, still read until the next release: `FOLDED` says which new setting
each replaces and how its value is written there, `REMOVED` the keys that are gone.

`translate` (a config mapping) and `translate_overrides` (``key=value`` items) read them
where a config enters (`from_dict`), each with a warning (logged, and a
`DeprecationWarning`) that names the new spelling. An old key and the new spelling of the
same setting given together in one place (a file, or the overrides) is a `ConfigError`
naming both; an old key given as an override replaces what the file says in either
spelling. Old keys are read in the config itself (scope ``""``), in each item of ``envs``
(scope ``"envs"``) and in each policy's own sections (``policies.NAME.algorithm``, ...;
scope ``"policies"``). A removed key is dropped with a warning where it holds the value it
had by default (a saved run's config lists every key), and is an error otherwise.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml

from sparring.config.overrides import ConfigError

log = logging.getLogger(__name__)

_MISSING = object()


@dataclass(frozen=True)
class Folded:
    """Old keys of one scope that one new setting replaces.

    ``old``: each old key (dotted, relative to the scope) and the value it had by default;
    ``new``: the new setting's key (relative to the scope); ``fold(values, target,
    forced)`` writes the old ``values`` given into ``target`` (the mapping at ``new``, or
    None where there is none yet) and returns it (None: nothing to write); ``forced`` holds
    the old keys given as overrides, whose values replace what ``target`` says."""

    scope: str
    old: dict[str, Any]
    new: str
    fold: Callable[[dict[str, Any], Any, set[str]], Any]
    spelling: dict[str, str] = field(default_factory=dict)  # old key -> its new spelling

    def spelled(self, old: str, where: str) -> str:
        """The new spelling of ``old`` in the warning (``where``: the scope's prefix)."""
        return where + self.spelling.get(old, self.new)


class _Clash(Exception):
    """An old key and the new spelling of its setting, both given (``old``, ``new``:
    relative to the scope)."""

    def __init__(self, old: str, new: str):
        super().__init__(old, new)
        self.old, self.new = old, new


def _both(old: str, new: str) -> ConfigError:
    return ConfigError(f"{old} and {new} are one setting ({old} is its old spelling); give "
                       f"only {new}")


def _on(value: Any) -> bool:
    """An old switch's value turns its feature on (0, false, '' and null are off)."""
    return value is not None and value is not False and value != 0 and value != ""


def _components(list_key: str, specs: dict[str, tuple[str, dict[str, str]]],
                defaults: dict[str, Any]) -> Callable[..., Any]:
    """A fold into a list of components at ``list_key``: ``specs`` maps each component's
    name to its switch (the old key whose value turns it off or on) and the option each
    old key sets. A component the old keys turn on is added (with the options whose old
    keys are not at their old ``defaults``) or, given as overrides, updated; one they turn
    off is left out."""

    def fold(values: dict[str, Any], target: Any, forced: set[str]) -> Any:
        out = [dict(c) if isinstance(c, dict) else c for c in (target or [])]
        for name, (switch, options) in specs.items():
            given = {k: v for k, v in values.items() if k == switch or k in options}
            if not given:
                continue
            at = next((i for i, c in enumerate(out)
                       if isinstance(c, dict) and c.get("name") == name), None)
            if at is not None and not set(given) <= forced:
                raise _Clash(next(iter(given)), f"{list_key} (its {name} entry)")
            on = _on(given[switch]) if switch in given else at is not None
            if not on:
                if at is not None:
                    del out[at]
                continue
            if at is None:
                out.append({"name": name, **{
                    options[k]: v for k, v in given.items()
                    if k in options and (k == switch or v != defaults[k])}})
            else:
                out[at].update({options[k]: v for k, v in given.items() if k in options})
        return out if out or target is not None else None

    return fold


def _section(new: str, options: dict[str, str], defaults: dict[str, Any]
             ) -> Callable[..., Any]:
    """A fold into the mapping at ``new``: ``options`` maps each old key to its option there.
    The old keys at their old ``defaults`` are left out of a new mapping; one that the
    mapping has already is a clash, unless given as an override (which replaces it)."""

    def fold(values: dict[str, Any], target: Any, forced: set[str]) -> Any:
        out = dict(target) if isinstance(target, dict) else {}
        for k, v in values.items():
            name = options[k]
            if name in out and k not in forced:
                raise _Clash(k, f"{new}.{name}")
            if k in forced or v != defaults[k]:
                out[name] = v
        return out if out or target is not None else None

    return fold


def _explore(prefix: str, who: str, keys: tuple[str, ...]) -> Folded:
    """The old exploration keys of ``prefix`` (``rollout``, ``league``) as ``exploration.who``."""
    options = {"explore": "rate", "explore_schedule": "schedule",
               "explore_final_ratio": "final_ratio", "explore_turns": "turns",
               "explore_tactical": "tactical"}
    defaults = {"explore": 0.0, "explore_schedule": "constant", "explore_final_ratio": 0.0,
                "explore_turns": 0, "explore_tactical": False}
    new = f"exploration.{who}"
    return Folded("", {f"{prefix}.{k}": defaults[k] for k in keys}, new,
                  _section(new, {f"{prefix}.{k}": options[k] for k in keys},
                           {f"{prefix}.{k}": defaults[k] for k in keys}),
                  {f"{prefix}.{k}": f"{new}.{options[k]}" for k in keys})


def _merged(new: str, keys: dict[str, str], defaults: dict[str, Any]) -> Callable[..., Any]:
    """A fold of several old keys into one option each of the mapping at ``new`` (``keys``:
    old key -> option). Old keys at their old ``defaults`` say nothing; two that give one
    option different values are an error (one given as an override wins)."""

    def fold(values: dict[str, Any], target: Any, forced: set[str]) -> Any:
        out = dict(target) if isinstance(target, dict) else {}
        for name in dict.fromkeys(keys.values()):
            given = {k: v for k, v in values.items() if keys[k] == name
                     and (k in forced or v != defaults[k])}
            if not given:
                continue
            if name in out and not set(given) <= forced:
                raise _Clash(next(iter(given)), f"{new}.{name}")
            chosen = {k: v for k, v in given.items() if k in forced} or given
            if len({repr(v) for v in chosen.values()}) > 1:
                shown = " and ".join(f"{k} ({v!r})" for k, v in chosen.items())
                raise ConfigError(f"{shown} are one setting now, {new}.{name}; give it one "
                                  "value there")
            out[name] = next(iter(chosen.values()))
        return out if out or target is not None else None

    return fold


def _importance(keys: dict[str, str]) -> Folded:
    """The old importance-correction keys (old key -> option of
    ``algorithm.importance_correction``)."""
    defaults = {"algorithm.sampler_correction": "auto", "algorithm.sampler_correction_clip": 2.0,
                "distributed.correction": "token", "distributed.correction_clip": 2.0}
    new = "algorithm.importance_correction"
    scope = "" if "distributed.correction" in keys else "policies"
    return Folded(scope, {k: defaults[k] for k in keys}, new,
                  _merged(new, keys, defaults), {k: f"{new}.{v}" for k, v in keys.items()})


_OLD_HEAD = {"optim.body_lr_scale": 1.0, "train.feature_cache": 65536,
             "train.feature_center": False, "train.feature_whiten": 0.0}
_HEAD_OPTIONS = {"train.feature_cache": "cache", "train.feature_center": "center",
                 "train.feature_whiten": "whiten"}


def _head(values: dict[str, Any], target: Any, forced: set[str]) -> Any:
    """The old keys of the model's head as ``model.head``: ``optim.body_lr_scale`` 0 is
    ``frozen_features``, between 0 and 1 ``lm_head`` with its ``body_lr_scale``; the
    ``train.feature_*`` keys are options of ``frozen_features`` (elsewhere the cache's size
    did nothing and a transform was refused)."""
    given = {k: v for k, v in values.items() if k in forced or v != _OLD_HEAD[k]}
    if target is not None and not set(given) <= forced:
        raise _Clash(next(k for k in given if k not in forced), "model.head")
    out = dict(target) if isinstance(target, dict) else None
    if "optim.body_lr_scale" in given:
        scale = given["optim.body_lr_scale"]
        if scale != 0:
            out = {"name": "lm_head", **({} if scale == 1 else {"body_lr_scale": scale})}
        elif out is None or out.get("name") != "frozen_features":
            out = {"name": "frozen_features"}
    frozen = out is not None and out.get("name") == "frozen_features"
    for k, option in _HEAD_OPTIONS.items():
        if k not in given:
            continue
        if frozen:
            out[option] = given[k]
        elif k != "train.feature_cache":
            raise ConfigError(f"{k} transforms the features of a frozen network's cache; it "
                              "needs model.head: {name: frozen_features} (the old "
                              "optim.body_lr_scale: 0), where it is an option")
    return out


# the old keys of an env's start and the value each had by default
_OLD_STARTS = {"opening_moves": 0, "openings": "", "openings_share": 1.0, "loss_replay": 0.0,
               "loss_replay_size": 256, "loss_replay_depth": 2, "symmetric_views": False}
# the start components of an env (envs[].starts) its old keys turn on, in this order
_STARTS = _components("starts", {
    "random_opening": ("opening_moves", {"opening_moves": "moves"}),
    "openings": ("openings", {"openings": "file", "openings_share": "share"}),
    "loss_replay": ("loss_replay", {"loss_replay": "share", "loss_replay_size": "size",
                                    "loss_replay_depth": "depth"}),
    "symmetric_views": ("symmetric_views", {}),
}, _OLD_STARTS)

FOLDED: list[Folded] = [
    Folded("envs", _OLD_STARTS, "starts", _STARTS,
           {"opening_moves": "starts: [{name: random_opening, moves: N}]",
            "openings": "starts: [{name: openings, file: F}]",
            "openings_share": "starts: [{name: openings, share: S}]",
            "loss_replay": "starts: [{name: loss_replay, share: S}]",
            "loss_replay_size": "starts: [{name: loss_replay, size: N}]",
            "loss_replay_depth": "starts: [{name: loss_replay, depth: N}]",
            "symmetric_views": "starts: [{name: symmetric_views}]"}),
    _explore("rollout", "learner", ("explore", "explore_schedule", "explore_final_ratio")),
    _explore("league", "league", ("explore", "explore_schedule", "explore_final_ratio",
                                  "explore_turns", "explore_tactical")),
    _importance({"algorithm.sampler_correction": "level",
                 "algorithm.sampler_correction_clip": "clip", "distributed.correction": "level",
                 "distributed.correction_clip": "clip"}),
    _importance({"algorithm.sampler_correction": "level",
                 "algorithm.sampler_correction_clip": "clip"}),
    Folded("", _OLD_HEAD, "model.head", _head,
           {"optim.body_lr_scale": "model.head: {name: frozen_features} (0) or "
                                   "{name: lm_head, body_lr_scale: S}",
            "train.feature_cache": "model.head: {name: frozen_features, cache: N}",
            "train.feature_center": "model.head: {name: frozen_features, center: true}",
            "train.feature_whiten": "model.head: {name: frozen_features, whiten: X}"}),
    Folded("policies", {"optim.body_lr_scale": 1.0}, "model.head", _head,
           {"optim.body_lr_scale": "model.head: {name: frozen_features} (0) or "
                                   "{name: lm_head, body_lr_scale: S}"}),
]

# removed keys and the value each had by default, by scope
REMOVED: dict[str, dict[str, Any]] = {
    "": {"algorithm.kl.magnet_every": 1, "eval.exact_vs_minimax": True,
         "league.temperature": 0.0},
    "envs": {},
    "policies": {"algorithm.kl.magnet_every": 1, "kl.magnet_every": 1},
}

# the next release, as the warnings and the changelog say it
UNTIL = "the next release"

_warned: set[str] = set()


def _warn(old: str, new: str) -> None:
    """One warning per old key and process (a resumed run reads its config twice)."""
    if old in _warned:
        return
    _warned.add(old)
    text = (f"{old} is the old spelling of {new} (read as it until {UNTIL}, which removes "
            f"{old}; rename it)")
    log.warning("%s", text)
    warnings.warn(text, DeprecationWarning, stacklevel=2)


def _get(data: Mapping[str, Any], dotted: str) -> Any:
    node: Any = data
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return _MISSING
        node = node[part]
    return node


def _pop(data: dict[str, Any], dotted: str) -> Any:
    """Remove ``dotted`` from ``data``, copying the mappings on the way (the caller's are
    left as they were); its value, or `_MISSING`."""
    *path, last = dotted.split(".")
    node = data
    for part in path:
        child = node.get(part)
        if not isinstance(child, dict):
            return _MISSING
        node[part] = child = dict(child)
        node = child
    return node.pop(last, _MISSING)


def _put(data: dict[str, Any], dotted: str, value: Any) -> None:
    """Set ``dotted`` in ``data``, making (or copying) the mappings on the way."""
    *path, last = dotted.split(".")
    node = data
    for part in path:
        child = node.get(part)
        node[part] = child = dict(child) if isinstance(child, dict) else {}
        node = child
    node[last] = value


def _translate_scope(data: dict[str, Any], scope: str, where: str,
                     forced: set[str]) -> dict[str, Any]:
    """``data`` (a mapping of ``scope`` at ``where``, e.g. ``envs.0.``) with its old keys
    folded into their new settings and its removed keys dropped; a copy."""
    out = dict(data)
    for key, default in REMOVED[scope].items():
        value = _pop(out, key)
        if value is _MISSING:
            continue
        if value != default:
            raise ConfigError(f"{where}{key} is no longer a setting (removed; it was "
                              f"{default!r} by default, this config sets {value!r}); drop it")
        _warned_removed(where + key)
    for f in FOLDED:
        if f.scope != scope:
            continue
        values = {k: v for k in f.old if (v := _pop(out, k)) is not _MISSING}
        if not values:
            continue
        target = _get(out, f.new)
        mine = set(values) & forced
        if mine or any(values[k] != f.old[k] for k in values):  # else: they say nothing
            try:
                written = f.fold(values, None if target is _MISSING else target, mine)
            except _Clash as e:
                raise _both(where + e.old, where + e.new) from None
            if written is not None:
                _put(out, f.new, written)
        for k in values:
            _warn(where + k, f.spelled(k, where))
    return out


def _warned_removed(key: str) -> None:
    if key in _warned:
        return
    _warned.add(key)
    text = f"{key} is no longer a setting (removed; it held its default, so it is ignored)"
    log.warning("%s", text)
    warnings.warn(text, DeprecationWarning, stacklevel=2)


def translate(data: dict[str, Any], overrides: Sequence[tuple[str, Any]] = ()
              ) -> dict[str, Any]:
    """A config mapping with its old keys read as the new ones (a copy; ``data`` is left as
    it was). ``overrides``: old keys given as overrides, ``(dotted key, value)`` (from
    `translate_overrides`), set over ``data`` first; their values replace what ``data``
    says in either spelling."""
    out = dict(data)
    forced: dict[str, set[str]] = {}  # scope's prefix -> its old keys given as overrides
    for key, value in overrides:
        scope, where, rest = _scope_of(key)
        if scope == "envs":
            envs = out.get("envs")
            i = int(where.split(".")[1])
            if not isinstance(envs, list) or i >= len(envs):
                raise ConfigError(f"{key}: no list item {i} (envs has "
                                  f"{len(envs) if isinstance(envs, list) else 0} items)")
            out["envs"] = envs = list(envs)
            envs[i] = dict(envs[i] or {})
            _put(envs[i], rest, value)
        else:
            _put(out, key, value)
        forced.setdefault(where, set()).add(rest)
    out = _translate_scope(out, "", "", forced.get("", set()))
    envs = out.get("envs")
    if isinstance(envs, list):
        out["envs"] = [_translate_scope(e, "envs", f"envs.{i}.", forced.get(f"envs.{i}.", set()))
                       if isinstance(e, dict) else e for i, e in enumerate(envs)]
    policies = out.get("policies")
    if isinstance(policies, dict):
        out["policies"] = {
            name: _translate_scope(spec, "policies", f"policies.{name}.",
                                   forced.get(f"policies.{name}.", set()))
            if isinstance(spec, dict) else spec for name, spec in policies.items()}
    return out


def _scope_of(key: str) -> tuple[str, str, str]:
    """``(scope, prefix, rest)`` of a dotted key: ``envs.0.opening_moves`` ->
    ``("envs", "envs.0.", "opening_moves")``."""
    parts = key.split(".")
    if parts[0] == "envs" and len(parts) > 2 and parts[1].isdigit():
        return "envs", f"envs.{parts[1]}.", ".".join(parts[2:])
    if parts[0] == "policies" and len(parts) > 2:
        return "policies", f"policies.{parts[1]}.", ".".join(parts[2:])
    return "", "", key


def _old_keys(scope: str) -> dict[str, Folded | None]:
    """The old keys of ``scope``: each with the `Folded` that reads it (None: removed)."""
    out: dict[str, Folded | None] = dict.fromkeys(REMOVED[scope])
    for f in FOLDED:
        if f.scope == scope:
            out.update(dict.fromkeys(f.old, f))
    return out


def translate_overrides(items: Sequence[str]) -> tuple[list[str], list[tuple[str, Any]]]:
    """``key=value`` overrides split into those of current keys (``envs=[...]`` items
    with old keys read as the new ones) and those of old keys, ``(key, value)``, for
    `translate`. An old key and the new spelling of its setting (or a key below or above
    it) both among ``items`` is a `ConfigError` naming both."""
    out, old, given = [], [], []
    for item in items:
        key, eq, raw = item.partition("=")
        key = key.strip()
        scope, where, rest = _scope_of(key)
        folded = _old_keys(scope).get(rest, _MISSING) if eq else _MISSING
        if folded is not _MISSING:
            old.append((key, _value(raw), folded, where))
            continue
        if eq and key == "envs" and "{" in raw:
            item = f"envs={_translated_envs(raw)}"
        out.append(item)
        given.append(key)
    for key, _, folded, where in old:
        if folded is None:
            continue
        spelled = folded.spelled(key[len(where):], where)
        new = spelled if " " not in spelled else where + folded.new  # its key, where it has one
        for g in given:
            if g == new or g.startswith(new + "."):
                raise _both(key, g)
            if new.startswith(g + "."):
                raise ConfigError(f"{key} is the old spelling of {new}, which {g} also "
                                  f"sets; give it there")
    return out, [(key, value) for key, value, _, _ in old]


def _value(raw: str) -> Any:
    """An override's text as YAML reads it (the text itself where it does not parse)."""
    try:
        return yaml.safe_load(raw) if raw.strip() else raw
    except yaml.YAMLError:
        return raw


def _translated_envs(raw: str) -> str:
    """An ``envs=[...]`` override's value with its items' old keys read as the new ones."""
    try:
        value = yaml.safe_load(raw)
    except yaml.YAMLError:
        return raw  # `apply_override` names the error
    if not isinstance(value, list):
        return raw
    done = [_translate_scope(e, "envs", f"envs.{i}.", set()) if isinstance(e, dict) else e
            for i, e in enumerate(value)]
    return yaml.safe_dump(done, default_flow_style=True, width=10**6).strip()
