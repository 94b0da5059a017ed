"""Which config keys a resumed run may change (`check_resume_overrides`)."""

from __future__ import annotations

import re
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from sparring.config.overrides import ConfigError

if TYPE_CHECKING:
    from sparring.config.schema import Config


_RESUME_FIXED = ("model", "lora", "critic.enabled", "critic.kind", "critic.hidden",
                 "algorithm.kl.reference", "league.bots")
_RESUME_FREE = ("model.device",)


def _flat(d: Any, prefix: str = "") -> dict[str, Any]:
    """{dotted key: value} of the mappings in ``d`` (an empty mapping has no keys)."""
    if isinstance(d, dict):
        out: dict[str, Any] = {}
        for k, v in d.items():
            out.update(_flat(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: d}


def check_resume_overrides(saved: Config, resumed: Config) -> None:
    """Raise `ConfigError` naming the first key whose change a checkpoint cannot follow:
    the model's shape (``model.*`` but ``model.device``, ``lora.*``), the critic and the
    KL reference (their weights are in the checkpoint), the pool's bots (its saved state
    names them), the set of ``policies`` and their own ``model``, ``lora``, ``critic`` and
    ``kl.reference``. ``trust_remote_code`` goes on the command line
    (``--trust-remote-code``). Old key names (`aliases`) are renamed before a `Config` is
    built, so a run saved with them compares as with the new ones."""
    if list(saved.policies) != list(resumed.policies):
        raise ConfigError(f"policies: cannot change on --resume (the checkpoint holds "
                          f"{list(saved.policies) or 'one policy'}); start a new run for that")
    old, new = _flat(asdict(saved)), _flat(asdict(resumed))
    for key in sorted(set(old) | set(new)):
        # a policy's own sections follow the rules of the top-level ones
        section = re.sub(r"^policies\.[^.]+\.(kl\.|algorithm\.)?",
                         lambda m: {"kl.": "algorithm.kl.", "algorithm.": "algorithm."}.get(
                             m.group(1) or "", ""), key)
        if old.get(key, None) == new.get(key, None) or section.startswith(_RESUME_FREE):
            continue
        if any(section == f or section.startswith(f + ".") for f in _RESUME_FIXED):
            hint = (" (pass --trust-remote-code instead)" if key == "model.trust_remote_code"
                    else "; start a new run for that")
            raise ConfigError(f"{key}: cannot change on --resume (the checkpoint was made "
                              f"with {old.get(key)!r}){hint}")
