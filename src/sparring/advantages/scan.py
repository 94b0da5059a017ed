"""An agent's own turns as a dense grid, and the return-to-go over them.

* `to_grid` / `from_grid`: per-row values of a turn-layout batch <-> a dense
  ``[n_traj, K]`` grid indexed by (trajectory, turn index), K = most turns of any agent.
* `reverse_discounted_sum(x, gamma)`: ``G_k = x_k + gamma G_{k+1}`` along the grid's turn
  axis (``G_K = 0``): a reverse loop over the K turns, vectorised over trajectories.
* `rtg(batch, r, gamma)`: return-to-go over each agent's own later turns, per row.
"""

from __future__ import annotations

import torch
from torch import Tensor

from sparring.data import TurnBatch


def to_grid(x: Tensor, batch: TurnBatch, fill: float = 0.0) -> Tensor:
    """Per-row values ``[n_rows]`` -> ``[n_traj, K]`` (cells without a row hold ``fill``)."""
    K = int(batch.turn.max()) + 1 if batch.n_rows else 0
    grid = torch.full((batch.n_traj, K), fill, dtype=x.dtype, device=x.device)
    grid[batch.traj, batch.turn] = x
    return grid


def from_grid(grid: Tensor, batch: TurnBatch) -> Tensor:
    """``[n_traj, K]`` -> per-row values ``[n_rows]``."""
    return grid[batch.traj, batch.turn]


def reverse_discounted_sum(x: Tensor, gamma: float) -> Tensor:
    """``G_k = sum_{j >= k} gamma^(j-k) x_j`` along the last axis of ``x [m, K]``."""
    if gamma < 0:
        raise ValueError(f"discount must be >= 0, got {gamma}")
    G = torch.zeros_like(x)
    acc = torch.zeros(x.shape[0], dtype=x.dtype, device=x.device)
    for k in reversed(range(x.shape[1])):
        acc = x[:, k] + gamma * acc
        G[:, k] = acc
    return G


def rtg(batch: TurnBatch, r: Tensor, gamma: float = 1.0) -> Tensor:
    """``G_k = sum_{j >= k} gamma^(j-k) r_j`` over the same agent's turns j, in its own turn
    order. Shapes: ``r [n_rows]`` -> ``[n_rows]``."""
    return from_grid(reverse_discounted_sum(to_grid(r, batch), gamma), batch)
