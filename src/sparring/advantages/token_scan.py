"""Token-level GAE inside rows without a loop over tokens: a blocked discounted suffix scan.

Inside a row, GAE over the action tokens is the linear recurrence ``A_t = X_t + g A_{t+1}``
(g = gamma lam, ``X_t = r_t + gamma V_{t+1} - V_t``) when the row's action tokens are one
contiguous run, as in turn layout (prompt, then action, then padding). With X zero after
the run, ``A_t = sum_{j >= t} g^(j-t) X_j``: a discounted suffix sum, computed by
`suffix_scan`:

1. rows are taken in memory blocks (`rowblock.row_blocks`), so temporaries stay in cache;
2. the token axis is cut into chunks of C tokens; inside each chunk the suffix sums are one
   matmul with the fixed ``C x C`` matrix ``M[j, t] = g^(j-t)`` (j >= t);
3. the value entering each chunk from the right is ``E_k = sum_{k' > k} g^(C (k'-k-1))
   L_{k', 0}`` (L_{k', 0}: chunk k''s local sum at its first token): one small matmul over
   chunk starts;
4. ``A = L + g^(C - t mod C) E``.

Rows whose action tokens are not contiguous (trajectory layout: observation tokens between
turns) are first compacted (action tokens moved to the front, in order, by a scatter),
scanned, and gathered back, so observation tokens are skipped exactly.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from sparring.advantages.rowblock import float_mask, keep_where, mask_bits, row_blocks

_MAX_CHUNKS = 128  # chunks per row before the chunk length doubles
_TINY = 1e-30  # weights below this are flushed to 0 (no denormals in the matmuls)


def _chunk_len(T: int) -> int:
    C = min(16, max(T, 1))
    while -(-T // C) > _MAX_CHUNKS:
        C *= 2
    return C


def _scan_mats(g: float, C: int, nc: int, like: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(M ``[C, C]``, W ``[nc, nc]``, tail ``[C]``) of `suffix_scan`, built in float64."""
    gg = torch.tensor(float(g), dtype=torch.float64)

    def powers(e: Tensor) -> Tensor:
        p = torch.where(e >= 0, torch.pow(gg, e.clamp(min=0)), 0.0)
        return torch.where(p.abs() < _TINY, 0.0, p).to(dtype=like.dtype, device=like.device)

    j = torch.arange(C, dtype=torch.float64)
    k = torch.arange(nc, dtype=torch.float64)
    return (powers(j[:, None] - j[None, :]), powers(C * (k[:, None] - k[None, :] - 1)),
            powers(C - j))


