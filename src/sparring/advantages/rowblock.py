"""Row-blocked passes over ``[n, T]`` tensors: masked row sums, counts and means.

A fresh ``[n, T]`` float tensor costs more to page in than most element-wise passes over
it, so the helpers here walk the rows in blocks of about `BLOCK_ELEMS` elements: each
temporary is a few MB, stays in cache and reuses the allocator's memory. The loop is over
memory blocks (``n * T / BLOCK_ELEMS`` of them), not over rows' contents; every block is one
vectorised op. Results equal the plain full-tensor expressions (e.g.
``(x * mask).sum(1)``).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import Tensor

BLOCK_ELEMS = 1 << 20  # ~4 MB of float32 per temporary: few ops, each parallel


def row_blocks(n: int, T: int) -> Iterator[slice]:
    """Slices of rows, each covering about `BLOCK_ELEMS` elements of an ``[n, T]`` tensor."""
    step = max(1, BLOCK_ELEMS // max(T, 1))
    for s in range(0, n, step):
        yield slice(s, min(s + step, n))


def masked_row_sum(x: Tensor, mask: Tensor) -> Tensor:
    """``sum_t x[i, t] * mask[i, t]`` per row ``[n]`` (x's dtype), without a full temporary."""
    if x.shape != mask.shape:
        raise ValueError(f"x has shape {tuple(x.shape)}, mask has {tuple(mask.shape)}")
    n, T = x.shape
    out = torch.zeros(n, dtype=x.dtype, device=x.device)
    zero = torch.zeros((), dtype=x.dtype, device=x.device)
    for b in row_blocks(n, T):
        torch.sum(torch.where(mask[b], x[b], zero), 1, out=out[b])
    return out


def row_count(mask: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
    """Number of True entries per row of ``mask [n, T]`` as ``dtype`` ``[n]``."""
    n, T = mask.shape
    out = torch.zeros(n, dtype=dtype, device=mask.device)
    m8 = mask.contiguous().view(torch.uint8) if mask.dtype == torch.bool else mask
    for b in row_blocks(n, T):
        torch.sum(m8[b], 1, dtype=dtype, out=out[b])
    return out


def masked_row_mean(x: Tensor, mask: Tensor) -> Tensor:
    """Mean of ``x`` over each row's masked entries ``[n]`` (0 for rows with none)."""
    return masked_row_sum(x, mask) / row_count(mask, x.dtype).clamp(min=1)
