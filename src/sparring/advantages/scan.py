"""Vectorised scans over an agent's own turns.

* `reverse_scan(a, b)`: ``c_k = a_k + b_k * c_{k+1}`` along the last axis (``c_K = 0``):
  discounted return-to-go (``b = gamma``) and any first-order backward recurrence (GAE
  bootstrapping across turns). For ``K <= 512`` it is one batched matmul with the exact
  transfer matrix ``M[k, j] = prod_{i=k}^{j-1} b_i = exp(S_j - S_k)`` (S the exclusive
  cumulative sum of ``log b``, float64; entries never exceed 1, so it cannot overflow);
  beyond that it is a loop over the time axis, vectorised across sequences.
* `turn_grid` / `to_grid` / `from_grid`: rows of a turn-layout batch <-> a dense
  ``[n_traj, K]`` grid indexed by (trajectory, turn index), K = most turns of any agent.
* `rtg(batch, r, gamma)`: return-to-go over each agent's own later turns, per row.
"""

from __future__ import annotations

import torch
from torch import Tensor

from sparring.advantages.rowblock import keep_where
from sparring.data import TurnBatch

_MATRIX_MAX_K = 512
_CHUNK_ELEMS = 1 << 24


def reverse_scan(a: Tensor, b: Tensor | float) -> Tensor:
    """``c_k = a_k + b_k c_{k+1}`` over the last axis of ``a [m, K]``; ``b`` scalar or ``[m, K]``.

    ``b >= 0`` (discounts). Returns ``[m, K]`` in ``a``'s dtype.
    """
    if a.dim() != 2:
        raise ValueError(f"reverse_scan expects a [m, K] tensor, got shape {tuple(a.shape)}")
    m, K = a.shape
    if not isinstance(b, Tensor):
        if b < 0:
            raise ValueError(f"discount must be >= 0, got {b}")
        if b == 1.0:
            return a.flip(-1).cumsum(-1).flip(-1)
        b = torch.full_like(a, float(b))
    elif b.shape != a.shape:
        raise ValueError(f"b has shape {tuple(b.shape)}, a has {tuple(a.shape)}")
    elif m and K and bool((b < 0).any()):
        raise ValueError("reverse_scan needs b >= 0")
    if m == 0 or K == 0:
        return a.clone()
    if K > _MATRIX_MAX_K:  # time-axis loop, vectorised over the m sequences
        out = torch.empty_like(a)
        carry = torch.zeros_like(a[:, 0])
        for k in range(K - 1, -1, -1):
            carry = a[:, k] + b[:, k] * carry
            out[:, k] = carry
        return out
    logb = b.double().clamp(min=1e-300).log()
    S = torch.cumsum(logb, -1) - logb  # exclusive prefix sums
    tri = torch.ones(K, K, dtype=torch.bool, device=a.device).triu()
    out = torch.empty_like(a)
    step = max(1, _CHUNK_ELEMS // (K * K))
    for s in range(0, m, step):  # memory chunks, not a loop over rows' contents
        Sc = S[s:s + step]
        diff = Sc[:, None, :] - Sc[:, :, None]  # [c, k, j] = S_j - S_k
        M = torch.where(tri, diff, torch.full_like(diff, -torch.inf)).exp()
        out[s:s + step] = torch.einsum("ckj,cj->ck", M, a[s:s + step].double()).to(a.dtype)
    return out


def turn_grid(batch: TurnBatch) -> tuple[Tensor, Tensor, int, int]:
    """(traj ``[n]``, turn ``[n]``, n_traj, K): each row's cell in the dense grid."""
    n_traj = batch.n_traj
    K = int(batch.turn.max()) + 1 if batch.n_rows else 0
    return batch.traj, batch.turn, n_traj, K


def to_grid(x: Tensor, batch: TurnBatch, fill: float = 0.0) -> Tensor:
    """Per-row values ``[n]`` -> ``[n_traj, K]`` (cells without a row hold ``fill``)."""
    traj, turn, n_traj, K = turn_grid(batch)
    g = torch.full((n_traj, K), fill, dtype=x.dtype, device=x.device)
    g[traj, turn] = x
    return g


def from_grid(g: Tensor, batch: TurnBatch) -> Tensor:
    """``[n_traj, K]`` -> per-row values ``[n]``."""
    return g[batch.traj, batch.turn]


def rtg(batch: TurnBatch, r: Tensor, gamma: float = 1.0) -> Tensor:
    """``G_k = sum_{j >= k} gamma^(j-k) r_j`` over the same agent's turns j (own turn order)."""
    if batch.n_rows == 0:
        return r.clone()
    return from_grid(reverse_scan(to_grid(r, batch), gamma), batch)


def to_tokens(x: Tensor, batch: TurnBatch) -> Tensor:
    """Broadcast a per-row value ``[n]`` to the row's action tokens ``[n, T]``."""
    return keep_where(batch.action_mask, x[:, None].to(torch.float32))