def suffix_scan(X: Tensor, g: float) -> Tensor:
    """``S_t = sum_{j >= t} g^(j-t) X_j`` along the last axis of ``X [n, T]`` (see the module
    doc; T is zero-padded to a multiple of the chunk length internally)."""
    n, T = X.shape
    C = _chunk_len(T)
    nc = -(-T // C)
    mats = _scan_mats(g, C, nc, X)
    out = torch.empty_like(X)
    for b in row_blocks(n, nc * C):
        Xb = X[b]
        if nc * C != T:
            Xb = torch.nn.functional.pad(Xb, (0, nc * C - T))
        out[b] = _scan_block(Xb.contiguous(), *mats)[:, :T]
    return out


def _scan_block(X: Tensor, M: Tensor, W: Tensor, tail: Tensor) -> Tensor:
    """`suffix_scan` of one block ``X [B, nc * C]`` (C = len(tail))."""
    B, Tp = X.shape
    C = tail.shape[0]
    nc = Tp // C
    L = torch.matmul(X.view(B * nc, C), M).view(B, nc, C)
    E = torch.matmul(L[:, :, 0], W)  # value entering each chunk from the right
    return L.addcmul_(E[:, :, None], tail).view(B, Tp)


def spans(mask: Tensor) -> tuple[Tensor, Tensor, Tensor, bool]:
    """(first, last action index, action count ``[n]`` (long; first = last = 0 for rows
    without actions), whether every row's action tokens form one contiguous run).

    Per row block, with m the mask as floats: count = sum m, P = sum t m_t and run starts =
    sum_t max(m_t - m_{t-1}, 0); a row is contiguous iff it has at most one start, and then
    ``first = (P - L (L-1) / 2) / L`` (exact: all sums are integers below 2^24 in float32,
    or float64 for T > 4096). Non-contiguous rows get first = last = 0.
    """
    n, T = mask.shape
    dt = torch.float32 if T <= 4096 else torch.float64
    count = torch.zeros(n, dtype=dt, device=mask.device)
    pos = torch.zeros(n, dtype=dt, device=mask.device)
    starts = torch.zeros(n, dtype=dt, device=mask.device)
    ar = torch.arange(T, dtype=dt, device=mask.device)
    for b in row_blocks(n, T):
        if T == 0:
            break
        mf = float_mask(mask[b], dt)
        torch.sum(mf, 1, out=count[b])
        torch.mv(mf, ar, out=pos[b])
        torch.sum(torch.sub(mf[:, 1:], mf[:, :-1]).clamp_(min=0), 1, out=starts[b])
        starts[b] += mf[:, 0]
    contiguous = bool((starts <= 1).all())
    ok = (starts <= 1) & (count > 0)
    first = torch.where(ok, (pos - count * (count - 1) / 2) / count.clamp(min=1), 0).long()
    last = torch.where(ok, first + count.long() - 1, 0)
    return first, last, count.long(), contiguous


def last_index(mask: Tensor) -> Tensor:
    """Index of each row's last action token ``[n]`` (0 for rows without one)."""
    n, T = mask.shape
    out = torch.zeros(n, dtype=torch.long, device=mask.device)
    if T == 0:
        return out
    for b in row_blocks(n, T):
        rev = mask[b].flip(1).view(torch.uint8)
        out[b] = torch.where(mask[b].any(1), T - 1 - rev.argmax(1), 0)
    return out


def token_gae(V: Tensor, mask: Tensor, r_last: Tensor, gamma: float, lam: float, *,
              token_rewards: Tensor | None = None, keep: Tensor | None = None,
              bootstrap: Callable[[Tensor, Tensor], Tensor | None] | None = None,
              spans_: tuple[Tensor, Tensor, Tensor, bool] | None = None
              ) -> tuple[Tensor, Tensor, Tensor]:
    """GAE over each row's action tokens, zero value after the row's last action token.

    ``delta_t = r_t + gamma V_next(t) - V_t``, ``A_t = delta_t + gamma lam A_next(t)``, next(t)
    the row's next action token; r_t: ``r_last [n]`` on the row's last action token plus
    ``token_rewards [n, T]`` (read on action tokens only). ``bootstrap(A_first, V_first)``
    may return a per-row value ``c [n]`` entering after the row's last action token
    (``A_t += (gamma lam)^(action tokens after t) c``). Returns (A ``[n, T]``, zero outside
    ``mask & keep[:, None]``; A and V at each row's first action token ``[n]``, 0 if none).
    ``spans_``: `spans(mask)` when the caller has it already.
    """
    n, T = mask.shape
    first, last, count, contiguous = spans(mask) if spans_ is None else spans_
    if contiguous:
        return _span_gae(V, mask, first, last, count, r_last, gamma, lam, token_rewards, keep,
                         bootstrap)
    # compact: row i's k-th action token moves to column k (k < count_i)
    pos = mask.cumsum(1) - mask.long()  # action tokens before t
    idx = torch.zeros(n, T + 1, dtype=torch.long, device=mask.device)
    idx.scatter_(1, torch.where(mask, pos, T), torch.arange(T, device=mask.device).expand(n, T))
    idx = idx[:, :T]
    packed = torch.arange(T, device=mask.device) < count[:, None]
    tr = None if token_rewards is None else token_rewards.gather(1, idx)
    A, fa, fv = _span_gae(V.gather(1, idx), packed, torch.zeros_like(first),
                          (count - 1).clamp(min=0), count, r_last, gamma, lam, tr, keep,
                          bootstrap)
    return keep_where(mask, A.gather(1, pos.clamp(max=max(T - 1, 0)))), fa, fv


def _span_gae(V: Tensor, mask: Tensor, first: Tensor, last: Tensor, count: Tensor,
              r_last: Tensor,
              gamma: float, lam: float, token_rewards: Tensor | None, keep: Tensor | None,
              bootstrap: Callable[[Tensor, Tensor], Tensor | None] | None
              ) -> tuple[Tensor, Tensor, Tensor]:
    """`token_gae` for rows whose action tokens are ``[first, last]`` (count of them)."""
    n, T = mask.shape
    g = gamma * lam
    C = _chunk_len(T)
    Tp = -(-T // C) * C
    mats = _scan_mats(g, C, Tp // C, V)
    zero = torch.zeros((), dtype=V.dtype, device=V.device)
    has = count > 0
    r_last = torch.where(has, r_last.to(V.dtype), zero)
    partial = keep is not None and not bool(keep.all())  # some rows dropped
    A = torch.empty(n, T, dtype=V.dtype, device=V.device)
    fa = torch.zeros(n, dtype=V.dtype, device=V.device)
    for b in row_blocks(n, Tp):
        mb = mask[b]
        B = mb.shape[0]
        bits = mask_bits(mb, V.dtype)
        Vm = keep_where(mb, V[b], bits=bits)
        X = torch.empty(B, Tp, dtype=V.dtype, device=V.device)  # delta, 0 past the last token
        if T > 1:
            torch.mul(Vm[:, 1:], gamma, out=X[:, :T - 1])
        X[:, max(T - 1, 0):].zero_()
        X[:, :T].sub_(Vm)
        if token_rewards is not None:
            X[:, :T].add_(keep_where(mb, token_rewards[b].to(V.dtype), bits=bits))
        rows = torch.arange(B, device=V.device)
        X[rows, last[b]] += r_last[b]
        S = _scan_block(X, *mats)
        fa[b] = S[rows, first[b]]
        if partial:
            keep_where(mb & keep[b, None], S[:, :T], out=A[b])
        else:
            keep_where(mb, S[:, :T], out=A[b], bits=bits)
    fv = torch.where(has, V.gather(1, first[:, None]).squeeze(1), zero) if T else fa.clone()
    c = bootstrap(fa, fv) if bootstrap is not None else None
    if c is not None:  # A_t += g^(last - t) c on the kept action tokens
        ar = torch.arange(T, device=V.device)
        gt = torch.tensor(g, dtype=V.dtype, device=V.device)
        for b in row_blocks(n, T):
            d = (last[b, None] - ar).clamp(min=0).to(V.dtype)
            add = torch.pow(gt, d).mul_(c[b, None].to(V.dtype))
            mk = mask[b] & keep[b, None] if partial else mask[b]
            A[b].add_(keep_where(mk, add))
    return A, fa, fv
