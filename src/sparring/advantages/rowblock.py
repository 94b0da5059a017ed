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

# ~1 MB of float32 (2 MB of int64) per temporary: small enough to stay in cache and to be
# recycled by the heap, and below the 2 MiB from which torch backs a CPU allocation with
# huge pages when THP_MEM_ALLOC_ENABLE=1 (bench/advantages.py --thp).
BLOCK_ELEMS = (1 << 18) - (1 << 10)


def row_blocks(n: int, T: int) -> Iterator[slice]:
    """Slices of rows, each covering about `BLOCK_ELEMS` elements of an ``[n, T]`` tensor."""
    step = max(1, BLOCK_ELEMS // max(T, 1))
    for s in range(0, n, step):
        yield slice(s, min(s + step, n))


_SAME_SIZE_INT = {torch.float64: torch.int64, torch.float32: torch.int32,
                  torch.float16: torch.int16, torch.bfloat16: torch.int16}


def mask_bits(mask: Tensor, dtype: torch.dtype) -> Tensor | None:
    """The bit mask `keep_where` ANDs with (0 or all-ones, as int8), or None where the
    bitwise path does not apply (``dtype`` not floating, not on CPU, mask not bool)."""
    if not _bitwise(mask, dtype):
        return None
    # int8 0 / -1 (all bits set); the AND promotes it to x's integer width by sign extension,
    # so no wide temporary is materialised
    return mask.view(torch.int8).neg()


def _bitwise(mask: Tensor, dtype: torch.dtype) -> bool:
    return dtype in _SAME_SIZE_INT and mask.device.type == "cpu" and mask.dtype == torch.bool


def keep_where(mask: Tensor, x: Tensor, out: Tensor | None = None, *,
               bits: Tensor | None = None) -> Tensor:
    """``torch.where(mask, x, 0)`` (broadcasting; exact, also for inf or NaN off the mask).

    On CPU, for floating ``x`` it is a bitwise AND of x's bits with 0 or all-ones from the
    boolean mask, about 9x faster there than ``torch.where`` on a 1 MB block
    (bench/masked_select.py). ``bits``: `mask_bits(mask, x.dtype)` when the caller reuses
    it. No autograd through the bitwise path: for advantage code only.
    """
    if x.requires_grad or x.device.type != "cpu" or (bits is None and not _bitwise(mask, x.dtype)):
        return torch.where(mask, x, torch.zeros((), dtype=x.dtype, device=x.device), out=out)
    if bits is None and mask.dim() == 2 and mask.numel() > BLOCK_ELEMS:
        # large: row blocks, so the bit mask is a block-sized temporary
        shape = torch.broadcast_shapes(mask.shape, x.shape)
        if out is None:
            out = torch.empty(shape, dtype=x.dtype, device=x.device)
        xb, mb = x.expand(shape), mask.expand(shape)
        for b in row_blocks(*shape):
            keep_where(mb[b], xb[b], out=out[b])
        return out
    if bits is None:
        bits = mask_bits(mask, x.dtype)
    ints = _SAME_SIZE_INT[x.dtype]
    if out is None:
        return torch.bitwise_and(x.view(ints), bits).view(x.dtype)
    torch.bitwise_and(x.view(ints), bits, out=out.view(ints))
    return out


def float_mask(mask: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
    """``mask`` (bool) as 0/1 ``dtype``; through uint8, which is the fast conversion on CPU."""
    return (mask.view(torch.uint8) if mask.dtype == torch.bool else mask).to(dtype)


def masked_row_sum(x: Tensor, mask: Tensor) -> Tensor:
    """``sum_t x[i, t] * mask[i, t]`` per row ``[n]`` (x's dtype), without a full temporary."""
    if x.shape != mask.shape:
        raise ValueError(f"x has shape {tuple(x.shape)}, mask has {tuple(mask.shape)}")
    n, T = x.shape
    out = torch.zeros(n, dtype=x.dtype, device=x.device)
    for b in row_blocks(n, T):
        torch.sum(keep_where(mask[b], x[b]), 1, out=out[b])
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
