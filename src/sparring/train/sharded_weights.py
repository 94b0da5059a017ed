"""Weights, gradients and optimizer state sharded over the learner ranks
(``distributed.sharding: full``; FSDP2's `fully_shard`, ZeRO stage 3).

Each transformer block of the trained model, then the model as a whole, is a
`fully_shard` unit: between forwards a rank holds 1/W of every weight (a `DTensor` sharded
on dim 0), a unit's forward gathers its whole weights and frees them after it, and its
backward reduce-scatters the gradients, so that a rank's gradients and AdamW moments are
1/W of the model's too. The update is then that of `sparring.train.data_parallel`: each
rank's loss of its rows is normalised by the whole mini-batch's counts, so the gradient
one process takes is the *sum* over the ranks. FSDP2 averages (divides by W), and gloo
has no ``PREMUL_SUM`` to make that a sum, so each rank's loss is multiplied by W first
(exact for a power of two). Every rank must run the same sharded units the same number of
times (each forward and backward is a collective): every rank runs as many micro-batches
as the rank with the most rows, a rank short of rows running one of its rows with weight 0
(`filler_rows`), and a non-finite loss ends no rank's micro-batches early.

What a unit's hooks cannot see, it cannot gather: the learner's forwards that call a
block's submodules directly (the shared-prefix forward, the top layer at the action tokens
alone, the feature and layer caches) are off on the sharded model, which runs its own
forward with its LM head at the action tokens alone (`sparring.policy.forward.kept_logits`).

Rank 0 samples, evaluates and checkpoints between updates with the whole weights: it
keeps the run's model as it is (whole), and the learner trains a sharded copy of it
(`shard_copy`); after each update every rank gathers the trained weights
(`gather_trained`) and rank 0 copies them into its whole model. So rank 0 holds the
weights whole once, as a sampling engine does, beside a 1/W share of the weights,
gradients and optimizer state; the other ranks need the whole model only to start from,
and free it (`release`).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterable

import torch
from torch import Tensor, nn


def is_sharded(t: Tensor) -> bool:
    """Whether ``t`` is a `DTensor` (a sharded weight, its gradient or an AdamW moment)."""
    from torch.distributed.tensor import DTensor

    return isinstance(t, DTensor)


def local(t: Tensor) -> Tensor:
    """This rank's shard of ``t`` (``t`` itself when it is not sharded)."""
    return t.to_local() if is_sharded(t) else t


def whole(t: Tensor) -> Tensor:
    """``t`` whole on every rank (an all-gather when it is sharded: a collective)."""
    return t.full_tensor() if is_sharded(t) else t


def blocks(model: nn.Module) -> nn.ModuleList:
    """The model's transformer blocks: its largest `nn.ModuleList` (``model.layers`` of a
    Llama or Qwen, under PEFT's wrappers too)."""
    lists = [m for m in model.modules() if isinstance(m, nn.ModuleList)]
    if not lists:
        raise ValueError(f"{type(model).__name__} has no list of blocks to shard "
                         "(distributed.sharding: full shards a transformer's blocks)")
    return max(lists, key=len)


def shard_copy(model: nn.Module) -> nn.Module:
    """A copy of ``model`` with each block and the whole a `fully_shard` unit over the
    default process group (the copy's weights become `DTensor` shards)."""
    from torch.distributed.fsdp import fully_shard

    sharded = copy.deepcopy(model)
    for block in blocks(sharded):
        fully_shard(block)
    fully_shard(sharded)
    return sharded


def reshard(model: nn.Module) -> None:
    """Free the gathered weights of every unit of ``model`` (the root keeps its own after a
    forward, expecting a backward; a no-grad pass has none)."""
    from torch.distributed.fsdp import FSDPModule

    for m in model.modules():
        if isinstance(m, FSDPModule):
            m.reshard()


def release(model: nn.Module) -> None:
    """Free the weights of ``model`` (a rank's whole copy it no longer reads): each
    parameter keeps its name, dtype and device, with no elements."""
    with torch.no_grad():
        for p in model.parameters():
            p.data = torch.empty(0, dtype=p.dtype, device=p.device)


def gather_trained(model: nn.Module, trained: Iterable[str]) -> dict[str, Tensor]:
    """The weights of ``model`` named in ``trained``, whole (a collective: every rank calls
    it, with the same names)."""
    names = set(trained)
    return {n: whole(p.detach()) for n, p in model.named_parameters() if n in names}


def distribute_like(t: Tensor, p: Tensor) -> Tensor:
    """The whole tensor ``t`` (the same on every rank) as a `DTensor` placed as ``p``; each
    rank keeps its own slice, nothing is sent. ``t`` itself when ``p`` is not sharded."""
    if not is_sharded(p) or t.dim() == 0:
        return t
    from torch.distributed.tensor import distribute_tensor

    return distribute_tensor(t.to(p.device), p.device_mesh, p.placements, src_data_rank=None)


def total_grad_norm(params: list[Tensor]) -> float:
    """The 2-norm of the gradients of ``params``, sharded and whole alike (the squares of
    each rank's shards summed over the ranks: a collective), as
    `torch.nn.utils.clip_grad_norm_` forms it in one process up to summation order."""
    import torch.distributed as dist

    grads = [p.grad for p in params if p.grad is not None]
    def squares(gs: list[Tensor]) -> Tensor:
        return sum((torch.linalg.vector_norm(g, 2.0).double().square() for g in gs),
                   torch.zeros((), dtype=torch.float64))
    sharded = squares([local(g) for g in grads if is_sharded(g)])
    dist.all_reduce(sharded)
    return math.sqrt(float(sharded + squares([g for g in grads if not is_sharded(g)])))


@torch.no_grad()
def clip_grads(params: list[Tensor], max_norm: float, total: float) -> None:
    """Scale the gradients of ``params`` by ``min(max_norm / (total + 1e-6), 1)``, as
    `torch.nn.utils.clip_grads_with_norm_` does."""
    coef = max_norm / (total + 1e-6)
    if coef >= 1.0:
        return
    for p in params:
        if p.grad is not None:
            local(p.grad).mul_(coef)


def filler_rows(rows: Tensor, count: int, size: int, spare: Tensor) -> list[tuple[Tensor, bool]]:
    """This rank's ``rows`` in ``count`` micro-batches of at most ``size``: ``(rows, real)``
    pairs, a micro-batch past this rank's own rows being ``spare`` (one row, its loss to be
    weighted 0), so that every rank runs ``count`` forwards and backwards."""
    out = [(rows[i:i + size], True) for i in range(0, len(rows), size)]
    return out + [(spare, False)] * (count - len(out))
