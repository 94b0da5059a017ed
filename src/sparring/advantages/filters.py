"""Keep filters: which rows enter the loss, as ``keep``-kind shapers.

``fn(adv [n, T], batch, **opts) -> Bool[n_rows]``, ANDed with the estimator's keep mask by
`stage.AdvantageStage`; configure them in ``algorithm.shaping`` like any shaper::

    algorithm.shaping: [{name: drop_zero_variance_groups}, {name: top_abs_advantage, options: {k: 4}}]

Statistics are per trajectory (one agent's rows in one episode, so turn layout counts a
trajectory once) within each (group, agent). Filtering runs after the estimator, so
batch-level statistics (``reinforce_pp``'s whitening) still include the dropped rows.
The learner's token and sequence counts come from the final keep mask.
"""

from __future__ import annotations

import torch
from torch import Tensor

from sparring.advantages.shaping import shaper
from sparring.data import TurnBatch
from sparring.segments import compact_ids, segment_first, segment_sum


def _trajectories(batch: TurnBatch) -> tuple[Tensor, int, Tensor, int]:
    """(row -> trajectory ``[n]``, n_traj, trajectory -> (group, agent) segment, n_seg)."""
    tid, n = compact_ids(batch.traj)
    first = segment_first(tid, n)
    seg, n_seg = compact_ids(batch.group[first], batch.agent[first])
    return tid, n, seg, n_seg


@shaper("drop_zero_variance_groups", kind="keep", needs=("group",),
        source="DAPO: An Open-Source LLM Reinforcement Learning System at Scale (2025)")
def drop_zero_variance_groups(adv: Tensor, batch: TurnBatch) -> Tensor:
    """Keep the rows of groups whose returns are not all equal (groups of one are dropped).

    DAPO's dynamic sampling: groups with all-correct or all-wrong answers carry no
    group-relative signal. Shapes: -> ``Bool[n_rows]``."""
    if batch.n_rows == 0:
        return torch.ones(0, dtype=torch.bool, device=batch.device)
    tid, n, seg, n_seg = _trajectories(batch)
    R = batch.returns[segment_first(tid, n)].double()
    lo = torch.full((n_seg,), torch.inf, dtype=R.dtype, device=R.device).scatter_reduce(0, seg, R, "amin")
    hi = torch.full((n_seg,), -torch.inf, dtype=R.dtype, device=R.device).scatter_reduce(0, seg, R, "amax")
    return (hi > lo)[seg][tid]


@shaper("top_abs_advantage", kind="keep", needs=("group",),
        source="CPPO: Accelerating the Training of Group Relative Policy Optimization-Based "
        "Reasoning Models (2025)")
def top_abs_advantage(adv: Tensor, batch: TurnBatch, *, k: int = 4) -> Tensor:
    """Keep the ``k`` trajectories with the largest |A| in each group (ties: lower index).

    A trajectory's |A| is the mean of |A| over its action tokens (all its rows). CPPO's
    completion pruning. Shapes: ``adv [n, T]`` -> ``Bool[n_rows]``."""
    if not isinstance(k, int) or k < 1:
        raise ValueError(f"top_abs_advantage: k must be a positive int, got {k!r}")
    if batch.n_rows == 0:
        return torch.ones(0, dtype=torch.bool, device=batch.device)
    tid, n, seg, n_seg = _trajectories(batch)
    m = batch.action_mask.double()
    score = segment_sum((adv.double().abs() * m).sum(1), tid, n) \
        / segment_sum(m.sum(1), tid, n).clamp(min=1)
    # rank inside the segment: by |A| descending, ties by trajectory index
    order = torch.argsort(-score, stable=True)
    order = order[torch.argsort(seg[order], stable=True)]
    count = torch.bincount(seg, minlength=n_seg)
    start = torch.cumsum(count, 0) - count
    rank = torch.empty_like(order)
    rank[order] = torch.arange(n, device=order.device) - start[seg[order]]
    return (rank < k)[tid]
