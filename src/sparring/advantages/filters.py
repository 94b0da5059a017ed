"""Group filters: which rows enter the loss. Each returns a keep mask ``Bool[n_rows]``.

Use them in one of two ways:

* before estimating (DAPO dynamic sampling, and whenever batch-level statistics such as
  ``reinforce_pp`` should ignore the dropped groups)::

      keep = drop_zero_variance_groups(batch)
      batch = batch.select(keep.nonzero().squeeze(1))
      adv, keep_rows = compute("grpo", batch)

* after estimating (CPPO completion pruning needs the advantages)::

      adv, keep_rows = compute("grpo", batch)
      keep_rows &= top_abs_advantage(batch, adv, k=4)
      loss_mask = batch.action_mask & keep_rows[:, None]

Filtering changes the global token / sequence counts: compute them from ``loss_mask``
(or the selected batch) before aggregation. Statistics are per trajectory (turn
layout safe) and per (group, agent) with ``by_agent=True``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from sparring.advantages.group import has_spread
from sparring.advantages.traj import segment_order, traj_view
from sparring.data import TurnBatch
from sparring.segments import segment_sum


def drop_zero_variance_groups(batch: TurnBatch, *, by_agent: bool = False) -> Tensor:
    """Keep the rows of groups whose returns are not all equal (groups of one are dropped).

    Source: DAPO: An Open-Source LLM Reinforcement Learning System at Scale (dynamic
    sampling: groups with all-correct or all-wrong answers carry no GRPO signal)."""
    v = traj_view(batch, by_agent)
    return has_spread(v.R, v.seg, v.n_seg)[v.seg][v.tid]


def top_abs_advantage(batch: TurnBatch, advantages: Tensor, k: int, *,
                      by_agent: bool = False) -> Tensor:
    """Keep the ``k`` trajectories with the largest |A| in each group (ties: lower index).

    ``advantages``: ``[n_rows]`` or ``[n_rows, T]`` (a trajectory's |A| is the mean of
    |A| over its action tokens). Source: CPPO: Accelerating the Training of Group
    Relative Policy Optimization-Based Reasoning Models (completion pruning)."""
    if not isinstance(k, int) or k < 1:
        raise ValueError(f"top_abs_advantage: k must be a positive int, got {k!r}")
    v = traj_view(batch, by_agent)
    a = advantages.detach().double().abs()
    if a.shape == (batch.n_rows, batch.action_mask.shape[1]):
        m = batch.action_mask.double()
        row_sum, row_cnt = (a * m).sum(1), m.sum(1)
    elif a.shape == (batch.n_rows,):
        row_sum, row_cnt = a, torch.ones_like(a)
    else:
        raise ValueError(f"top_abs_advantage: advantages must be [n_rows] or [n_rows, T], "
                         f"got {tuple(advantages.shape)}")
    score = segment_sum(row_sum, v.tid, v.n) / segment_sum(row_cnt, v.tid, v.n).clamp(min=1)
    _, rank, _, _ = segment_order(score, v.seg, v.n_seg, descending=True)
    return (rank < k)[v.tid]


FILTERS = {"drop_zero_variance_groups": drop_zero_variance_groups,
           "top_abs_advantage": top_abs_advantage}
