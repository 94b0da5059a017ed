"""Data-parallel learner ranks on `torch.distributed` (DDP semantics: gloo on CPUs, NCCL
on GPUs).

Every rank's `Learner.update` is given the same batch; all W ranks then walk the same
mini-batches (the learner's permutation is seeded alike) and each takes a contiguous share
of a mini-batch's rows (`rank_rows`). A rank aggregates the
loss of its share with the counts of the whole mini-batch, summed over the ranks
(`global_counts`): with N the global token (or sequence) count,

    L_r = sum_{i in rows_r} l_i / N,    sum_r grad L_r = grad (sum_i l_i / N),

the single-process gradient. `all_reduce_grads` forms that sum (no division by W, each
L_r being already normalised by N), so every rank takes the same optimizer step from the
same gradient and keeps the same weights. `ranks` is None without an initialised process
group of more than one rank: the learner then runs as one process, unchanged.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from sparring.aggregation import count_seqs, count_tokens
from sparring.data import TurnBatch

LEADER = 0  # the rank that samples, evaluates and owns the run folder


@dataclass(frozen=True)
class Ranks:
    """This process's ``rank`` in a group of ``size`` > 1 learner ranks."""

    rank: int
    size: int


def ranks() -> Ranks | None:
    """The default process group's rank and size, or None (no group, or one rank)."""
    if not (dist.is_available() and dist.is_initialized()):
        return None
    size = dist.get_world_size()
    return Ranks(dist.get_rank(), size) if size > 1 else None


def rank_rows(rows: Tensor, rank: int, size: int) -> Tensor:
    """Rank ``rank``'s contiguous share of ``rows [n]``: ``rows[s_r : s_{r+1}]`` with
    ``s_r = r q + min(r, e)``, ``q, e = divmod(n, size)`` (the first e ranks take one row
    more; a rank may get none)."""
    q, e = divmod(len(rows), size)
    start = rank * q + min(rank, e)
    return rows[start:start + q + int(rank < e)]


def global_counts(mask: Tensor) -> tuple[int, int]:
    """``(N_tok, N_seq)`` of the whole mini-batch: the sums over the ranks of
    `count_tokens` and `count_seqs` of each rank's loss mask ``[r, T]``."""
    t = torch.tensor([count_tokens(mask), count_seqs(mask)], dtype=torch.int64,
                     device=mask.device)
    dist.all_reduce(t)
    return int(t[0]), int(t[1])


def all_ranks(flag: bool, device: torch.device) -> bool:
    """True when ``flag`` holds on every rank (so that all ranks skip a step together)."""
    t = torch.tensor([int(flag)], device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return bool(t.item())


def agreed_grads(params: Iterable[Tensor]) -> list[Tensor]:
    """The parameters of ``params`` (in their order) that some rank has a gradient for; a
    rank without one for such a parameter (e.g. with no rows) gets zeros, so that every
    rank then holds a gradient for the same parameters. A parameter no rank has a gradient
    for keeps ``grad = None``, as in one process."""
    params = list(params)
    if not params:
        return []
    has = torch.tensor([p.grad is not None for p in params], dtype=torch.int32,
                       device=params[0].device)
    dist.all_reduce(has, op=dist.ReduceOp.MAX)
    out = [p for p, h in zip(params, has.tolist()) if h]
    for p in out:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    return out


def all_reduce_grads(params: Iterable[Tensor]) -> None:
    """``p.grad <- sum_r p.grad_r`` on every rank, for the parameters of `agreed_grads`."""
    for p in agreed_grads(params):
        dist.all_reduce(p.grad)


def reduce_stats(stats: dict[str, float]) -> defaultdict[str, float]:
    """The learner's step statistics (`sparring.train.loss`) over all ranks: ``_max/``
    entries are maxima, every other entry (partial losses, token sums, ``_ntok``) a sum."""
    gathered: list[dict[str, float] | None] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, dict(stats))
    out: defaultdict[str, float] = defaultdict(float)
    for part in gathered:
        for k, v in (part or {}).items():
            out[k] = max(out[k], v) if k.startswith("_max/") and k in out else out[k] + v
    return out


def to_cpu(x: Any) -> Any:
    """``x`` with its tensors on the CPU, through dicts, lists, tuples and `TurnBatch`es
    (what one rank sends is unpickled on another's device)."""
    if isinstance(x, Tensor):
        return x.cpu()
    if isinstance(x, TurnBatch):
        return x.to("cpu")
    if isinstance(x, dict):
        return {k: to_cpu(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return type(x)(to_cpu(v) for v in x)
    return x
