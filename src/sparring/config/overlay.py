"""Several policies in one run: the config one policy's model and learner are built from
(`policy_config`), its `PolicySpec` keys over the top-level sections."""

from __future__ import annotations

import copy
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from sparring.config.overrides import ConfigError, build, did_you_mean

if TYPE_CHECKING:
    from sparring.config.schema import Config


def _merged(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """``base`` with the keys of ``over`` on top; mappings in both are merged the same way,
    but for a component of another name (``model.head: {name: ...}``), which replaces."""
    out = dict(base)
    for k, v in over.items():
        merge = isinstance(v, dict) and isinstance(out.get(k), dict) and v.get(
            "name", out[k].get("name")) == out[k].get("name")
        out[k] = _merged(out[k], v) if merge else v
    return out


def policy_config(cfg: Config, name: str) -> Config:
    """``cfg`` as policy ``name`` of ``policies`` sees it: ``model``, ``optim``, ``lora``,
    ``algorithm``, then ``algorithm.kl``, and ``critic`` with the policy's keys over the
    top-level ones (mappings such as ``model.options`` merged key by key). A copy; errors name
    ``policies.NAME.<section>``."""
    if name not in cfg.policies:
        raise ConfigError(f"policies: no policy {name!r}{did_you_mean(name, list(cfg.policies))}"
                          f" (defined: {', '.join(cfg.policies) or 'none'})")
    spec, out = cfg.policies[name], copy.deepcopy(cfg)
    key = f"policies.{name}"
    out.model = build(type(cfg.model), _merged(asdict(cfg.model), spec.model), f"{key}.model")
    out.optim = build(type(cfg.optim), _merged(asdict(cfg.optim), spec.optim), f"{key}.optim")
    out.lora = build(type(cfg.lora), _merged(asdict(cfg.lora), spec.lora), f"{key}.lora")
    out.algorithm = build(type(cfg.algorithm), _merged(asdict(cfg.algorithm), spec.algorithm),
                          f"{key}.algorithm")
    out.algorithm.kl = build(type(out.algorithm.kl), _merged(asdict(out.algorithm.kl), spec.kl), f"{key}.kl")
    out.critic = build(type(cfg.critic), _merged(asdict(cfg.critic), spec.critic),
                       f"{key}.critic")
    return out
