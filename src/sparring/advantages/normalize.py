"""Group-relative normalisation and running baselines, shared by the estimators.

* `scope_ids(batch, scope)`: segment ids for a normalisation scope:
  ``group`` (per group), ``group_agent`` (per (group, agent)), ``batch`` (one segment),
  ``batch_agent`` (per agent over the batch), ``group_agent_turn`` (per (group, agent,
  turn index)), ``group_turn`` (per (group, turn index)).
* `normalize(x, ids, n, ...)`: ``(x - mean_s) / (std_s + eps)`` (or mean-only) with the
  statistics of segment s taken over the rows where ``include`` is true (e.g. one row per
  trajectory, or rows of episodes that were not truncated).
* `loo_baseline(x, ids, n, ...)`: leave-one-out mean of the other members of the segment.
* `ema_update(...)`: the running per-key baseline of ``role_ema`` (turn.py).

All vectorised with segment ops (`sparring.segments`); no loop over rows or groups.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
from torch import Tensor

from sparring.advantages.common import check_choice
from sparring.data import TurnBatch
from sparring.segments import compact_ids, segment_sum

SCOPES = ("group", "group_agent", "batch", "batch_agent", "group_turn", "group_agent_turn")
_SCOPE_KEYS = {
    "group": ("group",),
    "group_agent": ("group", "agent"),
    "batch": (),
    "batch_agent": ("agent",),
    "group_turn": ("group", "turn"),
    "group_agent_turn": ("group", "agent", "turn"),
}


def scope_ids(batch: TurnBatch, scope: str) -> tuple[Tensor, int]:
    """Segment ids ``Long[n_rows]`` and the number of segments for ``scope``."""
    check_choice("scope", scope, SCOPES)
    keys = _SCOPE_KEYS[scope]
    if not keys:
        return torch.zeros(batch.n_rows, dtype=torch.long, device=batch.device), 1
    return compact_ids(*(getattr(batch, k) for k in keys))


def _stats(x: Tensor, ids: Tensor, n: int, include: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
    w = torch.ones_like(x) if include is None else include.to(x.dtype)
    cnt = segment_sum(w, ids, n)
    mean = segment_sum(x * w, ids, n) / cnt.clamp(min=1)
    var = segment_sum(w * (x - mean[ids]) ** 2, ids, n) / (cnt - 1).clamp(min=1)
    return mean, var.sqrt(), cnt


def normalize(
    x: Tensor,
    ids: Tensor,
    n: int,
    *,
    std: bool = True,
    eps: float = 1e-6,
    include: Tensor | None = None,
) -> Tensor:
    """``(x_i - mean_s) / (std_s + eps)`` with s = ids[i]; mean-only when ``std=False``.

    Shapes: x, ids, include ``[n_rows]``; returns ``[n_rows]``. Statistics come from the
    rows with ``include`` (all rows by default); std is the unbiased sample std (0 for a
    segment of one, so a singleton gets ``0 / eps = 0``).
    """
    mean, sd, _ = _stats(x, ids, n, include)
    out = x - mean[ids]
    return out / (sd[ids] + eps) if std else out


def loo_baseline(x: Tensor, ids: Tensor, n: int, *, include: Tensor | None = None,
                 alone: float = 0.0) -> Tensor:
    """Leave-one-out baseline ``b_i = sum_{j in s(i), j != i} x_j / (|s(i)| - 1)``.

    Only rows with ``include`` count as members; a row whose segment has no other member
    gets ``alone``. Shapes ``[n_rows]``.
    """
    w = torch.ones_like(x) if include is None else include.to(x.dtype)
    tot = segment_sum(x * w, ids, n)[ids] - x * w
    others = segment_sum(w, ids, n)[ids] - w
    return torch.where(others > 0, tot / others.clamp(min=1), torch.full_like(x, alone))


def ema_update(
    baselines: Mapping[str, float], keys: list[str], values: Tensor, counts: Tensor,
    decay: float, init: float | None,
) -> dict[str, float]:
    """One EMA step per key: ``b <- decay * b + (1 - decay) * mean_batch``.

    ``values[k]`` is the batch mean of key ``keys[k]``, ``counts[k]`` its number of samples
    (keys with 0 samples, or a non-finite mean, keep their baseline). A key seen for the
    first time starts at ``init`` (``None``: at its first batch mean). Loops over distinct
    keys only.
    """
    out = dict(baselines)
    for k, v, c in zip(keys, values.tolist(), counts.tolist()):
        if c <= 0 or not math.isfinite(v):
            continue
        b = out.get(k, v if init is None else init)
        out[k] = decay * b + (1.0 - decay) * v
    return out

