"""Per-trajectory views of a `TurnBatch` for trajectory-level (group) estimators.

A trajectory is one agent's rows in one episode (``batch.traj``). In turn layout it has
several rows that share the trajectory's ``returns``; group statistics must count it
once, so estimators work on ``[n_traj]`` vectors and broadcast back with `to_tokens`.
No Python loop over rows, trajectories or groups.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from sparring.advantages.rowblock import keep_where
from sparring.data import TurnBatch
from sparring.segments import segment_count, segment_first, segment_sum


def compact(x: Tensor) -> tuple[Tensor, int]:
    """Ids of ``x`` [n] compacted to ``0..k-1`` (1-D, faster than a row-wise unique)."""
    if x.numel() == 0:
        return x.long(), 0
    uniq, inv = torch.unique(x, return_inverse=True)
    return inv, int(uniq.numel())


def pair_key(a: Tensor, b: Tensor) -> Tensor:
    """One long key per (a, b) pair of non-negative ids (for `compact`)."""
    b = b.long()
    return a.long() * (int(b.max()) + 1 if b.numel() else 1) + b


@dataclass
class TrajView:
    """Trajectory-level vectors; ``seg`` is the (group) or (group, agent) segment id."""

    tid: Tensor  # long [n_rows]: row -> trajectory (compacted)
    n: int  # number of trajectories
    first: Tensor  # long [n]: first row of each trajectory
    R: Tensor  # float64 [n]: the trajectory's return
    group: Tensor  # long [n]
    agent: Tensor  # long [n]
    seg: Tensor  # long [n]
    n_seg: int
    by_agent: bool

    def length(self, batch: TurnBatch) -> Tensor:
        """Action tokens of each trajectory (summed over its rows) [n], float64."""
        return segment_sum(batch.length.double(), self.tid, self.n)

    def count(self) -> Tensor:
        """Trajectories per segment [n_seg], float64."""
        return segment_count(self.seg, self.n_seg, torch.float64)

    def batch_seg(self) -> tuple[Tensor, int]:
        """Segments for batch-wide statistics: one, or one per agent when ``by_agent``."""
        if self.by_agent:
            return compact(self.agent)
        return torch.zeros(self.n, dtype=torch.long, device=self.R.device), 1


def traj_view(batch: TurnBatch, by_agent: bool = False) -> TrajView:
    """Collapse rows to trajectories and assign each a (group[, agent]) segment."""
    if not isinstance(by_agent, bool):
        raise ValueError(f"by_agent must be a bool, got {by_agent!r}")
    tid, n = compact(batch.traj)
    first = segment_first(tid, n)
    group, agent = batch.group[first], batch.agent[first]
    key = pair_key(group, agent) if by_agent else group
    seg, n_seg = compact(key)
    R = batch.returns[first].double()
    if not torch.isfinite(R).all():
        raise ValueError("batch.returns has non-finite values")
    return TrajView(tid, n, first, R, group, agent, seg, n_seg, by_agent)


def to_tokens(batch: TurnBatch, view: TrajView, a: Tensor, out: Tensor | None = None) -> Tensor:
    """Broadcast per-trajectory advantages ``a`` [n_traj] to ``[n_rows, T]`` (0 off-mask),
    into ``out`` when given (see `advantages.compute`)."""
    a_rows = a.to(batch.returns.dtype)[view.tid]
    if out is not None:
        a_rows = a_rows.to(out.dtype)
    return keep_where(batch.action_mask, a_rows[:, None], out=out)  # one pass over [n, T]


def segment_order(x: Tensor, seg: Tensor, n_seg: int, descending: bool = False):
    """Sort by (seg, x); ties keep index order.

    Returns ``order`` [n] (sorted positions -> indices), ``rank`` [n] (each element's
    0-based rank inside its segment), ``start`` [n_seg] and ``count`` [n_seg] (long).
    """
    key = -x if descending else x
    order = torch.argsort(key, stable=True)
    order = order[torch.argsort(seg[order], stable=True)]
    cnt = segment_count(seg, n_seg, torch.long)
    start = torch.cumsum(cnt, 0) - cnt
    pos = torch.empty_like(order)
    pos[order] = torch.arange(len(order), device=order.device)
    rank = pos - start[seg]
    return order, rank, start, cnt
