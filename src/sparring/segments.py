"""Vectorised per-segment statistics (sum, mean, std, median) via scatter ops.

``ids`` is a long tensor ``[n]`` of segment ids in ``0..n_seg-1``; results are ``[n_seg]``
(use ``stat[ids]`` to broadcast back). No Python loop over segments.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def compact_ids(*keys: Tensor) -> tuple[Tensor, int]:
    """Map rows with equal key tuples to the same id in ``0..n_seg-1``. Returns (ids, n_seg).

    Ids follow the lexicographic order of the key tuples. The keys are folded into one
    mixed-radix integer (exact while the product of their ranges fits in 62 bits), so this
    is one 1-D `torch.unique`; otherwise a row-wise unique over the stacked keys.
    """
    cols = [k.long().reshape(-1) for k in keys]
    if cols and cols[0].numel():
        lo = [int(c.min()) for c in cols]
        span = [int(c.max()) - m + 1 for c, m in zip(cols, lo)]
        if math.prod(span) < 2 ** 62:
            key = torch.zeros_like(cols[0])
            for c, m, s in zip(cols, lo, span):
                key = key * s + (c - m)
            uniq, inv = torch.unique(key, return_inverse=True)
            return inv, uniq.shape[0]
    stacked = torch.stack(cols, dim=1)
    uniq, inv = torch.unique(stacked, dim=0, return_inverse=True)
    return inv, uniq.shape[0]


def segment_sum(x: Tensor, ids: Tensor, n: int) -> Tensor:
    return torch.zeros(n, dtype=x.dtype, device=x.device).index_add_(0, ids, x)


def segment_count(ids: Tensor, n: int, dtype: torch.dtype = torch.float32) -> Tensor:
    return torch.zeros(n, dtype=dtype, device=ids.device).index_add_(
        0, ids, torch.ones_like(ids, dtype=dtype))


def segment_mean(x: Tensor, ids: Tensor, n: int) -> Tensor:
    return segment_sum(x, ids, n) / segment_count(ids, n, x.dtype).clamp(min=1)


def segment_std(x: Tensor, ids: Tensor, n: int, unbiased: bool = True) -> Tensor:
    """Standard deviation per segment; 0 for segments of one element (never NaN)."""
    cnt = segment_count(ids, n, x.dtype)
    mean = segment_sum(x, ids, n) / cnt.clamp(min=1)
    sq = segment_sum((x - mean[ids]) ** 2, ids, n)
    denom = (cnt - 1 if unbiased else cnt).clamp(min=1)
    return (sq / denom).sqrt()


def segment_median(x: Tensor, ids: Tensor, n: int) -> Tensor:
    """Median per segment (mean of the two middle values for even counts)."""
    order = torch.argsort(x, stable=True)
    order = order[torch.argsort(ids[order], stable=True)]  # sorted by (id, value)
    cnt = segment_count(ids, n, torch.long)
    start = torch.cumsum(cnt, 0) - cnt
    lo = start + (cnt - 1).clamp(min=0) // 2
    hi = start + cnt.clamp(min=1) // 2
    xs = x[order]
    lo, hi = lo.clamp(max=max(len(x) - 1, 0)), hi.clamp(max=max(len(x) - 1, 0))
    med = (xs[lo] + xs[hi]) / 2 if len(x) else torch.zeros(n, dtype=x.dtype)
    return torch.where(cnt > 0, med, torch.zeros_like(med))


def segment_first(ids: Tensor, n: int) -> Tensor:
    """Index of the first row of each segment ``[n]`` (``len(ids)`` for empty segments)."""
    rows = torch.arange(len(ids), device=ids.device)
    init = torch.full((n,), len(ids), dtype=torch.long, device=ids.device)
    return init.scatter_reduce(0, ids, rows, reduce="amin")
