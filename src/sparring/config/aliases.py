"""Old config keys, still read: `ALIASES` maps each to its new key, and
`translate` (a config mapping) and `translate_overrides` (``key=value`` items) rename them
where a config enters (`from_dict`), with a warning naming both. An old key and its new
one given together is a `ConfigError` naming both. A key below an old one moves with it
(``algorithm.archer.tau`` -> ``critic.archer.tau``); a policy's own sections
(``policies.NAME.algorithm``, ``policies.NAME.optim``) are renamed the same way."""

from __future__ import annotations

import logging
from typing import Any

from sparring.config.overrides import ConfigError

log = logging.getLogger(__name__)

ALIASES: dict[str, str] = {
    **{f"rollout.pool_{k}": f"league.{k}" for k in (
        "every", "max", "cache", "bots", "explore", "explore_schedule", "explore_final_ratio",
        "explore_turns", "explore_tactical", "temperature", "mode", "pfsp_power",
        "score_rate")},
    "algorithm.value": "critic.enabled",
    "algorithm.critic": "critic.kind",
    "algorithm.value_hidden": "critic.hidden",
    "algorithm.value_coef": "critic.coef",
    "algorithm.value_target": "critic.target",
    "algorithm.archer": "critic.archer",
    "optim.min_lr_ratio": "optim.lr_final_ratio",
}
POLICY_SECTIONS = ("algorithm", "optim")  # the sections of `PolicySpec` with old keys
_warned: set[str] = set()


def _warn(old: str, new: str) -> None:
    """One warning per old key and process (a resumed run reads its config twice)."""
    if old not in _warned:
        _warned.add(old)
        log.warning("%s is the old name of %s (read as the new one; rename it)", old, new)


def _both(old: str, new: str) -> ConfigError:
    return ConfigError(f"{old} and {new} are one setting ({old} is its old name); give "
                       f"only {new}")


def _renamed(key: str) -> str:
    """``key`` with an old key (or the old key it is under) replaced by the new one."""
    parts = key.split(".")
    where, rest = (parts[:2], parts[2:]) if parts[0] == "policies" else ([], parts)
    for old, new in ALIASES.items():
        if where and old.split(".")[0] not in POLICY_SECTIONS:
            continue
        dotted = ".".join(rest)
        if dotted == old or dotted.startswith(old + "."):
            return ".".join([*where, new, *rest[old.count(".") + 1:]])
    return key


def _move(data: dict[str, Any], old: str, new: str, where: str) -> None:
    """Move ``data[section][key]`` of ``old`` to its place under ``new``, in place."""
    (section, key), (section_new, key_new) = old.split("."), new.split(".")
    src = data.get(section)
    if not isinstance(src, dict) or key not in src:
        return
    if data.get(section_new) is None:
        data[section_new] = {}
    dst = data[section_new]
    if not isinstance(dst, dict):
        return  # a malformed section: `build` names it
    if key_new in dst:
        raise _both(where + old, where + new)
    dst[key_new] = src.pop(key)
    _warn(where + old, where + new)


def _copied(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` and the mappings in it copied (the depth `_move` changes)."""
    return {k: dict(v) if isinstance(v, dict) else v for k, v in data.items()}


def translate(data: dict[str, Any]) -> dict[str, Any]:
    """A config mapping with its old keys renamed (a copy; ``data`` is left as it was)."""
    out = _copied(data)
    for old, new in ALIASES.items():
        _move(out, old, new, "")
    policies = out.get("policies")
    for name, spec in policies.items() if isinstance(policies, dict) else ():
        if isinstance(spec, dict):
            policies[name] = spec = _copied(spec)
            for old, new in ALIASES.items():
                if old.split(".")[0] in POLICY_SECTIONS:
                    _move(spec, old, new, f"policies.{name}.")
    return out


def translate_overrides(items: list[str] | tuple[str, ...]) -> list[str]:
    """``key=value`` overrides with old keys renamed; an old key and its new one (or a key
    below or above it) among them is a `ConfigError` naming both."""
    out, moved, given = [], {}, set()
    for item in items:
        key, eq, value = item.partition("=")
        key = key.strip()
        new = _renamed(key) if eq else key
        if new != key:
            moved[new] = key
            item = f"{new}={value}"
        out.append(item)
        given.add(key)
    for new, old in moved.items():
        for key in given:
            if key == new or key.startswith(new + ".") or new.startswith(key + "."):
                raise _both(old, key)
        _warn(old, new)
    return out
