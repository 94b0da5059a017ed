"""Policy objectives: the OBJECTIVES registry and the functional API.

An objective is ``fn(logp, old_logp, advantages, mask, *, ref_logp=None, **options)
-> Tensor[n, T]``: the per-token loss to *minimise* (zero outside ``mask``), to be
reduced by `sparring.aggregation.aggregate`. Sequence-level and pairwise objectives
receive what they need as options (``group=Long[n]``, ``rewards=Float[n]``) and
broadcast a per-sequence loss onto the sequence's tokens.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from torch import Tensor

from sparring.registry import Registry

OBJECTIVES = Registry("objective")

_FAMILY_MODULES = ("policy_gradient", "sequence", "contrastive", "kl")


def objective(
    name: str, *, family: str, needs: tuple[str, ...] = (), source: str = ""
) -> Callable[[Callable], Callable]:
    """Register ``fn(logp, old_logp, advantages, mask, *, ref_logp=None, **options)``."""
    return OBJECTIVES.register(name, family=family, needs=needs, source=source)


def _load_families() -> None:
    for mod in _FAMILY_MODULES:
        try:
            importlib.import_module(f"sparring.objectives.{mod}")
        except ModuleNotFoundError as e:
            if e.name != f"sparring.objectives.{mod}":
                raise


def loss(
    name: str,
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    ref_logp: Tensor | None = None,
    **options: Any,
) -> Tensor:
    """Per-token loss ``[n, T]`` of objective ``name`` (zero outside ``mask``)."""
    _load_families()
    entry = OBJECTIVES.get(name)
    if "ref_logp" in entry.needs and ref_logp is None:
        raise ValueError(f"objective {name!r} needs ref_logp (log-probs of the reference model)")
    out = entry.fn(logp, old_logp, advantages, mask, ref_logp=ref_logp, **options)
    return out * mask


def list_objectives() -> list:
    _load_families()
    return list(OBJECTIVES)
