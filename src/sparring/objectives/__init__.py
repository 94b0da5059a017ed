"""Policy objectives: the OBJECTIVES registry and the functional API.

An objective is ``fn(logp, old_logp, advantages, mask, *, ref_logp=None, **options)
-> (loss, diagnostics)``:

* ``loss``: ``Tensor[n, T]``, the per-token loss to *minimise* (zero outside ``mask``),
  to be reduced by `sparring.aggregation.aggregate`;
* ``diagnostics``: ``dict[str, Tensor]`` of 0-d tensors computed without grad, each a
  mean over the objective's own units in that call (tokens, turns or sequences, as its
  docstring says): ``clip_frac`` (and ``clip_frac_low`` / ``clip_frac_high``), ``ratio``
  and ``ratio_max`` for the ratio-based objectives; ``{}`` for those without a ratio.
  The learner logs them, weighted by each micro-batch's action-token count.

Ratio-based objectives take exp only of `common.log_ratio` (clamped to
+-`common.LOG_RATIO_CLAMP`). Sequence-level and pairwise objectives receive what they
need as options (``group=Long[n]``, ``rewards=Float[n]``) and broadcast a per-sequence
loss onto the sequence's tokens. KL penalties and the entropy bonus are not objectives:
they are loss terms of the learner (`sparring.kl`, `sparring.train.learner`).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from torch import Tensor

from sparring.registry import Registry

OBJECTIVES = Registry("objective")

_FAMILY_MODULES = ("policy_gradient", "sequence", "contrastive")


def objective(
    name: str, *, family: str, needs: tuple[str, ...] = (), source: str = ""
) -> Callable[[Callable], Callable]:
    """Register ``fn(logp, old_logp, advantages, mask, *, ref_logp=None, **options)
    -> (loss [n, T], diagnostics)`` (module doc)."""
    return OBJECTIVES.register(name, family=family, needs=needs, source=source)


def _load_families() -> None:
    for mod in _FAMILY_MODULES:
        try:
            importlib.import_module(f"sparring.objectives.{mod}")
        except ModuleNotFoundError as e:
            if e.name != f"sparring.objectives.{mod}":
                raise


def compute(
    name: str,
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    ref_logp: Tensor | None = None,
    **options: Any,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Objective ``name``: per-token loss ``[n, T]`` (zero outside ``mask``) and its
    diagnostics (0-d tensors, no grad; see the module doc)."""
    _load_families()
    entry = OBJECTIVES.get(name)
    if "ref_logp" in entry.needs and ref_logp is None:
        raise ValueError(f"objective {name!r} needs ref_logp (log-probs of the reference model)")
    out = entry.fn(logp, old_logp, advantages, mask, ref_logp=ref_logp, **options)
    if not (isinstance(out, tuple) and len(out) == 2 and isinstance(out[1], dict)):
        raise TypeError(f"objective {name!r} must return (loss, diagnostics), "
                        f"got {type(out).__name__}")
    per_token, diagnostics = out
    return per_token * mask, diagnostics


def loss(
    name: str,
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    ref_logp: Tensor | None = None,
    **options: Any,
) -> Tensor:
    """Per-token loss ``[n, T]`` of objective ``name`` (zero outside ``mask``); `compute`
    without the diagnostics."""
    return compute(name, logp, old_logp, advantages, mask, ref_logp, **options)[0]


def list_objectives() -> list:
    _load_families()
    return list(OBJECTIVES)
